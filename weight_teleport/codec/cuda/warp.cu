// Context classes of sparse chunks as warp code: class counts per block, the events of the
// trainer's delta in class-rank order, and the placement of decoded changes on the sampler.
//
// A warp owns one block of BLOCK elements of a chunk (a program of the chunk table,
// codec/cuda/blocks.py) and walks it 32 elements at a time, element s * 32 + lane in lane
// `lane`. The lanes vote their class bit by bit (KBITS ballots), so every lane knows the
// mask of the lanes of its class and its rank among them is one popcount; lane c keeps
// class c's running count in a register and hands it out with one shuffle.
//
// Compiled per element type by codec/cuda/warp.py with these defines: BITS (element
// width), IS_FLOAT, MANT (mantissa bits), KMASK (exponent-field mask), NCP (class slots of a
// chunk, a power of two <= 32), KBITS (log2 NCP), BLOCK, WARPS (warps of a CTA), UNROLL
// (slices loaded before any is used).

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

// The lanes' classes, voted bit by bit, and which lanes hold an element at all.
struct Votes {
    unsigned valid, bit[KBITS];
};

__device__ __forceinline__ Votes vote(int c, bool valid) {
    Votes x;
    x.valid = __ballot_sync(FULL, valid);
#pragma unroll
    for (int j = 0; j < KBITS; j++) x.bit[j] = __ballot_sync(FULL, (c >> j) & 1);
    return x;
}

// Mask of the valid lanes whose class is c.
__device__ __forceinline__ unsigned members(const Votes& x, int c) {
    unsigned m = x.valid;
#pragma unroll
    for (int j = 0; j < KBITS; j++) m &= ((c >> j) & 1) ? x.bit[j] : ~x.bit[j];
    return m;
}

__device__ __forceinline__ unsigned lanes_below() {
    unsigned m;
    asm("mov.u32 %0, %%lanemask_lt;" : "=r"(m));
    return m;
}

// Per block, the number of elements of each class and, with the new weights, of each class's
// events (changes, or non-changes in an inverted class): [programs, NCP] int32 each.
extern "C" __global__ void __launch_bounds__(WARPS * 32)
class_counts(const U* old, const i64* rows, const int* prog, const unsigned char* lut, int* counts,
             const U* nw, const i64* new_off, const signed char* inv_tab, int* events, i64 has_new, i64 programs) {
    const int lane = threadIdx.x & 31;
    const i64 pid = (i64)blockIdx.x * WARPS + (threadIdx.x >> 5);
    if (pid >= programs) return;
    const Block bk = table_block(pid, rows, prog);
    const U* po = old + bk.off + bk.first;
    const U* pn = has_new ? nw + new_off[bk.chunk] + bk.first : po;
    const unsigned char* lt = lut + bk.tensor * NK;
    const unsigned inv = has_new ? __ballot_sync(FULL, lane < NCP && inv_tab[bk.tensor * NCP + lane]) : 0u;
    int cnt = 0, evc = 0;
    for (int s0 = 0; s0 < bk.n; s0 += 32 * UNROLL) {
        W o[UNROLL], nv[UNROLL];
        load_slices(o, po, s0, lane, bk.n);
        if (has_new) load_slices(nv, pn, s0, lane, bk.n);
#pragma unroll
        for (int u = 0; u < UNROLL; u++) {
            const bool v = s0 + u * 32 + lane < bk.n;
            const int c = v ? class_of(o[u], lt) : 0;
            const unsigned mine = members(vote(c, v), lane);
            cnt += __popc(mine);
            if (has_new) {
                const bool ev = v && ((o[u] != nv[u]) != (bool)((inv >> c) & 1));
                evc += __popc(mine & __ballot_sync(FULL, ev));
            }
        }
    }
    if (lane < NCP) {
        counts[pid * NCP + lane] = cnt;
        if (has_new) events[pid * NCP + lane] = evc;
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
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    const i64 pid = (i64)blockIdx.x * WARPS + w;
    if (pid >= programs) return;
    const Block bk = table_block(pid, rows, prog);
    const U* po = old + bk.off + bk.first;
    const U* pn = nw + new_off[bk.chunk] + bk.first;
    const unsigned char* lt = lut + bk.tensor * NK;
    const unsigned inv = __ballot_sync(FULL, lane < NCP && inv_tab[bk.tensor * NCP + lane]);
    int rc = 0, ec = 0;  // lane c: class c's elements and events so far
    if (lane < NCP) {
        eo[w][lane] = eoff[bk.chunk * NCP + lane];
        ro[w][lane] = roff[bk.chunk * NCP + lane];
        rc = rbase[pid * NCP + lane];
        ec = ebase[pid * NCP + lane];
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
            const Votes x = vote(c, v);
            const bool changed = v && o[u] != nv[u];
            const bool flip = v && ((inv >> c) & 1);
            const bool ev = changed != flip;
            const unsigned evm = __ballot_sync(FULL, ev);
            const unsigned peers = members(x, c);
            const int r = __shfl_sync(FULL, rc, c) + __popc(peers & below);
            const int e = __shfl_sync(FULL, ec, c) + __popc(peers & evm & below);
            const unsigned mine = members(x, lane);
            rc += __popc(mine);
            ec += __popc(mine & evm);
            if (ev) ranks_out[eo[w][c] + e] = r;
            if (changed) res_out[ro[w][c] + (flip ? r - e : e)] = (i64)wrap(key(nv[u]) - key(o[u]));
        }
    }
}

