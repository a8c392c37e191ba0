// The CUDA backend's per-element passes as warp code: the trainer's scan (key histograms and
// digests), class counts per block (from the live weights, or from the scan's histograms),
// the events of the trainer's delta in class-rank order, and the placement of decoded
// changes on the sampler.
//
// A warp (the scan: a CTA) owns one block of BLOCK elements of a chunk (a program of the
// chunk table, codec/cuda/kernels/chunk_table.py). The scan and the class counts read it as 8-byte words
// (element s * 32 + lane in lane `lane`) and count in counters of their own: the scan per
// key and lane in shared memory, the class counts per class in each lane's registers; only
// key sets too wide for those (64-bit floats) are counted with `__match_any_sync` and
// shared bins. The events and the placement instead give each lane a run of consecutive
// elements, keep its classes as bit planes, and rank an element by a popcount of its class's
// plane below it past a per-class prefix over the lanes: they work per class and per
// change, not per element.
//
// Compiled per element type by codec/cuda/kernels/warp.py with these defines: BITS (element
// width), IS_FLOAT, MANT (mantissa bits), KMASK (exponent-field mask), BLOCK (elements of a
// program), WARPS (warps of a CTA), UNROLL (slices loaded before any is used); for the rank
// kernels NCP (class slots of a chunk); for the scan NB (histogram bins, >= 2 * (KMASK + 1)),
// SCAN_LANES and SCAN_WARPS; for the events EVENT_WARPS.

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
// kernels and codec/cuda/kernels/bitops.py define the same).
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

// The parameters of the events and the placement kernels, each taken as one struct by
// value; kernels/warp.py's EventParams and PlaceParams mirror them field for field (the
// module's source ends with static_asserts of their sizes; tests/codec/test_kernel_params.py
// checks the field order). Every field is 8 bytes: a device pointer or an i64.
struct EventParams {
    const U* old;
    const i64* rows;
    const int* prog;
    const U* nw;
    const i64* new_off;
    const unsigned char* lut;
    const signed char* inv_tab;
    const int* rbase;
    const int* ebase;
    const i64* eoff;
    const i64* roff;
    int* ranks_out;
    U* res_out;
    i64 programs;
};

struct PlaceParams {
    const U* old;
    const i64* rows;
    const int* prog;
    const unsigned char* lut;
    const signed char* inv_tab;
    const int* counts;
    const int* base;
    const i64* seg_word;
    const int* bitmap;
    const int* pref;
    const i64* roff;
    const i64* res;
    const i64* starts;
    const i64* old_sums;
    int* pos;
    U* val;
    i64* sums;
    i64 n_words;
    i64 n_res;
    i64 programs;
};

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
// the body's work hides their latency in kernels that wait on memory.
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

// The class counts, the events and the placement copy a class map of at most 256 keys into
// shared memory and read it there; larger ones (64-bit floats: 2048 keys a warp) stay in
// global memory, so the static shared memory stays small.
#define LUT_SHARED (NK <= 256)

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

// The 8-byte word wi of the elements at run (elements from `left` on are 0).
__device__ __forceinline__ u64 run_word(const U* run, int wi, int left) {
    u64 w = 0;
#pragma unroll
    for (int k = 0; k < PW; k++)
        if (wi * PW + k < left) w |= (u64)run[wi * PW + k] << (k * BITS);
    return w;
}

// Per block, the number of elements of each class of the live weights ([programs, NCP]
// int32): the sampler's counts (the trainer's come from the scan's histograms). Order does
// not matter here, so each lane counts its own elements in registers: the warp's copy of the
// class map in shared memory holds each key's class c as 1 << 4c, so an element costs its
// key, one shared load and one 8-byte add into 16 nibble counters; at most 15 elements go
// into the nibbles before they are added into byte counters, and at most 255 into the bytes
// before they are added into 16-bit fields, which the warp sums at the end. A block that
// starts on an 8-byte boundary (every chunk does, unless the live tensor is a view at an odd
// offset) is read as 8-byte words, PW elements a load. (A map of class numbers with a byte
// counter per class would cost a shift, two selects and two 8-byte adds an element.) The
// same pass sums the block's digest terms into old_sums[program], for the placement, which
// then computes terms only for the changed words.
static_assert(BLOCK <= 65535, "a block's count of a class fits 16 bits");

