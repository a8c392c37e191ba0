// The CUDA backend's per-element passes as warp code: the trainer's scan (key histograms and
// digests), class counts per block (from the live weights, or from the scan's histograms),
// the events of the trainer's delta in class-rank order, and the placement of decoded
// changes on the sampler.
//
// In the rank kernels a warp owns one block of BLOCK elements of a chunk (a program of the
// chunk table, codec/cuda/blocks.py) and walks it 32 elements at a time, element s * 32 +
// lane in lane `lane`; the scan gives a block to a CTA and reads 8-byte words. `__match_any_sync` gives every lane the mask of the lanes of its class, so its
// rank among them is one popcount; each group's lowest lane claims the group's count from
// the class's running counter in shared memory (an atomic add that returns the counter
// before) and shuffles it to the group. (Voting the key bit by bit with ballots instead
// measured 2.1-2.3x slower in the scan on the H200: BENCHMARKS.md.)
//
// Compiled per element type by codec/cuda/warp.py with these defines: BITS (element
// width), IS_FLOAT, MANT (mantissa bits), KMASK (exponent-field mask), BLOCK (elements of a
// program), WARPS (warps of a CTA), UNROLL (slices loaded before any is used); for the rank
// kernels NCP (class slots of a chunk); for the scan NB (histogram bins, >= 2 * (KMASK + 1)).

#ifndef NCP
#define NCP 16
#endif
#ifndef NB
#define NB 512
#endif

typedef long long i64;
typedef unsigned long long u64;

#if BITS == 8
typedef unsigned char U;
#elif BITS == 16
typedef unsigned short U;
#elif BITS == 32
typedef unsigned int U;
#else
typedef unsigned long long U;
#endif

#if BITS == 64
typedef u64 W;
#define WMASK (~0ull)
#else
typedef unsigned int W;
#define WMASK ((W)((1ull << BITS) - 1))
#endif

#define FULL 0xffffffffu
#define SIGN ((W)1 << (BITS - 1))
#define NK (KMASK + 1)

// Order-preserving key of a bit pattern, its inverse, and arithmetic mod 2^BITS (the CPU's
// kernels and codec/cuda/bitops.py define the same).
__device__ __forceinline__ W key(W b) {
#if IS_FLOAT
    return (b & SIGN) ? (b ^ WMASK) : (b ^ SIGN);
#else
    return b;
#endif
}

__device__ __forceinline__ W unkey(W k) {
#if IS_FLOAT
    return (k & SIGN) ? (k ^ SIGN) : (k ^ WMASK);
#else
    return k;
#endif
}

__device__ __forceinline__ W wrap(W v) { return v & WMASK; }

