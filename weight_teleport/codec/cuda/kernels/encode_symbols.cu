// Symbol coding of sparse classes (codec/cuda/kernels/encode_symbols.py says what the four streams hold; the
// Triton kernel there is the reference, byte for byte), a warp per (chunk, class) segment
// walking its events 32 at a time:
// - segment_counts: each segment's extra bits, residual symbols and escapes ([segments, 3]
//   int64), from which the slots are laid out; the loads of AHEAD steps are issued at once;
// - segment_symbols: the four streams at the segment's slots ([segments, 4] int64 offsets).
//   The next step's loads are issued before a step is worked on. A lane's event symbol is
//   one byte store; the warp's extra bits (at most 22 a lane) are ORed into a few words in
//   shared memory and each whole word is stored once, the partial last word carried to the
//   next 32 events, so that no global word is written twice and no global atomic is
//   needed; residual symbols and escapes are placed by ballots.
//
// Compiled per element width with BITS. Residuals are stored in the elements' width (R) and
// read as unsigned; arithmetic on them is modulo 2^64, as the format's.

typedef long long i64;
typedef unsigned long long u64;
#if BITS == 8
typedef unsigned char R;
#elif BITS == 16
typedef unsigned short R;
#elif BITS == 32
typedef unsigned int R;
#else
typedef unsigned long long R;
#endif

#define FULL 0xffffffffu
#define RC 5
#define ESCAPE 255
#ifndef SEG_WARPS  // segments (a warp each) of a CTA, from encode_symbols.py, which launches with it
#error "compile with -DSEG_WARPS (codec/cuda/kernels/encode_symbols.py)"
#endif
#define WORDS 32  // a step's extra bits past a partial word: gaps are below 2^24 (chunks hold at
                  // most 2^22 elements), so at most 31 + 32 * 22 bits, 23 words
#if BITS == 64
#define WMASK (~0ull)
#else
#define WMASK ((1ull << BITS) - 1)
#endif

// +1 -> 0, -1 -> 1, +2 -> 2, ... of a nonzero residual r of BITS bits.
__device__ __forceinline__ u64 zigzag(u64 r) {
    return ((r >> (BITS - 1)) & 1) ? (WMASK - r) * 2 + 1 : (r - 1) * 2;
}

struct Segment {
    i64 n_ev, ev0, n_res, res0;
    bool inv;
};

__device__ __forceinline__ Segment segment(i64 s, const i64* ev_cnt, const i64* ev_start, const i64* res_cnt,
                                           const i64* res_start, const signed char* inv) {
    return {ev_cnt[s], ev_start[s], res_cnt[s], res_start[s], inv[s] != 0};
}

// One event's gap v = rank - previous rank (>= 1) as bucket, extra-bit count and extra bits.
struct Gap {
    unsigned bucket, extra;
    int ne;
};

__device__ __forceinline__ Gap gap(unsigned v) {
    const int top = 31 - __clz(v);
    const int ne = top > 1 ? top - 1 : 0;
    return {v == 1 ? 0u : 2u * top - 1 + ((v >> ne) & 1), v & ((1u << ne) - 1), ne};
}

// A residual's symbol (whether it has one, whether that escapes): in an inverted class every
// changed element has its zigzag code, else only those past the RC - 1 kept in the event symbol.
struct Residual {
    u64 sym;
    bool flag, esc;
};

__device__ __forceinline__ Residual residual(u64 r, bool inv) {
    const u64 zz = zigzag(r);
    const bool flag = inv || zz >= RC - 1;
    const u64 sym = inv ? zz : zz - (RC - 1);
    return {sym, flag, flag && sym >= ESCAPE};
}

__device__ __forceinline__ int warp_sum(int x) {
    for (int d = 16; d > 0; d >>= 1) x += __shfl_xor_sync(FULL, x, d);
    return x;
}

#define AHEAD 4  // 32-event steps whose loads segment_counts issues before using any

extern "C" __global__ void __launch_bounds__(SEG_WARPS * 32)
segment_counts(const int* ranks, const R* res, const i64* ev_cnt, const i64* ev_start, const i64* res_cnt,
               const i64* res_start, const signed char* inv, i64* counts, i64 n_seg) {
    const int lane = threadIdx.x & 31;
    const i64 s = (i64)blockIdx.x * SEG_WARPS + (threadIdx.x >> 5);
    if (s >= n_seg) return;
    const Segment g = segment(s, ev_cnt, ev_start, res_cnt, res_start, inv);
    int bits = 0, n_sym = 0, n_esc = 0;  // the lane's: a segment has at most 2^22 events of 22 bits
    int prev = -1;
    for (i64 t = 0; t < g.n_ev; t += 32 * AHEAD) {
        int r[AHEAD];
        for (int k = 0; k < AHEAD; k++) {
            const i64 j = t + 32 * k + lane;
            r[k] = j < g.n_ev ? ranks[g.ev0 + j] : 0;
        }
        for (int k = 0; k < AHEAD; k++) {
            int p = __shfl_up_sync(FULL, r[k], 1);
            p = lane ? p : prev;
            prev = __shfl_sync(FULL, r[k], 31);
            bits += t + 32 * k + lane < g.n_ev ? gap((unsigned)(r[k] - p)).ne : 0;
        }
    }
    for (i64 t = 0; t < g.n_res; t += 32 * AHEAD) {
        u64 r[AHEAD];
        for (int k = 0; k < AHEAD; k++) {
            const i64 j = t + 32 * k + lane;
            r[k] = j < g.n_res ? (u64)res[g.res0 + j] : 1;
        }
        for (int k = 0; k < AHEAD; k++) {
            const Residual z = residual(r[k], g.inv);
            const bool m = t + 32 * k + lane < g.n_res;
            n_sym += m && z.flag;
            n_esc += m && z.esc;
        }
    }
    bits = warp_sum(bits);
    n_sym = warp_sum(n_sym);
    n_esc = warp_sum(n_esc);
    if (lane == 0) {
        counts[s * 3] = bits;
        counts[s * 3 + 1] = n_sym;
        counts[s * 3 + 2] = n_esc;
    }
}