extern "C" __global__ void __launch_bounds__(WARPS * 32)
class_counts(const U* old, const i64* rows, const int* prog, const unsigned char* lut, int* counts, i64* old_sums,
             i64 programs) {
    static_assert(NCP <= 16, "a nibble per class in one 8-byte word");
    __shared__ u64 one_hot[WARPS][LUT_SHARED ? NK : 1];  // class c of each key as 1 << 4c
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    const i64 pid = (i64)blockIdx.x * WARPS + w;
    if (pid >= programs) return;
    const Block bk = table_block(pid, rows, prog);
    const U* po = old + bk.off + bk.first;
    const i64 word0 = (bk.start + bk.first) / PW;  // the block's first digest word
    u64 sum = 0;
#if LUT_SHARED
    for (int k = lane; k < NK; k += 32) one_hot[w][k] = 1ull << (4 * lut[bk.tensor * NK + k]);
    __syncwarp();
#endif
    const u64 m8 = 0x0f0f0f0f0f0f0f0full, m16 = 0x00ff00ff00ff00ffull;
    u64 nib = 0;             // at most 15 elements: class c at bits 4c
    u64 b_even = 0, b_odd = 0;  // at most 255: classes 2j and 2j + 1 at byte j
    u64 f[4] = {0, 0, 0, 0};    // 16-bit fields: classes 4i + {0, 2, 1, 3} at field i of f[0..3]
    auto add = [&](W b) {
        const int key = (int)((b >> MANT) & KMASK);
#if LUT_SHARED
        nib += one_hot[w][key];
#else
        nib += 1ull << (4 * __ldg(lut + bk.tensor * NK + key));
#endif
    };
    auto to_bytes = [&]() {
        b_even += nib & m8;
        b_odd += (nib >> 4) & m8;
        nib = 0;
    };
    auto to_fields = [&]() {
        f[0] += b_even & m16;
        f[1] += (b_even >> 8) & m16;
        f[2] += b_odd & m16;
        f[3] += (b_odd >> 8) & m16;
        b_even = b_odd = 0;
    };
    constexpr int LOADS = 8;
    constexpr int NIB_WORDS = 15 / PW;                 // words between nibble spills
    constexpr int ROUNDS = 255 / (LOADS * PW);         // rounds between byte spills
    static_assert(NIB_WORDS >= 1 && ROUNDS >= 1, "counter widths");
    if (PW > 1 && ((unsigned long long)po & 7ull) == 0) {
        const u64* pw = (const u64*)po;
        const int nw = bk.n / PW;
        int r = 0;
        for (int q0 = 0; q0 < nw; q0 += 32 * LOADS) {
            u64 a[LOADS];
#pragma unroll
            for (int u = 0; u < LOADS; u++) a[u] = q0 + u * 32 + lane < nw ? __ldcs(pw + q0 + u * 32 + lane) : 0ull;
#pragma unroll
            for (int u = 0; u < LOADS; u++) {
                if (q0 + u * 32 + lane < nw) {
                    sum += term(a[u], (u64)(word0 + q0 + u * 32 + lane));
#pragma unroll
                    for (int e = 0; e < PW; e++) add((W)((a[u] >> (e * BITS)) & WMASK));
                }
                if ((u + 1) % NIB_WORDS == 0 || u == LOADS - 1) to_bytes();
            }
            if (++r == ROUNDS) {
                to_fields();
                r = 0;
            }
        }
        to_fields();
        for (int i = nw * PW + lane; i < bk.n; i += 32) {  // fewer than PW
            add((W)po[i]);
            to_bytes();
        }
        if (lane == 0 && nw * PW < bk.n) sum += term(run_word(po, nw, bk.n), (u64)(word0 + nw));
    } else {  // a round of UNROLL slices at a time
        static_assert(UNROLL <= 15, "a round's elements fit a nibble");
        const U* const p[1] = {po};
        int r = 0;
        each_round(p, bk.n, lane, [&](const W (&x)[1][UNROLL], int s0, bool all) {
#pragma unroll
            for (int u = 0; u < UNROLL; u++)
                if (all || s0 + u * 32 + lane < bk.n) {
                    add(x[0][u]);
                    if (PW == 1) sum += term((u64)x[0][u], (u64)(word0 + s0 + u * 32 + lane));
                }
            to_bytes();
            if (++r == 255 / UNROLL) {
                to_fields();
                r = 0;
            }
        });
        if (PW > 1)  // a block at an odd offset of memory: its words read again, an element at a time
            for (int q = lane; q * PW < bk.n; q += 32) sum += term(run_word(po, q, bk.n), (u64)(word0 + q));
    }
    to_bytes();
    to_fields();
#pragma unroll
    for (int d = 16; d > 0; d >>= 1) {
#pragma unroll
        for (int i = 0; i < 4; i++) f[i] += __shfl_xor_sync(FULL, f[i], d);
        sum += __shfl_xor_sync(FULL, sum, d);
    }
    if (lane == 0) old_sums[pid] = (i64)sum;
    if (lane < NCP) {
        const int j = lane >> 1;  // byte j of the odd or even bytes
        const u64 g = (lane & 1) ? ((j & 1) ? f[3] : f[2]) : ((j & 1) ? f[1] : f[0]);
        counts[pid * NCP + lane] = (int)((g >> (16 * (j >> 1))) & 0xffff);
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

// Class planes: a lane keeps the classes of a run of at most 64 elements as LPLANES bit
// masks (bit i of plane b: bit b of element i's class), for up to 16 classes.
#if NCP <= 16
#define LPLANES (NCP > 8 ? 4 : NCP > 4 ? 3 : NCP > 2 ? 2 : NCP > 1 ? 1 : 0)

// Class c with its bit b at bit 8 * b.
__device__ __forceinline__ unsigned spread_class(unsigned c) { return (c * 0x204081u) & 0x01010101u; }

__device__ __forceinline__ u64 run_class(const u64 (&pl)[4], u64 valid, int c) {
    u64 m = valid;
#pragma unroll
    for (int b = 0; b < LPLANES; b++) m &= ((c >> b) & 1) ? pl[b] : ~pl[b];
    return m;
}

__device__ __forceinline__ int run_class_at(const u64 (&pl)[4], int i) {
    int c = 0;
#pragma unroll
    for (int b = 0; b < LPLANES; b++) c |= (int)((pl[b] >> i) & 1) << b;
    return c;
}

#endif

// The trainer's events: each event's class rank (its index among the chunk's elements of its
// class) at its event rank, and each changed element's residual at its slot, both grouped by
// chunk then class at the offsets eoff / roff ([chunks * NCP]); rbase / ebase are the
// blocks' class-rank and event-rank bases. A warp takes a block (EVENT_WARPS warps a CTA)
// and gives each lane a run of ERUN consecutive elements of each sub-block of 32 * ERUN:
// - the sub-block of both tensors is copied into shared memory with cp.async, 16 bytes a
//   lane, coalesced, while the sub-block before it is worked on (two buffers a warp); the
//   16-byte pieces are swizzled so that neither the copies nor a lane's reads of its run
//   meet in a bank;
// - each lane keeps its run's classes as bit planes (the class map in shared memory gives
//   each class with its bits a byte apart, so 8 elements' bits gather with one add each),
//   its changed elements and its events as bit masks, and writes each class's elements and
//   events in its run to shared memory; the lanes of the first NCP take a running prefix
//   over the 32 runs of a class each (and carry the class's bases to the next sub-block);
// - a lane then ranks only its events and changed elements: a popcount of the class's mask
//   below the element, past the prefix.
// No `__match_any_sync` and no shared tallies per element: with an element a lane they bound
// the kernel. The cp.async copies keep the next sub-block's loads in flight while a lane
// ranks, where synchronous staging would leave the warp waiting on them.
#if NCP <= 16
#ifndef EVENT_WARPS
#define EVENT_WARPS 2
#endif
#define ERUN (BITS == 64 ? 16 : BITS == 32 ? 32 : 64)  // a lane's run: 128 bytes (64 for 8-bit types)
#define EPC (128 / BITS)                                // elements of a 16-byte piece
#define CPL (ERUN / EPC)                                // pieces of a run (4 or 8)
#define SWZ ((CPL < 8 ? CPL : 8) - 1)

struct RunShared {                      // one warp's
    uint4 old_s[2][32 * CPL], new_s[2][32 * CPL];  // two sub-blocks' pieces, run after run, swizzled
    unsigned lut[LUT_SHARED ? NK : 1];  // the class map, each class's bits a byte apart
    unsigned pre[32 * (NCP + 1)];       // per lane and class: elements | events << 16 (then their prefix)
    int rank0[NCP], event0[NCP];        // the class's rank and event rank at the sub-block's start
    i64 eo[NCP], ro[NCP];               // the class's first event slot and residual slot of the chunk
};

// Where element i of run L lies in a sub-block staged in shared memory (in elements).
__device__ __forceinline__ int staged(int L, int i) {
    return L * ERUN + (((i / EPC) ^ (L & SWZ)) * EPC) + i % EPC;
}

// A 16-byte copy from global to shared memory, its commit group and the wait for all but the
// latest group: cp.async from compute capability 8.0 on, a load and a store before it.
#if __CUDA_ARCH__ >= 800
__device__ __forceinline__ void copy16_async(void* smem, const void* gmem) {
    const unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem));
}
__device__ __forceinline__ void copies_commit() { asm volatile("cp.async.commit_group;\n" ::); }
__device__ __forceinline__ void copies_wait_but_last() { asm volatile("cp.async.wait_group 1;\n" ::); }
#else
__device__ __forceinline__ void copy16_async(void* smem, const void* gmem) {
    *(uint4*)smem = __ldcs((const uint4*)gmem);
}
__device__ __forceinline__ void copies_commit() {}
__device__ __forceinline__ void copies_wait_but_last() {}
#endif