// The digest term of 64-bit word `w` at word index `j` (codec/digest.py).
__device__ __forceinline__ u64 term(u64 w, u64 j) {
    u64 z = w ^ (j * 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

// One program's block: its chunk, tensor, chunk offset from the base tensor, chunk start in
// its tensor, first element in the chunk, and number of elements (<= BLOCK).
struct Block {
    i64 chunk, tensor, off, start, first;
    int n;
};

__device__ __forceinline__ Block table_block(i64 pid, const i64* rows, const int* prog) {
    Block b;
    b.chunk = prog[pid];
    const i64* row = rows + b.chunk * 5;
    b.off = row[0];
    b.start = row[2];
    b.tensor = row[3];
    b.first = (pid - row[4]) * BLOCK;
    const i64 left = row[1] - b.first;
    b.n = (int)(left < BLOCK ? left : BLOCK);
    return b;
}

// Elements s0 + u * 32 + lane (u < UNROLL) of a block, 0 past its end; read once, so
// streamed past the caches.
__device__ __forceinline__ void load_slices(W* out, const U* p, int s0, int lane, int n) {
#pragma unroll
    for (int u = 0; u < UNROLL; u++) {
        const int i = s0 + u * 32 + lane;
        out[u] = i < n ? (W)__ldcs(p + i) : (W)0;
    }
}

__device__ __forceinline__ int class_of(W b, const unsigned char* lut) {
    return __ldg(lut + (int)((b >> MANT) & KMASK));
}

// Mask of the lanes whose key is the same as this lane's; lanes without an element form a
// group of their own.
__device__ __forceinline__ unsigned peers_of(int key, bool valid) {
    return __match_any_sync(FULL, valid ? key : -1);
}

// Adds n (the same in every lane of the group `peers`) to *counter once for the group, by
// its lowest lane, and returns the counter's value before in every lane of the group.
__device__ __forceinline__ int claim(int* counter, unsigned peers, int n, bool valid, int lane) {
    const int first = __ffs(peers) - 1;
    int before = 0;
    if (valid && lane == first) before = atomicAdd(counter, n);
    return __shfl_sync(FULL, before, first);
}

__device__ __forceinline__ unsigned lanes_below() {
    unsigned m;
    asm("mov.u32 %0, %%lanemask_lt;" : "=r"(m));
    return m;
}

// Per block, the number of elements of each class of the live weights ([programs, NCP]
// int32): the sampler's counts (the trainer's come from the scan's histograms).
extern "C" __global__ void __launch_bounds__(WARPS * 32)
class_counts(const U* old, const i64* rows, const int* prog, const unsigned char* lut, int* counts, i64 programs) {
    __shared__ int cnt[WARPS][NCP];
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    const i64 pid = (i64)blockIdx.x * WARPS + w;
    if (pid >= programs) return;
    const Block bk = table_block(pid, rows, prog);
    const U* po = old + bk.off + bk.first;
    const unsigned char* lt = lut + bk.tensor * NK;
    const unsigned below = lanes_below();
    if (lane < NCP) cnt[w][lane] = 0;
    __syncwarp();
    for (int s0 = 0; s0 < bk.n; s0 += 32 * UNROLL) {
        W o[UNROLL];
        load_slices(o, po, s0, lane, bk.n);
#pragma unroll
        for (int u = 0; u < UNROLL; u++) {
            const bool v = s0 + u * 32 + lane < bk.n;
            const int c = v ? class_of(o[u], lt) : 0;
            const unsigned peers = peers_of(c, v);
            if (v && (peers & below) == 0) atomicAdd(&cnt[w][c], __popc(peers));
        }
    }
    __syncwarp();
    if (lane < NCP) counts[pid * NCP + lane] = cnt[w][lane];
}

// Per program of a chunk table whose blocks are the scan's (BLOCK = the scan's span), each
// class's elements and events from the scan's histogram of key + NK * changed (hist,
// [programs, NB]): the trainer needs no pass of its own to count them.
extern "C" __global__ void __launch_bounds__(WARPS * 32)
hist_counts(const int* hist, const i64* prog_tensor, const unsigned char* lut, const signed char* inv_tab,
            int* counts, int* events, i64 programs) {
    __shared__ int cnt[WARPS][NCP], chg[WARPS][NCP];
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    const i64 pid = (i64)blockIdx.x * WARPS + w;
    if (pid >= programs) return;
    const i64 t = prog_tensor[pid];
    if (lane < NCP) cnt[w][lane] = chg[w][lane] = 0;
    __syncwarp();
    const int* h = hist + pid * NB;
    for (int k = lane; k < NK; k += 32) {
        const int same = h[k], moved = h[NK + k];
        if (same | moved) {
            const int c = lut[t * NK + k];
            atomicAdd(&cnt[w][c], same + moved);
            atomicAdd(&chg[w][c], moved);
        }
    }
    __syncwarp();
    if (lane < NCP) {
        const int n = cnt[w][lane], m = chg[w][lane];
        counts[pid * NCP + lane] = n;
        events[pid * NCP + lane] = inv_tab[t * NCP + lane] ? n - m : m;
    }
}

// The trainer's events: each event's class rank (its index among the chunk's elements of its
// class) at its event rank, and each changed element's residual at its slot, both grouped by
// chunk then class at the offsets eoff / roff ([chunks * NCP]). rbase / ebase are the
// blocks' class-rank and event-rank bases.
extern "C" __global__ void __launch_bounds__(WARPS * 32)
class_events(const U* old, const i64* rows, const int* prog, const U* nw, const i64* new_off,
             const unsigned char* lut, const signed char* inv_tab, const int* rbase, const int* ebase,
             const i64* eoff, const i64* roff, int* ranks_out, i64* res_out, i64 programs) {
    __shared__ i64 eo[WARPS][NCP], ro[WARPS][NCP];
    __shared__ int rc[WARPS][NCP], ec[WARPS][NCP];  // class c's elements and events so far
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    const i64 pid = (i64)blockIdx.x * WARPS + w;
    if (pid >= programs) return;
    const Block bk = table_block(pid, rows, prog);
    const U* po = old + bk.off + bk.first;
    const U* pn = nw + new_off[bk.chunk] + bk.first;
    const unsigned char* lt = lut + bk.tensor * NK;
    const unsigned inv = __ballot_sync(FULL, lane < NCP && inv_tab[bk.tensor * NCP + lane]);
    if (lane < NCP) {
        eo[w][lane] = eoff[bk.chunk * NCP + lane];
        ro[w][lane] = roff[bk.chunk * NCP + lane];
        rc[w][lane] = rbase[pid * NCP + lane];
        ec[w][lane] = ebase[pid * NCP + lane];
    }
    __syncwarp();
    const unsigned below = lanes_below();
    for (int s0 = 0; s0 < bk.n; s0 += 32 * UNROLL) {
        W o[UNROLL], nv[UNROLL];
        load_slices(o, po, s0, lane, bk.n);
        load_slices(nv, pn, s0, lane, bk.n);
#pragma unroll
        for (int u = 0; u < UNROLL; u++) {
            const bool v = s0 + u * 32 + lane < bk.n;
            const int c = v ? class_of(o[u], lt) : 0;
            const unsigned peers = peers_of(c, v);
            const bool changed = v && o[u] != nv[u];
            const bool flip = v && ((inv >> c) & 1);
            const bool ev = changed != flip;
            const unsigned evs = peers & __ballot_sync(FULL, ev);
            const int r = claim(&rc[w][c], peers, __popc(peers), v, lane) + __popc(peers & below);
            const int e = claim(&ec[w][c], peers, __popc(evs), v, lane) + __popc(evs & below);
            if (ev) ranks_out[eo[w][c] + e] = r;
            if (changed) res_out[ro[w][c] + (flip ? r - e : e)] = (i64)wrap(key(nv[u]) - key(o[u]));
        }
    }
}

// The digest term of word `lane` of the 32 words that the PW slices vals[0 .. PW) hold
// (elements i0 .. i0 + 32 * PW - 1 of the block; 0 for a word at or past n): each lane
// gathers its word's elements with shuffles, so every lane hashes one word. word0 is the
// word index of the block's first element.
__device__ __forceinline__ u64 word_term(const W* vals, int lane, int i0, int n, i64 word0) {
#if BITS == 64
    const int i = i0 + lane;
    return i < n ? term(vals[0], (u64)(word0 + i)) : 0ull;
#else
    const int PW = 64 / BITS, PER = 32 / PW;  // elements of a word, words of a slice
    u64 word = 0;
#pragma unroll
    for (int s = 0; s < PW; s++) {
#pragma unroll
        for (int j = 0; j < PW; j++) {
            const W x = __shfl_sync(FULL, vals[s], (lane % PER) * PW + j);
            if (lane / PER == s) word |= (u64)x << (j * BITS);
        }
    }
    const int i = i0 + lane * PW;
    return i < n ? term(word, (u64)(word0 + i / PW)) : 0ull;
#endif
}

// The sampler's placement: each element finds its class rank, looks it up in its segment's
// event bitmap (seg_word: first word of each chunk-class segment; pref: set bits before each
// word) and, when changed, takes its residual slot (events before it, or non-events in an
// inverted class). It writes its offset in the chunk and its new bit
// pattern in position order: at starts[pid], the block's first output, plus the changes
// before it in the block (a ballot per 32 elements). Slots outside [0, n_res) (corrupt
// streams, refused by the caller) are neither read nor written. Also sums, per block,
// the digest terms of the old and of the patched words into sums[pid * 2 + {0, 1}].
// n_words is the bitmap's length.
extern "C" __global__ void __launch_bounds__(WARPS * 32)
place_changes(const U* old, const i64* rows, const int* prog, const unsigned char* lut, const signed char* inv_tab,
              const int* base, const i64* seg_word, const int* bitmap, const int* pref, const i64* roff,
              const i64* res, const i64* starts, int* pos, U* val, i64* sums, i64 n_words, i64 n_res,
              i64 programs) {
    __shared__ i64 sg[WARPS][NCP], ro[WARPS][NCP];
    __shared__ int sp[WARPS][NCP];  // set bits before each segment's first word
    __shared__ int rc[WARPS][NCP];  // class c's elements so far
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    const i64 pid = (i64)blockIdx.x * WARPS + w;
    if (pid >= programs) return;
    const Block bk = table_block(pid, rows, prog);
    const U* po = old + bk.off + bk.first;
    const unsigned char* lt = lut + bk.tensor * NK;
    const unsigned inv = __ballot_sync(FULL, lane < NCP && inv_tab[bk.tensor * NCP + lane]);
    if (lane < NCP) {
        const i64 seg = seg_word[bk.chunk * NCP + lane];
        sg[w][lane] = seg;
        sp[w][lane] = seg < n_words ? pref[seg] : 0;  // an empty last segment may start at the end
        ro[w][lane] = roff[bk.chunk * NCP + lane];
        rc[w][lane] = base[pid * NCP + lane];
    }
    __syncwarp();
    const unsigned below = lanes_below();
    const i64 word0 = (bk.start + bk.first) / (64 / BITS);
    i64 out = starts[pid];  // the block's next output: changes are written in position order
    u64 sum_old = 0, sum_new = 0;
    for (int s0 = 0; s0 < bk.n; s0 += 32 * UNROLL) {
        W o[UNROLL], nb[UNROLL];
        int r[UNROLL];
        load_slices(o, po, s0, lane, bk.n);
#pragma unroll
        for (int u = 0; u < UNROLL; u++) {
            const bool v = s0 + u * 32 + lane < bk.n;
            const int c = v ? class_of(o[u], lt) : 0;
            const unsigned peers = peers_of(c, v);
            const int rank = claim(&rc[w][c], peers, __popc(peers), v, lane) + __popc(peers & below);
            r[u] = v ? c | (rank << 5) : -1;
        }
#pragma unroll
        for (int u = 0; u < UNROLL; u++) {
            nb[u] = o[u];
            bool changed = false;
            i64 slot = -1;
            if (r[u] >= 0) {
                const int c = r[u] & 31, rank = r[u] >> 5;
                const i64 wi = sg[w][c] + (rank >> 5);
                const unsigned word = (unsigned)bitmap[wi];
                const int bit = rank & 31;
                const bool flip = (inv >> c) & 1;
                changed = (bool)((word >> bit) & 1) != flip;
                if (changed) {  // the prefix only where a residual is taken
                    const int before = pref[wi] - sp[w][c] + __popc(word & ((1u << bit) - 1u));
                    slot = ro[w][c] + (flip ? rank - before : before);
                }
            }
            const unsigned moved = __ballot_sync(FULL, changed);  // every lane: outside the branch
            const i64 at = out + __popc(moved & below);
            out += __popc(moved);
            if (changed && slot >= 0 && slot < n_res && at < n_res) {
                nb[u] = unkey(wrap(key(o[u]) + (W)res[slot]));
                pos[at] = (int)(bk.first + s0 + u * 32 + lane);
                val[at] = (U)nb[u];
            }
        }
#pragma unroll
        for (int g = 0; g < UNROLL; g += 64 / BITS) {
            sum_old += word_term(o + g, lane, s0 + g * 32, bk.n, word0);
            sum_new += word_term(nb + g, lane, s0 + g * 32, bk.n, word0);
        }
    }
#pragma unroll
    for (int d = 16; d > 0; d >>= 1) {
        sum_old += __shfl_xor_sync(FULL, sum_old, d);
        sum_new += __shfl_xor_sync(FULL, sum_new, d);
    }
    if (lane == 0) {
        sums[pid * 2] = (i64)sum_old;
        sums[pid * 2 + 1] = (i64)sum_new;
    }
}

// The trainer's first pass over a chunk table of blocks of BLOCK elements, one CTA of
// WARPS warps each, reading both tensors as 8-byte words (every chunk starts at an 8-byte
// boundary): per block, the histogram of context key + NK * changed over its elements
// ([programs, NB] int32) and the digest word sums of the old and new words ([programs, 2]).
// The lowest lane of each bin's lanes adds their count.
extern "C" __global__ void __launch_bounds__(WARPS * 32)
scan_words(const U* old, const i64* rows, const int* prog, const U* nw, const i64* new_off, int* hist, i64* sums,
           i64 programs) {
    const int PW = 64 / BITS;
    __shared__ int bins[NB];
    __shared__ u64 part[2][WARPS];
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    const i64 pid = blockIdx.x;
    const Block bk = table_block(pid, rows, prog);
    for (int i = threadIdx.x; i < NB; i += WARPS * 32) bins[i] = 0;
    __syncthreads();
    const u64* wo = (const u64*)(old + bk.off + bk.first);
    const u64* wn = (const u64*)(nw + new_off[bk.chunk] + bk.first);
    const int words = (bk.n + PW - 1) / PW;
    const i64 j0 = (bk.start + bk.first) / PW;
    const unsigned below = lanes_below();
    u64 s_old = 0, s_new = 0;
    for (int q0 = 0; q0 < words; q0 += WARPS * 32 * UNROLL) {
        u64 a[UNROLL], b[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; u++) {
            const int q = q0 + (u * WARPS + w) * 32 + lane;
            a[u] = q < words ? __ldcs(wo + q) : 0ull;
            b[u] = q < words ? __ldcs(wn + q) : 0ull;
        }
#pragma unroll
        for (int u = 0; u < UNROLL; u++) {
            const int q = q0 + (u * WARPS + w) * 32 + lane;
            const int inside = q < words ? min(bk.n - q * PW, PW) : 0;
            const u64 keep = inside == PW ? ~0ull : (1ull << (inside * BITS)) - 1ull;
            const u64 o = a[u] & keep, d = (a[u] ^ b[u]) & keep;
            if (inside > 0) {
                s_old += term(o, (u64)(j0 + q));
                s_new += term(o ^ d, (u64)(j0 + q));
            }
#pragma unroll
            for (int e = 0; e < PW; e++) {
                const bool v = e < inside;
                const int bin = (int)((o >> (e * BITS + MANT)) & KMASK) + (((d >> (e * BITS)) & WMASK) ? NK : 0);
                const unsigned peers = peers_of(bin, v);
                if (v && (peers & below) == 0) atomicAdd(&bins[bin], __popc(peers));
            }
        }
    }
#pragma unroll
    for (int d = 16; d > 0; d >>= 1) {
        s_old += __shfl_xor_sync(FULL, s_old, d);
        s_new += __shfl_xor_sync(FULL, s_new, d);
    }
    if (lane == 0) {
        part[0][w] = s_old;
        part[1][w] = s_new;
    }
    __syncthreads();
    for (int i = threadIdx.x; i < NB; i += WARPS * 32) hist[pid * NB + i] = bins[i];
    if (threadIdx.x < 2) {
        u64 t = 0;
        for (int k = 0; k < WARPS; k++) t += part[threadIdx.x][k];
        sums[pid * 2 + threadIdx.x] = (i64)t;
    }
}