// Residual symbols and escapes of the residuals j = t + lane < n_res (r: the lane's).
__device__ __forceinline__ void put_residuals(unsigned char* buf, i64 rsym_at, i64 esc_at, u64 r, bool m, bool inv,
                                              i64& n_sym, i64& n_esc, int lane) {
    const Residual z = residual(r, inv);
    const unsigned fb = __ballot_sync(FULL, m && z.flag), eb = __ballot_sync(FULL, m && z.esc);
    const unsigned below = (1u << lane) - 1;
    if (m && z.flag) buf[rsym_at + n_sym + __popc(fb & below)] = z.esc ? ESCAPE : (unsigned char)z.sym;
    if (m && z.esc) {
        const i64 at = esc_at + (n_esc + __popc(eb & below)) * (BITS / 8);
        for (int b = 0; b < BITS / 8; b++) buf[at + b] = (unsigned char)(r >> (8 * b));
    }
    n_sym += __popc(fb);
    n_esc += __popc(eb);
}

extern "C" __global__ void __launch_bounds__(SEG_WARPS * 32)
segment_symbols(const int* ranks, const R* res, const i64* ev_cnt, const i64* ev_start, const i64* res_cnt,
                const i64* res_start, const signed char* inv, const i64* off, unsigned char* buf, i64 n_seg) {
    __shared__ unsigned staged[SEG_WARPS][WORDS];
    const int lane = threadIdx.x & 31;
    const i64 s = (i64)blockIdx.x * SEG_WARPS + (threadIdx.x >> 5);
    if (s >= n_seg) return;
    const Segment g = segment(s, ev_cnt, ev_start, res_cnt, res_start, inv);
    const i64 sym_at = off[s * 4], rsym_at = off[s * 4 + 2], esc_at = off[s * 4 + 3];
    unsigned* words = (unsigned*)(buf + off[s * 4 + 1]);  // slots are 16-byte aligned
    unsigned* sw = staged[threadIdx.x >> 5];
    sw[lane] = 0;
    __syncwarp();
    i64 bits = 0, n_sym = 0, n_esc = 0;
    int prev = -1;
    // streams 1 and 2 (and, in a class that is not inverted, 3 and 4: one residual an event)
    bool m = lane < g.n_ev;
    int r = m ? ranks[g.ev0 + lane] : 0;
    u64 rv = m && !g.inv ? (u64)res[g.res0 + lane] : 1;
    for (i64 t = 0; t < g.n_ev; t += 32) {
        const bool m_next = t + 32 + lane < g.n_ev;
        const int r_next = m_next ? ranks[g.ev0 + t + 32 + lane] : 0;
        const u64 rv_next = m_next && !g.inv ? (u64)res[g.res0 + t + 32 + lane] : 1;
        int p = __shfl_up_sync(FULL, r, 1);
        p = lane ? p : prev;
        prev = __shfl_sync(FULL, r, 31);
        const Gap e = gap(m ? (unsigned)(r - p) : 1u);
        const u64 zz = zigzag(rv);
        const unsigned rc = g.inv ? 0 : zz >= RC - 1 ? RC - 1 : (unsigned)zz;
        if (m) buf[sym_at + t + lane] = (unsigned char)(e.bucket * RC + rc);
        int incl = e.ne;  // the warp's inclusive prefix of extra-bit counts
        for (int d = 1; d < 32; d <<= 1) {
            const int x = __shfl_up_sync(FULL, incl, d);
            incl += lane >= d ? x : 0;
        }
        const int at = (int)(bits & 31) + incl - e.ne, total = __shfl_sync(FULL, incl, 31);
        if (e.ne) {
            atomicOr(&sw[at >> 5], e.extra << (at & 31));
            if ((at & 31) + e.ne > 32) atomicOr(&sw[(at >> 5) + 1], e.extra >> (32 - (at & 31)));
        }
        __syncwarp();
        const int whole = (int)(((bits + total) >> 5) - (bits >> 5));
        if (lane < whole) words[(bits >> 5) + lane] = sw[lane];
        const unsigned carry = sw[whole];
        __syncwarp();
        sw[lane] = lane ? 0 : carry;
        __syncwarp();
        bits += total;
        if (!g.inv) put_residuals(buf, rsym_at, esc_at, rv, m, false, n_sym, n_esc, lane);
        m = m_next;
        r = r_next;
        rv = rv_next;
    }
    if (lane == 0 && (bits & 31)) words[bits >> 5] = sw[0];
    if (!g.inv) return;
    for (i64 t = 0; t < g.n_res; t += 32) {  // an inverted class's residuals
        const bool mr = t + lane < g.n_res;
        put_residuals(buf, rsym_at, esc_at, mr ? (u64)res[g.res0 + t + lane] : 1, mr, true, n_sym, n_esc,
                      lane);
    }
}