extern "C" __global__ void __launch_bounds__(EVENT_WARPS * 32)
class_events(const EventParams prm) {
    const U* old = prm.old;
    const i64* rows = prm.rows;
    const int* prog = prm.prog;
    const U* nw = prm.nw;
    const i64* new_off = prm.new_off;
    const unsigned char* lut = prm.lut;
    const signed char* inv_tab = prm.inv_tab;
    const int* rbase = prm.rbase;
    const int* ebase = prm.ebase;
    const i64* eoff = prm.eoff;
    const i64* roff = prm.roff;
    int* ranks_out = prm.ranks_out;
    U* res_out = prm.res_out;
    const i64 programs = prm.programs;
    __shared__ RunShared shared[EVENT_WARPS];
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    const i64 pid = (i64)blockIdx.x * EVENT_WARPS + w;
    if (pid >= programs) return;
    RunShared& sh = shared[w];
    const Block bk = table_block(pid, rows, prog);
    const U* po = old + bk.off + bk.first;
    const U* pn = nw + new_off[bk.chunk] + bk.first;
#if LUT_SHARED
    for (int k = lane; k < NK; k += 32) sh.lut[k] = spread_class(lut[bk.tensor * NK + k]);
#endif
    const unsigned inv = __ballot_sync(FULL, lane < NCP && inv_tab[bk.tensor * NCP + lane]);
    int rank0 = 0, event0 = 0;  // lane c < NCP: class c's running bases
    if (lane < NCP) {
        rank0 = rbase[pid * NCP + lane];
        event0 = ebase[pid * NCP + lane];
        sh.eo[lane] = eoff[bk.chunk * NCP + lane];
        sh.ro[lane] = roff[bk.chunk * NCP + lane];
    }
    const bool aligned = (((unsigned long long)po | (unsigned long long)pn) & 15ull) == 0;
    unsigned* pre = sh.pre + lane * (NCP + 1);
    // whether sub-block s0 is copied with cp.async (whole and 16-byte aligned), and starting
    // its copy (a commit group, empty where it is not); other sub-blocks (a block's last, or
    // a tensor at an odd offset) are copied an element at a time when their turn comes
    auto whole = [&](int s0) { return aligned && s0 + 32 * ERUN <= bk.n; };
    auto start = [&](int s0, int buf) {
        if (whole(s0)) {
            const uint4* go = (const uint4*)(po + s0);
            const uint4* gn = (const uint4*)(pn + s0);
#pragma unroll
            for (int q = 0; q < CPL; q++) {
                const int g = q * 32 + lane, L = g / CPL, j = g % CPL;
                copy16_async(&sh.old_s[buf][L * CPL + (j ^ (L & SWZ))], go + g);
                copy16_async(&sh.new_s[buf][L * CPL + (j ^ (L & SWZ))], gn + g);
            }
        }
        copies_commit();
    };
    start(0, 0);
    for (int s0 = 0, buf = 0; s0 < bk.n; s0 += 32 * ERUN, buf ^= 1) {
        const int n_sub = min(bk.n - s0, 32 * ERUN);
        __syncwarp();  // every lane is done with the other buffer
        if (s0 + 32 * ERUN < bk.n) start(s0 + 32 * ERUN, buf ^ 1);
        else copies_commit();
        copies_wait_but_last();
        U* so = (U*)sh.old_s[buf];
        U* sn = (U*)sh.new_s[buf];
        if (!whole(s0)) {
            for (int e = lane; e < 32 * ERUN; e += 32) {
                const bool in = e < n_sub;
                so[staged(e / ERUN, e % ERUN)] = in ? po[s0 + e] : (U)0;
                sn[staged(e / ERUN, e % ERUN)] = in ? pn[s0 + e] : (U)0;
            }
        }
        __syncwarp();
        // the run's classes as planes, and its changed elements
        const int left = n_sub - lane * ERUN;
        const u64 full = ERUN == 64 ? ~0ull : (1ull << ERUN) - 1ull;
        const u64 valid = left >= ERUN ? full : left <= 0 ? 0ull : (1ull << left) - 1ull;
        u64 pl[4] = {0ull, 0ull, 0ull, 0ull}, chg = 0ull;
        unsigned acc = 0;  // the current 8 elements' classes, bit b of element j at bit 8 * b + j
        auto take = [&](u64 wo, u64 wn, int wi) {
            const u64 d = wo ^ wn;
#pragma unroll
            for (int k = 0; k < PW; k++) {
                const int i = wi * PW + k;
                const int key = (int)((wo >> (k * BITS + MANT)) & KMASK);
#if LUT_SHARED
                acc += sh.lut[key] << (i & 7);
#else
                acc += spread_class(lut[bk.tensor * NK + key]) << (i & 7);
#endif
                if ((d >> (k * BITS)) & WMASK) chg |= 1ull << i;
                if ((i & 7) == 7) {
#pragma unroll
                    for (int b = 0; b < LPLANES; b++) pl[b] |= (u64)((acc >> (8 * b)) & 0xffu) << (i & ~7);
                    acc = 0;
                }
            }
        };
#pragma unroll
        for (int j = 0; j < CPL; j++) {
            const uint4 a = sh.old_s[buf][lane * CPL + (j ^ (lane & SWZ))];
            const uint4 b = sh.new_s[buf][lane * CPL + (j ^ (lane & SWZ))];
            take((u64)a.y << 32 | a.x, (u64)b.y << 32 | b.x, 2 * j);
            take((u64)a.w << 32 | a.z, (u64)b.w << 32 | b.z, 2 * j + 1);
        }
        u64 inv_m = 0ull;  // the run's elements of inverted classes
        for (unsigned t = inv; t; t &= t - 1) inv_m |= run_class(pl, valid, __ffs(t) - 1);
        const u64 evm = (chg & ~inv_m) | (inv_m & ~chg);  // the events
        // each class's elements and events in the run; then per class a prefix over the runs
#pragma unroll
        for (int c = 0; c < NCP; c++) {
            const u64 m = run_class(pl, valid, c);
            pre[c] = (unsigned)__popcll(m) | (unsigned)__popcll(m & evm) << 16;
        }
        __syncwarp();
        if (lane < NCP) {
            unsigned run = 0;
#pragma unroll 8
            for (int L = 0; L < 32; L++) {
                const unsigned v = sh.pre[L * (NCP + 1) + lane];
                sh.pre[L * (NCP + 1) + lane] = run;
                run += v;
            }
            sh.rank0[lane] = rank0;
            sh.event0[lane] = event0;
            rank0 += (int)(run & 0xffffu);
            event0 += (int)(run >> 16);
        }
        __syncwarp();
        // the run's events and changed elements
        for (u64 t = evm | chg; t; t &= t - 1) {
            const int i = __ffsll(t) - 1;
            const int c = run_class_at(pl, i);
            const u64 before = run_class(pl, valid, c) & ((1ull << i) - 1ull);
            const unsigned p = pre[c];
            const int r = sh.rank0[c] + (int)(p & 0xffffu) + __popcll(before);
            const int e = sh.event0[c] + (int)(p >> 16) + __popcll(before & evm);
            if ((evm >> i) & 1) ranks_out[sh.eo[c] + e] = r;
            if ((chg >> i) & 1) {
                const int at = staged(lane, i);
                res_out[sh.ro[c] + (((inv >> c) & 1) ? r - e : e)] = (U)wrap(key((W)sn[at]) - key((W)so[at]));
            }
        }
    }
}
#endif