// Sum over a slice of the digest terms of the words its lanes' bit patterns form: the lanes
// of a word gather it with shuffles and its first lane adds the term. i is the lane's
// element in the block, word0 the word index of the block's first element.
__device__ __forceinline__ u64 slice_terms(W b, int lane, int i, int n, i64 word0) {
#if BITS == 64
    return i < n ? term(b, (u64)(word0 + i)) : 0ull;
#else
    const int PW = 64 / BITS;
    u64 word = (u64)b << ((lane % PW) * BITS);
#pragma unroll
    for (int d = 1; d < PW; d <<= 1) word |= __shfl_xor_sync(FULL, word, d);
    return (lane % PW == 0 && i < n) ? term(word, (u64)(word0 + i / PW)) : 0ull;
#endif
}

// The sampler's placement: each element finds its class rank, looks it up in its segment's
// event bitmap (seg_word: first word of each chunk-class segment; pref: set bits before each
// word) and, when changed, takes its residual slot (events before it, or non-events in an
// inverted class), writing its offset in the chunk and new bit pattern there. Slots outside
// [0, n_res) (corrupt streams, refused by the caller) are not written. Also sums, per block,
// the digest terms of the old and of the patched words into sums[pid * 2 + {0, 1}].
extern "C" __global__ void __launch_bounds__(WARPS * 32)
place_changes(const U* old, const i64* rows, const int* prog, const unsigned char* lut, const signed char* inv_tab,
              const int* base, const i64* seg_word, const int* bitmap, const int* pref, const i64* roff,
              const i64* res, int* pos, U* val, i64* sums, i64 n_res, i64 programs) {
    __shared__ i64 sg[WARPS][NCP], ro[WARPS][NCP];
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    const i64 pid = (i64)blockIdx.x * WARPS + w;
    if (pid >= programs) return;
    const Block bk = table_block(pid, rows, prog);
    const U* po = old + bk.off + bk.first;
    const unsigned char* lt = lut + bk.tensor * NK;
    const unsigned inv = __ballot_sync(FULL, lane < NCP && inv_tab[bk.tensor * NCP + lane]);
    int rc = 0;  // lane c: class c's elements so far
    if (lane < NCP) {
        sg[w][lane] = seg_word[bk.chunk * NCP + lane];
        ro[w][lane] = roff[bk.chunk * NCP + lane];
        rc = base[pid * NCP + lane];
    }
    __syncwarp();
    const unsigned below = lanes_below();
    const i64 word0 = (bk.start + bk.first) / (64 / BITS);
    u64 sum_old = 0, sum_new = 0;
    for (int s0 = 0; s0 < bk.n; s0 += 32 * UNROLL) {
        W o[UNROLL];
        int r[UNROLL];
        load_slices(o, po, s0, lane, bk.n);
#pragma unroll
        for (int u = 0; u < UNROLL; u++) {
            const bool v = s0 + u * 32 + lane < bk.n;
            const int c = v ? class_of(o[u], lt) : 0;
            const Votes x = vote(c, v);
            const int rank = __shfl_sync(FULL, rc, c) + __popc(members(x, c) & below);  // every lane shuffles
            r[u] = v ? c | (rank << 5) : -1;
            rc += __popc(members(x, lane));
        }
#pragma unroll
        for (int u = 0; u < UNROLL; u++) {
            const int i = s0 + u * 32 + lane;
            W nb = o[u];
            if (r[u] >= 0) {
                const int c = r[u] & 31, rank = r[u] >> 5;
                const i64 seg = sg[w][c], wi = seg + (rank >> 5);
                const unsigned word = (unsigned)bitmap[wi];
                const int bit = rank & 31;
                const int before = pref[wi] - pref[seg] + __popc(word & ((1u << bit) - 1u));
                const bool flip = (inv >> c) & 1;
                if ((bool)((word >> bit) & 1) != flip) {
                    const i64 slot = ro[w][c] + (flip ? rank - before : before);
                    if (slot >= 0 && slot < n_res) {
                        nb = unkey(wrap(key(o[u]) + (W)res[slot]));
                        pos[slot] = (int)(bk.first + i);
                        val[slot] = (U)nb;
                    }
                }
            }
            sum_old += slice_terms(o[u], lane, i, bk.n, word0);
            sum_new += slice_terms(nb, lane, i, bk.n, word0);
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
