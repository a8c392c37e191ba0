// The CUDA backend's per-element passes as warp code: the trainer's scan (key histograms and
// digests), class counts per block (from the live weights, or from the scan's histograms),
// the events of the trainer's delta in class-rank order, and the placement of decoded
// changes on the sampler.
//
// In the rank kernels a warp owns one block of BLOCK elements of a chunk (a program of the
// chunk table, codec/cuda/blocks.py) and walks it 32 elements at a time, element s * 32 +
// lane in lane `lane`; the scan gives a block to a CTA and reads 8-byte words.
// `__match_any_sync` gives every lane the mask of the lanes of its class, so its rank among
// them is one popcount past the class's running count in shared memory, which the group's
// lowest lane then advances (the scan's histogram bins take an atomic add). (Voting the key
// bit by bit with ballots instead measured 2.1-2.3x slower in the scan on the H200:
// BENCHMARKS.md.)
// A round of UNROLL slices whose elements are all inside the block runs without bounds checks,
// and its loads are issued while the round before is worked on (each_round).
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
#define PW (64 / BITS)  // elements of an 8-byte (digest) word

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

// A block of n elements of the N tensors at p[], a round of UNROLL slices at a time:
// body(x, s0, all) gets the round's elements x[k][u] of tensor k (0 past the end; `all`:
// every one inside the block). The next round's loads are issued before the body runs, so
// the body's work hides them (placement 28.8 -> 26.3 ms on the H200; the class-count and
// events kernels took the same time either way).
template <int N, class F>
__device__ __forceinline__ void each_round(const U* const (&p)[N], int n, int lane, F body) {
    W x[N][UNROLL], next[N][UNROLL];
#pragma unroll
    for (int k = 0; k < N; k++) load_slices(x[k], p[k], 0, lane, n);
    for (int s0 = 0; s0 < n; s0 += 32 * UNROLL) {
#pragma unroll
        for (int k = 0; k < N; k++) load_slices(next[k], p[k], s0 + 32 * UNROLL, lane, n);
        if (s0 + 32 * UNROLL <= n) body(x, s0, true);
        else body(x, s0, false);
#pragma unroll
        for (int k = 0; k < N; k++)
#pragma unroll
            for (int u = 0; u < UNROLL; u++) x[k][u] = next[k][u];
    }
}

__device__ __forceinline__ int class_of(W b, const unsigned char* lut) {
    return __ldg(lut + (int)((b >> MANT) & KMASK));
}

// The class counts and the placement copy a class map of at most 256 keys into shared
// memory and read it there; larger ones (64-bit floats: 2048 keys a warp) stay in global
// memory, so the static shared memory stays small beside the block's copy.
#define LUT_SHARED (NK <= 256)
#define LUT_BYTES (LUT_SHARED ? NK : 1)  // a warp's shared bytes for it

__device__ __forceinline__ int class_in(W b, const unsigned char* lut) {
#if LUT_SHARED
    return lut[(int)((b >> MANT) & KMASK)];
#else
    return class_of(b, lut);
#endif
}

// The class map of tensor t that a warp reads with class_in: copied into `own`, the warp's
// LUT_BYTES of shared memory, where LUT_SHARED, else where it is (the class counts read
// it from shared memory: 9.80 -> 9.59 ms on the H200).
__device__ __forceinline__ const unsigned char* warp_lut(unsigned char* own, const unsigned char* lut, i64 t,
                                                         int lane) {
#if LUT_SHARED
    for (int k = lane; k < NK; k += 32) own[k] = lut[t * NK + k];
    __syncwarp();
    return own;
#else
    return lut + t * NK;
#endif
}

// Mask of the lanes whose key is the same as this lane's; lanes without an element form a
// group of their own.
__device__ __forceinline__ unsigned peers_of(int key, bool valid) {
    return __match_any_sync(FULL, valid ? key : -1);
}

__device__ __forceinline__ unsigned lanes_below() {
    unsigned m;
    asm("mov.u32 %0, %%lanemask_lt;" : "=r"(m));
    return m;
}