// The trainer's first pass over a chunk table of blocks of BLOCK elements, one CTA of
// SCAN_WARPS warps each, reading both tensors as 8-byte words (every chunk starts at an
// 8-byte boundary): per block, the histogram of context key + NK * changed over its elements
// ([programs, NB] int32) and the digest word sums of the old and new words ([programs, 2]).
// A round whose words all lie wholly inside the block skips the bounds checks.
// With at most 256 keys (SCAN_LANES) every lane counts its elements per key in counters of
// its own in shared memory, a word per key and lane (the two warps' counts in its halves:
// a lane has at most BLOCK / 64 elements), added to with an atomic whose result is not
// waited for; no two lanes of a warp touch one bank. The changed elements, a few in a
// hundred, take a shared atomic on their key's bin. The counters are summed per key at the
// block's end. Wider key sets (64-bit floats: too many keys for a word per key and lane)
// group each element's lanes with `__match_any_sync`, and the lowest lane of the group adds
// their count to a shared bin, which is slower: a match and an atomic per element.
#ifndef SCAN_LANES
#define SCAN_LANES (NK <= 256)
#endif
#ifndef SCAN_WARPS
#define SCAN_WARPS (SCAN_LANES ? 2 : WARPS)
#endif
static_assert(!SCAN_LANES || (SCAN_WARPS == 2 && BLOCK / 64 < 65536), "a lane's counts fit half a word");