// Per block, the number of elements of each class of the live weights ([programs, NCP]
// int32): the sampler's counts (the trainer's come from the scan's histograms). Order does
// not matter here, so each lane counts its own elements in registers, a byte per class,
// moved into 16-bit fields before a byte can reach 256, and the warp adds the lanes' fields
// at the end: no votes per element, only the class map's byte from shared memory. A block
// that starts on an 8-byte boundary (every chunk does, unless the live tensor is a view at
// an odd offset) is read as 8-byte words, PW elements a load (9.65 -> 8.01 ms on the H200
// against a load per element). (Holding the map in registers as a 32-key window of 4-bit
// classes instead took 16.4 ms against 9.8 on the H200: the window's selects cost more issue
// slots than the load.)
static_assert(BLOCK <= 65535, "a block's count of a class fits 16 bits");

extern "C" __global__ void __launch_bounds__(WARPS * 32)
class_counts(const U* old, const i64* rows, const int* prog, const unsigned char* lut, int* counts, i64 programs) {
    static_assert(NCP <= 16, "two 8-byte words of byte counters");
    __shared__ unsigned char luts[WARPS][LUT_BYTES];
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    const i64 pid = (i64)blockIdx.x * WARPS + w;
    if (pid >= programs) return;
    const Block bk = table_block(pid, rows, prog);
    const U* po = old + bk.off + bk.first;
    const unsigned char* lt = warp_lut(luts[w], lut, bk.tensor, lane);
    const u64 even = 0x00ff00ff00ff00ffull;
    u64 lo = 0, hi = 0;                          // classes 0-7 and 8-15, a byte each
    u64 e_lo = 0, o_lo = 0, e_hi = 0, o_hi = 0;  // the same bytes, even and odd apart, in 16 bits
    auto spread = [&]() {
        e_lo += lo & even;
        o_lo += (lo >> 8) & even;
        e_hi += hi & even;
        o_hi += (hi >> 8) & even;
        lo = hi = 0;
    };
    auto add = [&](W b) {
        const int c = class_in(b, lt);
        const u64 one = 1ull << ((c & 7) * 8);
        lo += c < 8 ? one : 0ull;
        hi += c < 8 ? 0ull : one;
    };
    constexpr int LOADS = 4;                          // words a lane loads before it counts them
    constexpr int ROUNDS = 192 / (LOADS * PW);        // rounds between spreads: at most 192 a byte
    if (PW > 1 && ((unsigned long long)po & 7ull) == 0) {
        const u64* pw = (const u64*)po;
        const int nw = bk.n / PW;
        int r = 0;
        for (int q0 = 0; q0 < nw; q0 += 32 * LOADS) {
            u64 a[LOADS];
#pragma unroll
            for (int u = 0; u < LOADS; u++) a[u] = q0 + u * 32 + lane < nw ? __ldcs(pw + q0 + u * 32 + lane) : 0ull;
#pragma unroll
            for (int u = 0; u < LOADS; u++)
                if (q0 + u * 32 + lane < nw)
#pragma unroll
                    for (int e = 0; e < PW; e++) add((W)((a[u] >> (e * BITS)) & WMASK));
            if (++r == ROUNDS) {
                spread();
                r = 0;
            }
        }
        for (int i = nw * PW + lane; i < bk.n; i += 32) add((W)po[i]);  // fewer than PW
    } else {  // a round of UNROLL slices at a time
        static_assert(16 * UNROLL <= 192, "16 rounds between spreads");
        const U* const p[1] = {po};
        int r = 0;
        each_round(p, bk.n, lane, [&](const W (&x)[1][UNROLL], int s0, bool all) {
#pragma unroll
            for (int u = 0; u < UNROLL; u++)
                if (all || s0 + u * 32 + lane < bk.n) add(x[0][u]);
            if (++r % 16 == 0) spread();
        });
    }
    spread();
#pragma unroll
    for (int d = 16; d > 0; d >>= 1) {
        e_lo += __shfl_xor_sync(FULL, e_lo, d);
        o_lo += __shfl_xor_sync(FULL, o_lo, d);
        e_hi += __shfl_xor_sync(FULL, e_hi, d);
        o_hi += __shfl_xor_sync(FULL, o_hi, d);
    }
    if (lane < NCP) {
        const u64 f = lane < 8 ? ((lane & 1) ? o_lo : e_lo) : ((lane & 1) ? o_hi : e_hi);
        counts[pid * NCP + lane] = (int)((f >> (16 * ((lane & 7) >> 1))) & 0xffff);
    }
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

struct __align__(16) Tally {  // a class of the block's chunk
    i64 events_at;            // where the chunk's events of the class go
    int seen, events;         // its elements and events in the chunk before the current slice
};

// The trainer's events: each event's class rank (its index among the chunk's elements of its
// class) at its event rank, and each changed element's residual at its slot, both grouped by
// chunk then class at the offsets eoff / roff ([chunks * NCP]). rbase / ebase are the
// blocks' class-rank and event-rank bases.
extern "C" __global__ void __launch_bounds__(WARPS * 32)
class_events(const U* old, const i64* rows, const int* prog, const U* nw, const i64* new_off,
             const unsigned char* lut, const signed char* inv_tab, const int* rbase, const int* ebase,
             const i64* eoff, const i64* roff, int* ranks_out, i64* res_out, i64 programs) {
    __shared__ Tally tallies[WARPS][NCP];
    __shared__ i64 ro[WARPS][NCP];
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    const i64 pid = (i64)blockIdx.x * WARPS + w;
    if (pid >= programs) return;
    Tally* tl = tallies[w];
    const Block bk = table_block(pid, rows, prog);
    const U* po = old + bk.off + bk.first;
    const U* pn = nw + new_off[bk.chunk] + bk.first;
    const unsigned char* lt = lut + bk.tensor * NK;
    const unsigned inv = __ballot_sync(FULL, lane < NCP && inv_tab[bk.tensor * NCP + lane]);
    if (lane < NCP) {
        tl[lane] = Tally{eoff[bk.chunk * NCP + lane], rbase[pid * NCP + lane], ebase[pid * NCP + lane]};
        ro[w][lane] = roff[bk.chunk * NCP + lane];
    }
    __syncwarp();
    const unsigned below = lanes_below();
    const U* const p[2] = {po, pn};
    each_round(p, bk.n, lane, [&](const W (&x)[2][UNROLL], int s0, bool all) {
        const W* o = x[0];
        const W* nv = x[1];
#pragma unroll
        for (int u = 0; u < UNROLL; u++) {
            const bool v = all || s0 + u * 32 + lane < bk.n;
            const int c = v ? class_of(o[u], lt) : 0;
            const unsigned peers = peers_of(c, v), ahead = peers & below;
            const bool changed = v && o[u] != nv[u];
            const bool flip = v && ((inv >> c) & 1);
            const bool ev = changed != flip;
            const unsigned evs = peers & __ballot_sync(FULL, ev);
            const Tally t = tl[c];
            const int r = t.seen + __popc(ahead), e = t.events + __popc(evs & below);
            __syncwarp();
            if (v && ahead == 0) *(int2*)&tl[c].seen = make_int2(t.seen + __popc(peers), t.events + __popc(evs));
            __syncwarp();
            if (ev) ranks_out[t.events_at + e] = r;
            if (changed) res_out[ro[w][c] + (flip ? r - e : e)] = (i64)wrap(key(nv[u]) - key(o[u]));
        }
    });
}

// The sampler's placement, in two phases per block (one warp's; its shared memory holds the
// block's old elements and a queue of its changes: warp.py's `place_shared` bytes):
// - every element finds its class rank and looks it up in its segment's event bitmap
//   (seg_word: first word of each chunk-class segment); a changed element (an event, or a
//   non-event in an inverted class) joins the queue in position order with its class, rank
//   and the set bits before it in its bitmap word. The old words' digest terms are summed
//   from the block's copy in shared memory.
// - the queue is taken 32 changes at a time, every lane busy: each change's residual slot
//   (pref: set bits before each bitmap word), its new bits, written with its offset in the
//   chunk at starts[pid], the block's first output, plus the changes before it; and for
//   each word holding changes, the digest term of the patched word less the old one.
// A batch of the queue ends at a word's boundary, so a word's changes are patched together.
// Slots outside [0, n_res) (corrupt streams, refused by the caller) are neither read nor
// written. Writes per block the digest word sums of the old and of the patched words into
// sums[pid * 2 + {0, 1}]. n_words is the bitmap's length.
#define QN (64 * UNROLL)        // queue slots: a batch's leftovers (< 32) plus a round's changes
static_assert((QN & (QN - 1)) == 0, "the queue's length is a power of two");

struct Queue {
    unsigned* meta;  // element in the block | class << 16 | set bits before it in its word << 21
    int* rank;       // class rank
    int head, tail;  // taken / added so far (warp-uniform)
};

struct __align__(16) Seg {  // a class's segment of the block's chunk
    const int* bits;  // its first bitmap word
    int seen;         // the class's elements in the chunk before the current slice
};

extern "C" __global__ void __launch_bounds__(WARPS * 32)
place_changes(const U* old, const i64* rows, const int* prog, const unsigned char* lut, const signed char* inv_tab,
              const int* base, const i64* seg_word, const int* bitmap, const int* pref, const i64* roff,
              const i64* res, const i64* starts, int* pos, U* val, i64* sums, i64 n_words, i64 n_res,
              i64 programs) {
    __shared__ Seg segs[WARPS][NCP];
    __shared__ i64 ro[WARPS][NCP];
    __shared__ int seg_before[WARPS][NCP];  // set bits before each segment's first word
    __shared__ unsigned char luts[WARPS][LUT_BYTES];
    extern __shared__ u64 dyn[];  // per warp: the block's old words, then the queue
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    const i64 pid = (i64)blockIdx.x * WARPS + w;
    if (pid >= programs) return;
    u64* words = dyn + (i64)w * (BLOCK / PW + QN);
    U* blk = (U*)words;
    Seg* sg = segs[w];
    Queue q{(unsigned*)(words + BLOCK / PW), (int*)(words + BLOCK / PW) + QN, 0, 0};
    const Block bk = table_block(pid, rows, prog);
    const U* po = old + bk.off + bk.first;
    const unsigned char* lt = warp_lut(luts[w], lut, bk.tensor, lane);
    const unsigned inv = __ballot_sync(FULL, lane < NCP && inv_tab[bk.tensor * NCP + lane]);
    if (lane < NCP) {
        const i64 first = seg_word[bk.chunk * NCP + lane];  // an empty last segment may start at the end
        sg[lane] = Seg{bitmap + first, base[pid * NCP + lane]};
        seg_before[w][lane] = first < n_words ? pref[first] : 0;
        ro[w][lane] = roff[bk.chunk * NCP + lane];
    }
    __syncwarp();
    const unsigned below = lanes_below();
    const i64 word0 = (bk.start + bk.first) / PW;
    i64 out = starts[pid];  // the block's next output: changes are written in position order
    u64 sum_old = 0, delta = 0;
    // One round: UNROLL slices of 32 elements (`all`: every one inside the block) find their
    // class ranks and bitmap bits, and the changed ones join the queue; then the queue is
    // taken while it holds 32 changes (all of it after the last round).
    const U* const p[1] = {po};
    each_round(p, bk.n, lane, [&](const W (&x)[1][UNROLL], int s0, bool all) {
        const W* o = x[0];
        int cls[UNROLL], rank[UNROLL];
        unsigned word[UNROLL];
        // the round's class ranks first (shared memory only), then all its bitmap words
        // loaded together, then the changes queued: one load latency a round, not a slice
        // (placement 26.3 -> 25.1 ms on the H200)
#pragma unroll
        for (int u = 0; u < UNROLL; u++) {
            const int i = s0 + u * 32 + lane;
            const bool v = all || i < bk.n;
            blk[i] = (U)o[u];  // 0 past the end: the last word is zero-padded
            const int c = v ? class_in(o[u], lt) : 0;
            const unsigned peers = peers_of(c, v), ahead = peers & below;
            const int seen = sg[c].seen;
            __syncwarp();
            if (v && ahead == 0) sg[c].seen = seen + __popc(peers);  // once per class: its lowest lane
            __syncwarp();
            cls[u] = c;
            rank[u] = seen + __popc(ahead);
        }
#pragma unroll
        for (int u = 0; u < UNROLL; u++) {
            const bool v = all || s0 + u * 32 + lane < bk.n;
            word[u] = v ? (unsigned)__ldg(sg[cls[u]].bits + (rank[u] >> 5)) : 0u;
        }
#pragma unroll
        for (int u = 0; u < UNROLL; u++) {
            const int i = s0 + u * 32 + lane;
            const bool v = all || i < bk.n;
            const int bit = rank[u] & 31;
            const unsigned flip = ((inv >> cls[u]) & 1) ? ~0u : 0u;  // an inverted class's changes are its 0 bits
            const bool changed = v && (((word[u] ^ flip) >> bit) & 1);
            const unsigned moved = __ballot_sync(FULL, changed);
            if (changed) {
                const int e = (q.tail + __popc(moved & below)) & (QN - 1);
                q.meta[e] = (unsigned)i | (unsigned)cls[u] << 16 |
                            (unsigned)__popc(word[u] & ((1u << bit) - 1u)) << 21;
                q.rank[e] = rank[u];
            }
            q.tail += __popc(moved);
        }
        __syncwarp();
        for (int k = lane; k < 32 * UNROLL / PW; k += 32) {
            const int wd = s0 / PW + k;
            if (wd * PW < bk.n) sum_old += term(words[wd], (u64)(word0 + wd));
        }
        const bool last_round = s0 + 32 * UNROLL >= bk.n;
        while (q.tail - q.head >= (last_round ? 1 : 32)) {
            const int avail = q.tail - q.head;
            const int e = (q.head + lane) & (QN - 1);
            const unsigned meta = lane < avail ? q.meta[e] : 0u;
            const int idx = (int)(meta & 0xffffu);
            int m = avail < 32 ? avail : 32;
            if (avail > 32) {  // leave a word that goes on past lane 31 to the next batch
                const int next = (int)(q.meta[(q.head + 32) & (QN - 1)] & 0xffffu) / PW;
                m -= __popc(__ballot_sync(FULL, idx / PW == next));
            }
            const bool mine = lane < m;
            W nb = 0;
            if (mine) {
                const int c = (meta >> 16) & 31, rank = q.rank[e];
                const i64 wi = (sg[c].bits - bitmap) + (rank >> 5);
                const int before = pref[wi] - seg_before[w][c] + (int)(meta >> 21);
                const i64 slot = ro[w][c] + (((inv >> c) & 1) ? rank - before : before);
                const i64 at = out + lane;
                nb = blk[idx];
                if (slot >= 0 && slot < n_res && at < n_res) {
                    nb = unkey(wrap(key(nb) + (W)res[slot]));
                    pos[at] = (int)(bk.first + idx);
                    val[at] = (U)nb;
                }
            }
            out += m;
            const int wd = mine ? idx / PW : -1;
            const int after = __shfl_down_sync(FULL, wd, 1);
            const bool ends_word = mine && (lane == m - 1 || after != wd);
            const u64 was = ends_word ? words[wd] : 0ull;
            __syncwarp();
            if (mine) blk[idx] = (U)nb;
            __syncwarp();
            if (ends_word) delta += term(words[wd], (u64)(word0 + wd)) - term(was, (u64)(word0 + wd));
            q.head += m;
        }
    });
#pragma unroll
    for (int d = 16; d > 0; d >>= 1) {
        sum_old += __shfl_xor_sync(FULL, sum_old, d);
        delta += __shfl_xor_sync(FULL, delta, d);
    }
    if (lane == 0) {
        sums[pid * 2] = (i64)sum_old;
        sums[pid * 2 + 1] = (i64)(sum_old + delta);
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