extern "C" __global__ void __launch_bounds__(SCAN_WARPS * 32)
scan_words(const U* old, const i64* rows, const int* prog, const U* nw, const i64* new_off, int* hist, i64* sums,
           i64 programs) {
#if SCAN_LANES
    __shared__ unsigned counters[NK][32];  // per key and lane: warp 0's count, plus warp 1's << 16
    __shared__ int moved[NK];              // changed elements per key
#else
    __shared__ int bins[NB];
#endif
    __shared__ u64 part[2][SCAN_WARPS];
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    const i64 pid = blockIdx.x;
    const Block bk = table_block(pid, rows, prog);
#if SCAN_LANES
    for (int i = threadIdx.x; i < NK * 32; i += SCAN_WARPS * 32) (&counters[0][0])[i] = 0u;
    for (int i = threadIdx.x; i < NK; i += SCAN_WARPS * 32) moved[i] = 0;
    const unsigned one = 1u << (16 * w);
#else
    for (int i = threadIdx.x; i < NB; i += SCAN_WARPS * 32) bins[i] = 0;
    const unsigned below = lanes_below();
#endif
    __syncthreads();
    const u64* wo = (const u64*)(old + bk.off + bk.first);
    const u64* wn = (const u64*)(nw + new_off[bk.chunk] + bk.first);
    const int words = (bk.n + PW - 1) / PW;
    const i64 j0 = (bk.start + bk.first) / PW;
    u64 s_old = 0, s_new = 0;
    const int full_words = bk.n / PW;  // words wholly inside the block
    // One word's elements; `full`: every word of the round lies wholly inside the block.
    auto word = [&](u64 a, u64 b, int q, bool full) __attribute__((always_inline)) {
        const int inside = full ? PW : (q < words ? min(bk.n - q * PW, PW) : 0);
        const u64 keep = inside == PW ? ~0ull : (1ull << (inside * BITS)) - 1ull;
        const u64 o = a & keep, d = (a ^ b) & keep;
        if (inside > 0) {
            s_old += term(o, (u64)(j0 + q));
            s_new += term(o ^ d, (u64)(j0 + q));
        }
#pragma unroll
        for (int e = 0; e < PW; e++) {
            const bool v = e < inside;
            const int k = (int)((o >> (e * BITS + MANT)) & KMASK);
#if SCAN_LANES
            if (v) {
                atomicAdd(&counters[k][lane], one);
                if ((d >> (e * BITS)) & WMASK) atomicAdd(&moved[k], 1);
            }
#else
            const int bin = k + (((d >> (e * BITS)) & WMASK) ? NK : 0);
            const unsigned peers = peers_of(bin, v);
            if (v && (peers & below) == 0) atomicAdd(&bins[bin], __popc(peers));
#endif
        }
    };
    // a round's words: the next round's are loaded before this one's are worked on
    u64 a[UNROLL], b[UNROLL], next_a[UNROLL], next_b[UNROLL];
    auto load = [&](u64 (&x)[UNROLL], u64 (&y)[UNROLL], int q0) __attribute__((always_inline)) {
#pragma unroll
        for (int u = 0; u < UNROLL; u++) {
            const int q = q0 + (u * SCAN_WARPS + w) * 32 + lane;
            x[u] = q < words ? __ldcs(wo + q) : 0ull;
            y[u] = q < words ? __ldcs(wn + q) : 0ull;
        }
    };
    load(a, b, 0);
    for (int q0 = 0; q0 < words; q0 += SCAN_WARPS * 32 * UNROLL) {
        load(next_a, next_b, q0 + SCAN_WARPS * 32 * UNROLL);
        if (q0 + SCAN_WARPS * 32 * UNROLL <= full_words) {
#pragma unroll
            for (int u = 0; u < UNROLL; u++) word(a[u], b[u], q0 + (u * SCAN_WARPS + w) * 32 + lane, true);
        } else {
#pragma unroll
            for (int u = 0; u < UNROLL; u++) word(a[u], b[u], q0 + (u * SCAN_WARPS + w) * 32 + lane, false);
        }
#pragma unroll
        for (int u = 0; u < UNROLL; u++) {
            a[u] = next_a[u];
            b[u] = next_b[u];
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
#if SCAN_LANES
    for (int k = threadIdx.x; k < NK; k += SCAN_WARPS * 32) {
        unsigned both = 0;  // at most BLOCK in each half
#pragma unroll 8
        for (int i = 0; i < 32; i++) both += counters[k][(i + k) & 31];  // the lanes of a warp read 32 banks
        const int m = moved[k];
        hist[pid * NB + k] = (int)((both & 0xffffu) + (both >> 16)) - m;
        hist[pid * NB + NK + k] = m;
    }
    for (int i = 2 * NK + threadIdx.x; i < NB; i += SCAN_WARPS * 32) hist[pid * NB + i] = 0;
#else
    for (int i = threadIdx.x; i < NB; i += SCAN_WARPS * 32) hist[pid * NB + i] = bins[i];
#endif
    if (threadIdx.x < 2) {
        u64 t = 0;
        for (int k = 0; k < SCAN_WARPS; k++) t += part[threadIdx.x][k];
        sums[pid * 2 + threadIdx.x] = (i64)t;
    }
}

// The sampler's placement: the changes of a chunk table's blocks (a warp each), each
// block's in position order from starts[pid] (its first output): pos (offset in the chunk),
// val (new bits); and per block the digest word sums of its old and of its patched words
// (sums[pid * 2 + {0, 1}]: the old from class_counts' old_sums, the patched from them and
// the changed words). A changed element is an event of its class, or a non-event of an
// inverted class; its residual slot is the events (or the non-events) of its class's segment
// before it. Slots outside [0, n_res) (corrupt streams, refused by the caller) are neither
// read nor written. seg_word: first word of each chunk-class segment of the event bitmap;
// pref: set bits before each bitmap word; counts, base: each block's class counts and
// class-rank bases.
//
// A lane per run of RUN = BLOCK / 32 consecutive elements. A lane reads its run with 16-byte
// loads and keeps, in registers, its elements' classes as LPLANES bit masks (bit i of plane
// b: bit b of element i's class; the class map gives each class with its bits a byte apart,
// so 8 elements' bits gather with one multiply-add each). Then the first class rank of every
// class in every lane's run, all classes in one warp scan (a class's elements are an AND of
// the planes or their complements, fixed per class at compile time; two 16-bit counts an
// int). Then the block's event bits: the bitmap words of the classes with changes, end to
// end, a word a lane; lanes queue their words' events in shared memory, and the warp maps
// them to elements an entry a lane (the element's lane by a binary search of the class's
// first ranks, then a select by popcounts). Last the block's changes are written in position
// order, a change a lane (change t: the owner lane's, found by a binary search of the lanes'
// change counts before them, then a select in its changed elements), each lane reading the
// owner's planes and first class ranks from shared memory; the last lane of each 8-byte
// word's changes adds the word's digest terms, and a word that goes on past lane 31 is
// carried into the next round.
// Why this shape: ranking every element on its own (__match_any_sync and a shared counter per
// class) issues more instructions than working per class and per change; events are few and
// uneven over the lanes and words, so a lane selecting its own events would leave most lanes
// idle, hence the queue; a lane's changes are few and uneven too, so each lane writing its
// own would take several rounds a block for a change or two a lane, hence a change a lane.
// The queue's picks are ORed into the owner's 64-bit event mask as 32-bit atomics, which
// compile to one shared-memory OR where a 64-bit one is a compare-and-swap loop. One scan
// ranks all classes at once, and the event words are read a word a lane, end to end, rather
// than each lane reading a window of each class's bits.
// Compiled for the stage's blocks (a lane has at most 64 elements) and up to 16 classes.
#if (BLOCK == 1024 || BLOCK == 2048) && NCP <= 16
#define RUN (BLOCK / 32)
#define QCAP 64  // queue entries of a warp

struct LaneShared {      // one warp's
    unsigned lut[LUT_SHARED ? NK : 1];  // the class map, each class's bits a byte apart
    i64 bit0[NCP];       // bitmap bit of each class's first rank in the block
    i64 ro[NCP];         // the class's first residual slot of the chunk
    int seg_before[NCP]; // set bits before the class's segment
    int rank0[NCP];      // class rank of the class's first element in the block
    int cnt[NCP];        // the class's elements in the block
    int woff[NCP];       // the class's first word among the block's event words
    unsigned short first[NCP][32];  // each lane's first class rank of each class
    u64 pl[LPLANES > 0 ? LPLANES : 1][32];  // each lane's class planes
    unsigned q[QCAP];    // the queue of events: class << 16 | class rank
    u64 evm[32];         // each lane's event elements, then its changed elements
    int before[32];      // the changes of the lanes before each
};

// Inclusive prefix sums of each x[i] over the lanes, in place, N in one pass of shuffles.
template <int N, class T>
__device__ __forceinline__ void lanes_inclusive(T (&x)[N], int lane) {
#pragma unroll
    for (int d = 1; d < 32; d <<= 1)
#pragma unroll
        for (int i = 0; i < N; i++) {
            const T y = __shfl_up_sync(FULL, x[i], d);
            if (lane >= d) x[i] += y;
        }
}

// Exclusive prefix sum of v over the lanes; `total` gets the sum of all.
__device__ __forceinline__ int lanes_exclusive(int v, int lane, int& total) {
    int x[1] = {v};
    lanes_inclusive(x, lane);
    total = __shfl_sync(FULL, x[0], 31);
    return x[0] - v;
}

// The last i < N (a power of 2) with a[i] <= v, for a non-decreasing a with a[0] <= v.
template <int N, class T>
__device__ __forceinline__ int last_at_most(const T* a, int v) {
    int i = 0;
#pragma unroll
    for (int step = N / 2; step > 0; step >>= 1)
        if (a[i + step] <= v) i += step;
    return i;
}

// Lane o's class planes, from shared memory.
__device__ __forceinline__ void planes_of(const LaneShared& sh, int o, u64 (&pl)[4]) {
#pragma unroll
    for (int b = 0; b < LPLANES; b++) pl[b] = sh.pl[b][o];
}

// The position of set bit number q (from 0) of m; q < popc(m).
__device__ __forceinline__ int select_bit(unsigned m, int q) {
    int p = 0;
#pragma unroll
    for (int width = 16; width > 0; width >>= 1) {
        const int n = __popc(m & ((1u << width) - 1u));
        if (q >= n) {
            q -= n;
            m >>= width;
            p += width;
        }
    }
    return p;
}

// select_bit of a 64-bit m.
__device__ __forceinline__ int select_bit64(u64 m, int q) {
    const int n = __popc((unsigned)m);
    const bool hi = q >= n;
    return (hi ? 32 : 0) + select_bit(hi ? (unsigned)(m >> 32) : (unsigned)m, hi ? q - n : q);
}

// Set bits of the bitmap before bit x (through it when `through`).
__device__ __forceinline__ int bits_before(const int* bitmap, const int* pref, i64 x, bool through) {
    const unsigned word = (unsigned)bitmap[x >> 5];
    const int bit = (int)(x & 31);
    const unsigned low = through ? (bit == 31 ? FULL : (2u << bit) - 1u) : (1u << bit) - 1u;
    return pref[x >> 5] + __popc(word & low);
}

extern "C" __global__ void __launch_bounds__(WARPS * 32)
place_lanes(const PlaceParams prm) {
    const U* old = prm.old;
    const i64* rows = prm.rows;
    const int* prog = prm.prog;
    const unsigned char* lut = prm.lut;
    const signed char* inv_tab = prm.inv_tab;
    const int* counts = prm.counts;
    const int* base = prm.base;
    const i64* seg_word = prm.seg_word;
    const int* bitmap = prm.bitmap;
    const int* pref = prm.pref;
    const i64* roff = prm.roff;
    const i64* res = prm.res;
    const i64* starts = prm.starts;
    const i64* old_sums = prm.old_sums;
    int* pos = prm.pos;
    U* val = prm.val;
    i64* sums = prm.sums;
    const i64 n_words = prm.n_words;
    const i64 n_res = prm.n_res;
    const i64 programs = prm.programs;
    __shared__ LaneShared shared[WARPS];
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    const i64 pid = (i64)blockIdx.x * WARPS + w;
    if (pid >= programs) return;
    LaneShared& sh = shared[w];
    sh.evm[lane] = 0ull;
    const Block bk = table_block(pid, rows, prog);
    const U* po = old + bk.off + bk.first;
    const U* run = po + lane * RUN;
    const int left = bk.n - lane * RUN;  // this lane's elements in the block, if < RUN
    const u64 valid = left >= RUN ? (RUN == 64 ? ~0ull : (1ull << RUN) - 1ull) : left <= 0 ? 0ull : (1ull << left) - 1ull;
    const unsigned* lt32 = sh.lut;
#if LUT_SHARED
    // the class map's loads are held in registers while the per-class values are read, and
    // stored after them, so the loads overlap rather than each store waiting for its load
    unsigned char lv[(NK + 31) / 32];
#pragma unroll
    for (int i = 0; i < (NK + 31) / 32; i++) lv[i] = lane + 32 * i < NK ? lut[bk.tensor * NK + lane + 32 * i] : 0;
#endif
    const unsigned inv = __ballot_sync(FULL, lane < NCP && inv_tab[bk.tensor * NCP + lane]);
    bool changes = false;
    int ev_words = 0;  // lane c < NCP: the bitmap words of class c's event bits in the block, if it has changes
    if (lane < NCP) {
        const i64 at = pid * NCP + lane, seg = seg_word[bk.chunk * NCP + lane];
        const int cnt = counts[at], r0 = base[at];
        const i64 b0 = seg * 32 + r0;
        sh.bit0[lane] = b0;
        sh.rank0[lane] = r0;
        sh.cnt[lane] = cnt;
        sh.ro[lane] = roff[bk.chunk * NCP + lane];
        sh.seg_before[lane] = seg < n_words ? pref[seg] : 0;
        if (cnt > 0) {
            const int ones = bits_before(bitmap, pref, b0 + cnt - 1, true) - bits_before(bitmap, pref, b0, false);
            changes = ((inv >> lane) & 1) ? ones < cnt : ones > 0;
            if (changes && ones > 0) ev_words = (int)(((b0 + cnt - 1) >> 5) - (b0 >> 5)) + 1;
        }
    }
#if LUT_SHARED
#pragma unroll
    for (int i = 0; i < (NK + 31) / 32; i++)
        if (lane + 32 * i < NK) sh.lut[lane + 32 * i] = spread_class(lv[i]);
#endif
    __syncwarp();
    // the run's classes as planes
    u64 pl[4] = {0ull, 0ull, 0ull, 0ull};
    unsigned acc = 0;  // the current 8 elements' classes, bit b of element j at bit 8 * b + j
    auto take = [&](u64 word, int wi) {
#pragma unroll
        for (int k = 0; k < PW; k++) {
            const int i = wi * PW + k;
            const int key = (int)((word >> (k * BITS + MANT)) & KMASK);
#if LUT_SHARED
            acc += lt32[key] << (i & 7);
#else
            acc += spread_class(lut[bk.tensor * NK + key]) << (i & 7);
#endif
            if ((i & 7) == 7) {
#pragma unroll
                for (int b = 0; b < LPLANES; b++) pl[b] |= (u64)((acc >> (8 * b)) & 0xffu) << (i & ~7);
                acc = 0;
            }
        }
    };
    constexpr int WORDS = RUN / PW;
    const bool fast = left >= RUN && ((unsigned long long)run & 15ull) == 0;  // whole, 16-byte aligned
    if (fast) {
        // through L1, not streaming loads: a 32-byte sector's second half is read by the next
        // load
        const uint4* v = (const uint4*)run;
#pragma unroll
        for (int v0 = 0; v0 < WORDS / 2; v0 += 4) {
            uint4 a[4];
#pragma unroll
            for (int u = 0; u < 4; u++)
                if (v0 + u < WORDS / 2) a[u] = __ldg(v + v0 + u);
#pragma unroll
            for (int u = 0; u < 4; u++)
                if (v0 + u < WORDS / 2) {
                    take((u64)a[u].y << 32 | a[u].x, 2 * (v0 + u));
                    take((u64)a[u].w << 32 | a[u].z, 2 * (v0 + u) + 1);
                }
        }
    } else {
        for (int wi = 0; wi < WORDS; wi++) take(run_word(run, wi, left), wi);
    }
    // each class's first class rank in each lane's run, all classes at once: a class's
    // elements are an AND of the planes or their complements, and the lanes' counts are
    // scanned two classes an int
    const unsigned inv_changes = __ballot_sync(FULL, changes) & inv;
    u64 inv_m = 0;  // the run's elements of inverted classes with changes (rare)
    if (inv_changes)
#pragma unroll
        for (int c = 0; c < NCP; c++)
            if ((inv_changes >> c) & 1) inv_m |= run_class(pl, valid, c);
    {
        unsigned k2[(NCP + 1) / 2], x[(NCP + 1) / 2];
#pragma unroll
        for (int c = 0; c < NCP; c++) {
            const unsigned k = (unsigned)__popcll(run_class(pl, valid, c));
            k2[c >> 1] = (c & 1) ? k2[c >> 1] | k << 16 : k;
        }
#pragma unroll
        for (int i = 0; i < (NCP + 1) / 2; i++) x[i] = k2[i];
        lanes_inclusive(x, lane);
#pragma unroll
        for (int c = 0; c < NCP; c++) sh.first[c][lane] = (unsigned short)((x[c >> 1] - k2[c >> 1]) >> (16 * (c & 1)));
    }
#pragma unroll
    for (int b = 0; b < LPLANES; b++) sh.pl[b][lane] = pl[b];
    // the block's events: the words of each class's event bits (a word a lane, the classes'
    // words end to end) are loaded, their events queued in shared memory, and the warp maps
    // the queued events to elements an entry a lane: the owner lane by a binary search of the
    // class's first ranks, then a select in its elements of the class (events are few and
    // uneven over the lanes: each lane fetching its own window of every class's bits left most
    // lanes idle)
    int n_ev_words;
    const int woff = lanes_exclusive(ev_words, lane, n_ev_words);
    if (lane < NCP) sh.woff[lane] = woff;
    int qn = 0;
    const unsigned below = lanes_below();
    auto flush = [&]() {
        __syncwarp();
        for (int t = lane; t < qn; t += 32) {
            const unsigned e = sh.q[t];
            const int c = (int)(e >> 16), r = (int)(e & 0xffffu);
            const int o = last_at_most<32>(sh.first[c], r);  // the owner
            u64 opl[4] = {0ull, 0ull, 0ull, 0ull};
            planes_of(sh, o, opl);
            const int b = select_bit64(run_class(opl, ~0ull, c), r - sh.first[c][o]);
            atomicOr((unsigned*)&sh.evm[o] + (b >> 5), 1u << (b & 31));
        }
        __syncwarp();
        qn = 0;
    };
    __syncwarp();
    for (int j0 = 0; j0 < n_ev_words; j0 += 32) {
        const int j = j0 + lane;
        unsigned bits = 0;  // the word's events
        int c = 0, r = 0;   // their class, and the class rank of the word's bit 0
        if (j < n_ev_words) {
            c = last_at_most<NCP>(sh.woff, j);  // the last class whose words start at or before j
            const i64 b0 = sh.bit0[c], gw = (b0 >> 5) + (j - sh.woff[c]);
            const int lo = (int)(b0 - gw * 32), hi = lo + sh.cnt[c];  // the class's bits of the word: [lo, hi)
            bits = (unsigned)bitmap[gw];
            if (lo > 0) bits &= ~0u << lo;
            if (hi < 32) bits &= (1u << hi) - 1u;
            r = -lo;
        }
        for (unsigned has; (has = __ballot_sync(FULL, bits != 0u));) {  // an event a lane a step
            if (qn + __popc(has) > QCAP) flush();
            if (bits) {
                sh.q[qn + __popc(has & below)] = (unsigned)c << 16 | (unsigned)(r + __ffs(bits) - 1);
                bits &= bits - 1u;
            }
            qn += __popc(has);
        }
    }
    flush();
    const u64 mv = sh.evm[lane] ^ inv_m;  // the changed elements: events, but non-events of inverted classes
    // The block's changes in position order, an output a lane: change t is the changed element
    // of its owner lane's run whose changes before it and the owner's before it make t. The
    // owner's planes, changes and first class ranks are in shared memory.
    int total;
    const int before = lanes_exclusive(__popcll(mv), lane, total);
    sh.evm[lane] = mv;
    sh.before[lane] = before;
    __syncwarp();
    const i64 at0 = starts[pid], wbase = (bk.start + bk.first) / PW;  // the block's first output and digest word
    const bool aligned = ((unsigned long long)po & 7ull) == 0;
    u64 delta = 0, carry_diff = 0, carry_was = 0;  // the digest sum's change; a word that goes on past lane 31
    int carry_word = -1;
    // the change of word w's digest term when its old bits `old` change by `diff`
    auto word_delta = [&](u64 old, u64 diff, int w) {
        return term(old ^ diff, (u64)(wbase + w)) - term(old, (u64)(wbase + w));
    };
    for (int t0 = 0; t0 < total; t0 += 32) {
        const int t = t0 + lane;
        int word = -1 - lane;  // the change's digest word in the block (lanes without one: a word of their own)
        u64 diff = 0, was = 0;  // its bits XOR the old, at their place in the word; the old word
        if (t < total) {
            const int o = last_at_most<32>(sh.before, t);  // the owner: the last lane with no more than t changes before it
            const int b = select_bit64(sh.evm[o], t - sh.before[o]), idx = o * RUN + b;
            u64 opl[4] = {0ull, 0ull, 0ull, 0ull};
            planes_of(sh, o, opl);
            const int c = run_class_at(opl, b);
            const int r = sh.first[c][o] + __popcll(run_class(opl, ~0ull, c) & ((1ull << b) - 1ull));
            const int ones = bits_before(bitmap, pref, sh.bit0[c] + r, false) - sh.seg_before[c];
            const i64 slot = sh.ro[c] + (((inv >> c) & 1) ? sh.rank0[c] + r - ones : ones);
            word = idx / PW;
            was = aligned && (word + 1) * PW <= bk.n ? __ldg((const unsigned long long*)po + word)
                                                    : run_word(po, word, bk.n);
            const int sh_bits = BITS * (idx % PW);
            const W ob = (W)((was >> sh_bits) & WMASK);
            const i64 at = at0 + t;
            if (slot >= 0 && slot < n_res && at < n_res) {
                const W nb = unkey(wrap(key(ob) + (W)res[slot]));
                pos[at] = (int)(bk.first + idx);
                val[at] = (U)nb;
                diff = (u64)(nb ^ ob) << sh_bits;
            }
        }
        // a word's changes are on consecutive lanes: the last of them gathers their bits and
        // adds the word's digest terms; one that goes on past lane 31 is carried to lane 0
        const int w0 = __shfl_sync(FULL, word, 0);
        if (carry_word >= 0 && w0 != carry_word && lane == 0)
            delta += word_delta(carry_was, carry_diff, carry_word);
        if (lane == 0 && carry_word >= 0 && w0 == carry_word) diff |= carry_diff;
#pragma unroll
        for (int d = 1; d < PW; d <<= 1) {
            const u64 y = __shfl_up_sync(FULL, diff, d);
            const int wy = __shfl_up_sync(FULL, word, d);
            if (lane >= d && wy == word) diff |= y;
        }
        const int next = __shfl_down_sync(FULL, word, 1);
        const bool goes_on = lane == 31 && t + 1 < total;
        carry_word = __shfl_sync(FULL, goes_on ? word : -1, 31);
        carry_diff = __shfl_sync(FULL, diff, 31);
        carry_was = __shfl_sync(FULL, was, 31);
        if (t < total && !goes_on && (lane == 31 || next != word) && diff)
            delta += word_delta(was, diff, word);
    }
#pragma unroll
    for (int d = 16; d > 0; d >>= 1) delta += __shfl_xor_sync(FULL, delta, d);
    if (lane == 0) {
        const i64 sum_old = old_sums[pid];  // class_counts'
        sums[pid * 2] = sum_old;
        sums[pid * 2 + 1] = (i64)((u64)sum_old + delta);
    }
}
#endif
