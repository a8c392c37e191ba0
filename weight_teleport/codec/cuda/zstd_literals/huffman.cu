// Zstandard frames of Huffman-coded literals (codec/cuda/zstd_literals/reference.py is the reference, byte
// for byte, and says why), written on the GPU in two launches over blocks of at most 128 KiB
// of streams:
// - huf_plan, a warp per block (PLAN_WARPS warps a CTA): the histograms of the block's four
//   quarters, its code lengths (the reference's construction, run by one lane), canonical
//   codes, its tree description (direct or FSE-compressed weights) and what the block will be
//   (raw, RLE or compressed) with the sizes of its parts ([blocks, 8] int32: kind, content
//   bytes, four stream bytes, tree description bytes, longest code; zeros for an empty block).
//   Its serial steps wait on memory, so the small CTAs keep many blocks resident on an SM.
//   The frames are laid out from the sizes on the device.
// - huf_write, a CTA per block: its frame header (first block of a stream), block header and
//   content at its offset (none: the block's stream is stored raw). Threads of a quarter take
//   runs of its literals; a run's first bit is the sum of the code lengths of the runs after
//   it (a backward stream), and its bits go out a 32-bit word at a time with atomicOr, like
//   every other byte, into a zeroed buffer.

typedef long long i64;
typedef unsigned long long u64;

// WRITE_THREADS (huf_write's threads) and PLAN_WARPS (huf_plan's warps a CTA, a block each)
// come from gpu_writer.py, which launches the kernels with them.
#if !defined(WRITE_THREADS) || !defined(PLAN_WARPS)
#error "compile with -DWRITE_THREADS and -DPLAN_WARPS (codec/cuda/zstd_literals/gpu_writer.py)"
#endif
#define MAX_BITS 11
#define MAX_SYMBOL 128
#define ONE_STREAM_BELOW 1024
#define RAW 0
#define RLE 1
#define COMPRESSED 2
#define TREE_MAX 128     // a tree description's bytes: the FSE form is used below 128
#define NODES 511        // nodes of a Huffman tree of up to 256 symbols
#define WEIGHT_LOG 6     // accuracy log of the FSE table of compressed weights
#define HIST_ROW 264     // huf_plan's histogram of a quarter: 256 counts and 8 words (the rows 8 banks apart)
#define FULL 0xffffffffu

__device__ __forceinline__ void put_byte(unsigned* out, i64 at, unsigned v) {
    atomicOr(out + (at >> 2), (v & 0xffu) << ((at & 3) * 8));
}

__device__ __forceinline__ void put_le(unsigned* out, i64 at, u64 v, int n) {
    for (int k = 0; k < n; k++) put_byte(out, at + k, (unsigned)(v >> (8 * k)));
}

// A warp's sum and maximum (__reduce_*_sync from compute capability 8.0 on, shuffles before).
__device__ __forceinline__ unsigned warp_sum(unsigned x) {
#if __CUDA_ARCH__ >= 800
    return __reduce_add_sync(FULL, x);
#else
    for (int d = 16; d > 0; d >>= 1) x += __shfl_xor_sync(FULL, x, d);
    return x;
#endif
}

__device__ __forceinline__ int warp_max(int x) {
#if __CUDA_ARCH__ >= 800
    return __reduce_max_sync(FULL, x);
#else
    for (int d = 16; d > 0; d >>= 1) x = max(x, __shfl_xor_sync(FULL, x, d));
    return x;
#endif
}

__device__ __forceinline__ int quarter_of(int n) { return n < ONE_STREAM_BELOW ? n : (n + 3) / 4; }

// HOST-TESTED BEGIN: Bits, describe(), code_lengths() and what they call compile for the host
// too (tests/codec/test_huffman_frames.py holds them to the reference without a GPU).

// Little-endian bits into bytes, as zstd's bit streams take them.
struct Bits {
    unsigned char* out;
    int n, cap;
    u64 acc;
    int nacc;
    __device__ void add(u64 v, int k) {
        acc |= (v & ((1ull << k) - 1)) << nacc;
        nacc += k;
        while (nacc >= 8) {
            if (n < cap) out[n] = (unsigned char)acc;
            n++;
            acc >>= 8;
            nacc -= 8;
        }
    }
    __device__ void close() {  // to a whole byte
        if (nacc > 0) add(0, 8 - nacc);
    }
};

__device__ __forceinline__ int weight(const unsigned char* L, int top, int k) { return L[k] ? top + 1 - L[k] : 0; }

// Byte 1 + k / 2 of the direct weights (k even): symbol k's weight, then k + 1's (0 at `last`).
__device__ __forceinline__ unsigned char direct_pair(const unsigned char* L, int last, int top, int k) {
    return (unsigned char)(weight(L, top, k) << 4 | (k + 1 < last ? weight(L, top, k + 1) : 0));
}

// The weight values' counts scaled to 2^WEIGHT_LOG into norm[] (codec/cuda/zstd_literals/reference.py
// `_normalized`); the values present (below 2: no FSE form, norm[] not set).
__device__ int normalize(const int* count, int last, int* norm) {
    const int size = 1 << WEIGHT_LOG;
    int present = 0, share[MAX_BITS + 1];
    for (int v = 0; v <= MAX_BITS; v++) present += count[v] > 0;
    if (present < 2) return present;
    const int rest = size - present;
    int left = rest;
    for (int v = 0; v <= MAX_BITS; v++) {
        share[v] = count[v] * rest;
        norm[v] = (count[v] > 0) + share[v] / last;
        left -= share[v] / last;
        share[v] = count[v] ? share[v] % last : -1;
    }
    for (; left > 0; left--) {  // largest remainders first, ties to the smaller value
        int best = 0;
        for (int v = 1; v <= MAX_BITS; v++)
            if (share[v] > share[best]) best = v;
        norm[best]++;
        share[best] = -1;
    }
    return present;
}

// The FSE table description of norm[] into `head`, closed: accuracy log - 5, then each value's
// count + 1 in a variable number of bits; after a zero count, the run of further zero counts
// in 2-bit repeat codes.
__device__ void fse_head(const int* norm, Bits& head) {
    const int size = 1 << WEIGHT_LOG;
    head.add(WEIGHT_LOG - 5, 4);
    int remaining = size + 1, threshold = size, nb = WEIGHT_LOG + 1, v = 0;
    bool after_zero = false;
    while (remaining > 1) {
        if (after_zero) {
            int start = v;
            while (norm[v] == 0) v++;
            while (v >= start + 24) {
                start += 24;
                head.add(0xFFFF, 16);
            }
            while (v >= start + 3) {
                start += 3;
                head.add(3, 2);
            }
            head.add(v - start, 2);
        }
        int c = norm[v++];
        const int limit = 2 * threshold - 1 - remaining;
        remaining -= c;
        c++;
        if (c >= threshold) c += limit;
        head.add(c, nb - (c < limit));
        after_zero = c == 1;
        while (remaining < threshold) {
            nb--;
            threshold >>= 1;
        }
    }
    head.close();
}

// The FSE encoding table of norm[]: per weight value the transform of a state, and the states.
struct alignas(8) Delta {
    int bits, state;
};
struct Fse {
    Delta delta[MAX_BITS + 1];
    unsigned short table[1 << WEIGHT_LOG];
};

__device__ void fse_table(const int* norm, Fse& f) {
    const int size = 1 << WEIGHT_LOG;
    unsigned char spread[1 << WEIGHT_LOG];
    int next[MAX_BITS + 1];
    const int step = (size >> 1) + (size >> 3) + 3, mask = size - 1;
    int pos = 0, cumul = 0;
    for (int w = 0; w <= MAX_BITS; w++) {
        for (int k = 0; k < norm[w]; k++) {
            spread[pos] = (unsigned char)w;
            pos = (pos + step) & mask;
        }
        next[w] = cumul;
        if (norm[w] > 1) {
            const int out_bits = WEIGHT_LOG - (32 - __clz(norm[w] - 1)) + 1;
            f.delta[w] = {(out_bits << 16) - (norm[w] << out_bits), cumul - norm[w]};
        } else {
            f.delta[w] = {(WEIGHT_LOG << 16) - size, cumul - 1};
        }
        cumul += norm[w];
    }
    for (int u = 0; u < size; u++) f.table[next[spread[u]]++] = (unsigned short)(size + u);
}

// The state that starts on weight value w.
__device__ __forceinline__ int fse_first(const Fse& f, int w) {
    const Delta d = f.delta[w];
    const int k = (d.bits + (1 << 15)) >> 16;
    return (int)f.table[(((k << 16) - d.bits) >> k) + d.state];
}

// A weight value (d: its transform) on `state`: its k low bits go out, the next state comes back.
__device__ __forceinline__ int fse_encode(const Fse& f, Delta d, int state, int& k) {
    k = (state + d.bits) >> 16;
    return (int)f.table[(state >> k) + d.state];
}

// The Huffman tree description of code lengths L (symbols below `last`; longest code `top`)
// into tree[]: the direct 4-bit weights up to 128 symbols, else the FSE-compressed weights
// (codec/cuda/zstd_literals/reference.py `_fse_weights`, step for step). Its bytes, or 0 where it cannot
// be written (one weight value only, or TREE_MAX bytes or more). huf_plan writes the same
// bytes on the warp.
__device__ int describe(const unsigned char* L, int last, int top, unsigned char* tree) {
    if (last <= MAX_SYMBOL) {
        tree[0] = (unsigned char)(127 + last);
        for (int k = 0; k < last; k += 2) tree[1 + k / 2] = direct_pair(L, last, top, k);
        return 1 + (last + 1) / 2;
    }
    int count[MAX_BITS + 1] = {0}, norm[MAX_BITS + 1];
    for (int k = 0; k < last; k++) count[weight(L, top, k)]++;
    if (normalize(count, last, norm) < 2) return 0;
    Bits head{tree + 1, 0, TREE_MAX - 1, 0, 0};
    fse_head(norm, head);
    Fse f;
    fse_table(norm, f);
    Bits body{tree + 1 + head.n, 0, TREE_MAX - 1 - head.n, 0, 0};
    auto encode = [&](int state, int w) {
        int k;
        const int next = fse_encode(f, f.delta[w], state, k);
        body.add((u64)state, k);
        return next;
    };
    int i = last, s1, s2;
    if (i & 1) {
        s1 = fse_first(f, weight(L, top, i - 1));
        s2 = fse_first(f, weight(L, top, i - 2));
        s1 = encode(s1, weight(L, top, i - 3));
        i -= 3;
    } else {
        s2 = fse_first(f, weight(L, top, i - 1));
        s1 = fse_first(f, weight(L, top, i - 2));
        i -= 2;
    }
    if (i & 2) {
        s2 = encode(s2, weight(L, top, i - 1));
        s1 = encode(s1, weight(L, top, i - 2));
        i -= 2;
    }
    for (; i > 0; i -= 4) {
        s2 = encode(s2, weight(L, top, i - 1));
        s1 = encode(s1, weight(L, top, i - 2));
        s2 = encode(s2, weight(L, top, i - 3));
        s1 = encode(s1, weight(L, top, i - 4));
    }
    body.add((u64)s2, WEIGHT_LOG);
    body.add((u64)s1, WEIGHT_LOG);
    body.add(1, 1);
    body.close();
    const int total = head.n + body.n;
    if (total >= TREE_MAX || head.n > head.cap || body.n > body.cap) return 0;
    tree[0] = (unsigned char)total;
    return 1 + total;
}

// Code lengths depth[0..m) of m >= 2 leaves with counts cnt[0..m) ascending (ties by symbol):
// codec/cuda/zstd_literals/reference.py `code_lengths`, its tree and repairs. cnt: 2m - 1 entries (the
// inner nodes' counts follow), parent: m - 1 (the inner nodes' parents).
__device__ void huffman_lengths(int* cnt, int m, short* parent, unsigned char* depth) {
    // The two queues, leaves and inner nodes in the order made, both ascending; a leaf first
    // on equal counts. lv, iv: their heads' counts (INF: empty), both reloaded at each step
    // (no branches: one lane runs this on the GPU).
    const int INF = 0x7fffffff;
    int leaf = 0, inner = m, lv = cnt[0], iv = INF;
    for (int node = m; node < 2 * m - 1; node++) {
        int sum = 0;
        for (int k = 0; k < 2; k++) {
            const bool take_leaf = lv <= iv;
            sum += take_leaf ? lv : iv;
            if (!take_leaf) parent[inner - m] = (short)node;
            leaf += take_leaf;
            inner += !take_leaf;
            const int l = cnt[leaf < m ? leaf : m - 1], i = cnt[inner < node ? inner : node - 1];
            lv = leaf < m ? l : INF;
            iv = inner < node ? i : INF;
        }
        cnt[node] = sum;
        if (iv == INF) iv = sum;  // the queue was empty: the new node heads it
    }
    // Depths without a pass over the tree: a node's parent is made after it, so inner nodes'
    // depths are non-increasing in the order made and each depth's are a run, found from the
    // root down by the parents; the leaves' depths are non-increasing too, a depth holding
    // 2 * (inner nodes a depth up) - (inner nodes at it) of them, the shallowest the last.
    // The lengths are cut to MAX_BITS as they go, with their Kraft sum (in units of the
    // longest code) and the number cut or at MAX_BITS (the first ones).
    int kraft = 0, longest = 0, at = m;
    auto place = [&](int d, int count) {
        const int x = d < MAX_BITS ? d : MAX_BITS;
        kraft += count << (MAX_BITS - x);
        if (x == MAX_BITS) longest += count;
        for (; count > 0; count--) depth[--at] = (unsigned char)x;
    };
    int d = 0, lo = 2 * m - 2, width = 1;  // depth d's inner nodes: [lo, lo + width)
    for (int i = 2 * m - 3; i >= m; i--)
        if (parent[i - m] < lo) {  // the parent is at depth d + 1, whose inner nodes are [i + 1, lo)
            place(d + 1, 2 * width - (lo - i - 1));
            width = lo - i - 1;
            lo = i + 1;
            d++;
        }
    place(d + 1, 2 * width - (lo - m));
    place(d + 2, 2 * (lo - m));
    // The reference's two repairs of the Kraft sum, step for step, without its scans: the
    // lengths are non-increasing in i and stay so under both repairs. The first lengthens the
    // first code shorter than MAX_BITS (the longest such, first of its length); the second
    // shortens the last code longer than 1 whose gain fits the deficit (the longest codes are
    // first).
    if (kraft > 1 << MAX_BITS) {
        int j = longest, x = depth[j];
        for (;;) {
            kraft -= 1 << (MAX_BITS - ++x);
            if (kraft <= 1 << MAX_BITS) break;
            if (x == MAX_BITS) {
                depth[j++] = (unsigned char)x;
                x = depth[j];
            }
        }
        depth[j] = (unsigned char)x;
    }
    if (kraft < 1 << MAX_BITS) {
        int ge[MAX_BITS + 1];  // codes of at least each length, from 2
        for (int x = MAX_BITS, i = 0; x >= 2; x--) {
            while (i < m && depth[i] >= x) i++;
            ge[x] = i;
        }
        while (kraft < 1 << MAX_BITS) {
            int shortest = MAX_BITS;  // the shortest length >= 2 whose gain fits: 1 << (MAX_BITS - d) <= deficit
            while (shortest > 2 && 1 << (MAX_BITS - shortest + 1) <= (1 << MAX_BITS) - kraft) shortest--;
            const int i = ge[shortest] - 1;  // the codes of at least that length come first
            // (never breaks: the reference would not end)
            if (i < 0 || 1 << (MAX_BITS - depth[i]) > (1 << MAX_BITS) - kraft) break;
            kraft += 1 << (MAX_BITS - depth[i]);
            ge[depth[i]]--;
            depth[i]--;
        }
    }
}

// Code lengths L[256] of the m >= 2 symbols `order` (by count, then symbol) with counts
// total[] (cnt, parent, depth: 2m - 1 entries of scratch). huf_plan ranks the symbols on the
// warp and calls huffman_lengths() itself.
__device__ __forceinline__ void code_lengths(const int* total, const int* order, int m, int* cnt, short* parent,
                                             unsigned char* depth, unsigned char* L) {
    for (int i = 0; i < m; i++) cnt[i] = total[order[i]];
    huffman_lengths(cnt, m, parent, depth);
    for (int i = 0; i < m; i++) L[order[i]] = depth[i];
}
// HOST-TESTED END

// huf_plan's shared memory of one warp (5.5 KB: with 64 registers a thread, 32 blocks are
// resident on an SM).
struct __align__(16) PlanWarp {
    union {
        unsigned hist[4][HIST_ROW];  // the quarters' counts, then:
        struct {
            int cnt[512];          // the leaves' counts by rank, then the inner nodes' (few symbols: the keys at 256)
            short parent[256];     // the inner nodes'
            unsigned char depth[256];
            uint2 quarters[256];   // each symbol's counts in the quarters, two to a word (at most 32768 each)
        } t;                       // the code lengths' scratch, then:
        struct {
            Fse f;
            int norm[MAX_BITS + 1];
            unsigned short bits[256];  // each weight's state (its low bits go out) | their count << 8
        } w;                           // the FSE weights'
    } u;
    unsigned char L[256];
    unsigned char order[256];      // the symbols by count, then each symbol's weight
    unsigned tree[TREE_MAX / 4];   // an FSE tree description, as words (its bits are ORed in)
};

__device__ __forceinline__ void count_word(unsigned* h, unsigned w) {
    atomicAdd(h + (w & 255), 1u);
    atomicAdd(h + (w >> 8 & 255), 1u);
    atomicAdd(h + (w >> 16 & 255), 1u);
    atomicAdd(h + (w >> 24), 1u);
}

__device__ __forceinline__ void count_words(unsigned* h, uint4 v) {
    count_word(h, v.x);
    count_word(h, v.y);
    count_word(h, v.z);
    count_word(h, v.w);
}

// The bytes [a, e) of a quarter counted into h by its 8 lanes r: the bytes before the first
// 16-byte boundary and after the last one, and the 16-byte words between, four in flight.
__device__ __forceinline__ void count_bytes(unsigned* h, const unsigned char* a, const unsigned char* e, int r) {
    const u64 at = (u64)a, end = (u64)e;
    const u64 a16 = min((at + 15) & ~15ull, end), e16 = max(end & ~15ull, a16);
    for (u64 q = at + r; q < a16; q += 8) atomicAdd(h + __ldg((const unsigned char*)q), 1u);
    for (u64 q = e16 + r; q < end; q += 8) atomicAdd(h + __ldg((const unsigned char*)q), 1u);
    const uint4* v = (const uint4*)a16;
    const int nv = (int)((e16 - a16) >> 4);
    int i = r;
    for (; i + 24 < nv; i += 32) {
        const uint4 x0 = __ldg(v + i), x1 = __ldg(v + i + 8), x2 = __ldg(v + i + 16), x3 = __ldg(v + i + 24);
        count_words(h, x0);
        count_words(h, x1);
        count_words(h, x2);
        count_words(h, x3);
    }
    for (; i < nv; i += 8) count_words(h, __ldg(v + i));
}

// The sum of v over the lanes below this one (all: over the warp).
__device__ __forceinline__ int lanes_below(int v, int lane, int& all) {
    int incl = v;
    for (int d = 1; d < 32; d <<= 1) {
        const int x = __shfl_up_sync(FULL, incl, d);
        if (lane >= d) incl += x;
    }
    all = __shfl_sync(FULL, incl, 31);
    return incl - v;
}

// The m present keys (count << 8 | symbol, distinct; absent: ~0) of the lane's symbols
// lane * 8 + k ranked: their counts into cnt[] and symbols into order[], ascending. Up to 64,
// each key counts the smaller ones (the keys compacted at cnt + 256); more, a bitonic sort of
// all 256, key k of a lane at lane * 8 + k.
__device__ __forceinline__ void rank_keys(PlanWarp& s, unsigned (&key)[8], int mine, int m, int lane) {
    int* cnt = s.u.t.cnt;
    if (m <= 64) {
        unsigned* K = (unsigned*)(cnt + 256);
        int all, at = lanes_below(mine, lane, all);
#pragma unroll
        for (int k = 0; k < 8; k++)
            if (key[k] != ~0u) K[at++] = key[k];
        if (lane < 4) K[m + lane] = ~0u;  // to a whole uint4
        __syncwarp();
        const unsigned x0 = lane < m ? K[lane] : ~0u, x1 = lane + 32 < m ? K[lane + 32] : ~0u;
        int r0 = 0, r1 = 0;
        for (int j = 0; j < m; j += 4) {
            const uint4 y = *(const uint4*)(K + j);
            r0 += (y.x < x0) + (y.y < x0) + (y.z < x0) + (y.w < x0);
            r1 += (y.x < x1) + (y.y < x1) + (y.z < x1) + (y.w < x1);
        }
        if (lane < m) {
            cnt[r0] = (int)(x0 >> 8);
            s.order[r0] = (unsigned char)x0;
        }
        if (lane + 32 < m) {
            cnt[r1] = (int)(x1 >> 8);
            s.order[r1] = (unsigned char)x1;
        }
        return;
    }
#pragma unroll
    for (int size = 2; size <= 256; size <<= 1) {
#pragma unroll
        for (int stride = size >> 1; stride > 0; stride >>= 1) {
#pragma unroll
            for (int k = 0; k < 8; k++) {
                const bool up = ((lane * 8 + k) & size) == 0;  // this run of `size` ascends
                if (stride >= 8) {  // with lane ^ stride / 8
                    const unsigned o = __shfl_xor_sync(FULL, key[k], stride >> 3);
                    key[k] = (((lane & (stride >> 3)) == 0) == up) ? min(key[k], o) : max(key[k], o);
                } else if ((k & stride) == 0) {
                    const unsigned lo = min(key[k], key[k + stride]), hi = max(key[k], key[k + stride]);
                    key[k] = up ? lo : hi;
                    key[k + stride] = up ? hi : lo;
                }
            }
        }
    }
    *(uint4*)(cnt + lane * 8) = make_uint4(key[0] >> 8, key[1] >> 8, key[2] >> 8, key[3] >> 8);
    *(uint4*)(cnt + lane * 8 + 4) = make_uint4(key[4] >> 8, key[5] >> 8, key[6] >> 8, key[7] >> 8);
    unsigned sym[2] = {0, 0};
#pragma unroll
    for (int k = 0; k < 8; k++) sym[k / 4] |= (key[k] & 255) << (8 * (k & 3));
    *(uint2*)(s.order + lane * 8) = make_uint2(sym[0], sym[1]);
}

// Codes of length x among the lanes' symbols, counted in 10-bit fields: lengths 1-6 in a, 7-11 in b.
__device__ __forceinline__ void count_length(u64& a, u64& b, int x) {
    if (x == 0) return;
    if (x <= 6) a += 1ull << (10 * (x - 1));
    else b += 1ull << (10 * (x - 7));
}

__device__ __forceinline__ int length_count(u64 a, u64 b, int x) {
    return (int)((x <= 6 ? a >> (10 * (x - 1)) : b >> (10 * (x - 7))) & 1023);
}

// The FSE-compressed weights (describe()'s, byte for byte) into s.tree, on the warp: lane v
// normalises the count of weight value v (normalize()'s remainders ranked), lane u takes
// states u and u + 32 of the table (fse_table()'s spread, inverted: step 43 * 3 = 1 mod 64),
// lane 0 writes the table's description; lanes 0 and 1 run the two interleaved states (the
// last weight first, each state every other weight), and the bits they give out are laid
// end to end by the warp. The description's bytes, or 0 where it cannot be written; `first`:
// its first byte.
__device__ __forceinline__ int tree_fse(PlanWarp& s, int last, int top, u64 all_a, u64 all_b, int lane,
                                        int& first) {
    const int size = 1 << WEIGHT_LOG;
    Fse& f = s.u.w.f;
    int c = lane >= 1 && lane <= top ? length_count(all_a, all_b, top + 1 - lane) - (s.L[last] == top + 1 - lane) : 0;
    const int nonzero = (int)warp_sum((unsigned)c);
    if (lane == 0) c = last - nonzero;  // the weights below `last`: lane v counts value v
    const int present = __popc(__ballot_sync(FULL, c > 0));
    if (present < 2) return 0;
    const int rest = size - present, q = c * rest / last, r = c * rest - q * last;
    const int left = rest - (int)warp_sum((unsigned)q);
    int ahead = 0;  // values of a larger remainder, or as large and smaller
    for (int v = 0; v <= MAX_BITS; v++) {
        const int rv = __shfl_sync(FULL, c ? r : -1, v);
        ahead += rv > r || (rv == r && v < lane);
    }
    const int norm = c ? 1 + q + (ahead < left) : 0;
    int all;
    const int cumul = lanes_below(norm, lane, all);
    if (lane <= MAX_BITS) {
        s.u.w.norm[lane] = norm;
        if (norm > 1) {
            const int out_bits = WEIGHT_LOG - (32 - __clz(norm - 1)) + 1;
            f.delta[lane] = {(out_bits << 16) - (norm << out_bits), cumul - norm};
        } else {
            f.delta[lane] = {(WEIGHT_LOG << 16) - size, cumul - 1};
        }
    }
    // States lane and lane + 32: their values (w0, w1), where those values' entries start (at0,
    // at1) and the second's count (n1).
    int w0 = 0, w1 = 0, at0 = 0, at1 = 0, n1 = 0;
    const int u0 = lane * 3 & (size - 1), u1 = (lane + 32) * 3 & (size - 1);  // their places in the spread
    for (int v = 0; v <= MAX_BITS; v++) {
        const int cv = __shfl_sync(FULL, cumul, v), nv = __shfl_sync(FULL, norm, v);
        if (u0 >= cv && u0 < cv + nv) {
            w0 = v;
            at0 = cv;
        }
        if (u1 >= cv && u1 < cv + nv) {
            w1 = v;
            at1 = cv;
            n1 = nv;
        }
    }
    // Each state's entry follows those of its value's states below it (for lane + 32: all those
    // below 32, its value's count less those from 32 on).
    const unsigned same0 = __match_any_sync(FULL, w0), same1 = __match_any_sync(FULL, w1), below = (1u << lane) - 1;
    f.table[at0 + __popc(same0 & below)] = (unsigned short)(size + lane);
    f.table[at1 + n1 - __popc(same1) + __popc(same1 & below)] = (unsigned short)(size + 32 + lane);
    __syncwarp();
    unsigned char* tree = (unsigned char*)s.tree;
    int head = 0;
    if (lane == 0) {
        Bits h{tree + 1, 0, TREE_MAX - 1, 0, 0};
        fse_head(s.u.w.norm, h);
        head = h.n;
    }
    head = __shfl_sync(FULL, head, 0);
    __syncwarp();
    int state = 0;
    if (lane < 2) {  // state `lane` starts on weight last - 1 - lane, then takes last - 3 - lane, every other down
        const unsigned char* weights = s.order;
        state = fse_first(f, weights[last - 1 - lane]);
        Delta next = f.delta[weights[last - 3 - lane]];  // a step ahead: off the states' chain
        for (int i = last - 3 - lane; i >= 0; i -= 2) {
            const Delta d = next;
            next = f.delta[weights[i >= 2 ? i - 2 : 0]];
            int k;
            const int to = fse_encode(f, d, state, k);
            s.u.w.bits[last - 3 - i] = (unsigned short)(state | k << 8);
            state = to;
        }
    }
    const int s0 = __shfl_sync(FULL, state, 0), s1 = __shfl_sync(FULL, state, 1);
    __syncwarp();
    // Each lane's run of the weights' bits, at its offset past the description's bytes.
    const int steps = last - 2, per = (steps + 31) >> 5, j0 = min(lane * per, steps), j1 = min(j0 + per, steps);
    u64 acc = 0;
    int nacc = 0;
    for (int j = j0; j < j1; j++) {
        const unsigned v = s.u.w.bits[j], k = v >> 8;
        acc |= (u64)(v & ((1u << k) - 1)) << nacc;
        nacc += k;
    }
    int total;
    const int before = lanes_below(nacc, lane, total);
    auto put = [&](int at, u64 v) {  // up to 64 bits from bit `at` of the description, ORed in
        const int w = at >> 5, sh = at & 31;
        const u64 rest = sh ? v >> (32 - sh) : v >> 32;
        if (w < TREE_MAX / 4 && (unsigned)(v << sh)) atomicOr(s.tree + w, (unsigned)(v << sh));
        if (w + 1 < TREE_MAX / 4 && (unsigned)rest) atomicOr(s.tree + w + 1, (unsigned)rest);
        if (w + 2 < TREE_MAX / 4 && (unsigned)(rest >> 32)) atomicOr(s.tree + w + 2, (unsigned)(rest >> 32));
    };
    const int start = 8 * (1 + head);
    put(start + before, acc);
    if (lane == 0) {  // the final states (describe()'s s2, then s1), then the end mark
        const int a = last & 1 ? s1 : s0, b = last & 1 ? s0 : s1;
        put(start + total, (u64)(a & (size - 1)) | (u64)(b & (size - 1)) << WEIGHT_LOG | 1ull << (2 * WEIGHT_LOG));
    }
    const int bytes = head + (total + 2 * WEIGHT_LOG + 1 + 7) / 8;
    first = bytes;
    return bytes < TREE_MAX ? 1 + bytes : 0;
}

extern "C" __global__ void __launch_bounds__(32 * PLAN_WARPS, 32 / PLAN_WARPS)
huf_plan(const unsigned char* buf, const i64* src, const int* len, int* info, unsigned short* codes,
         unsigned char* lengths, unsigned char* trees, i64 blocks) {
    __shared__ __align__(16) PlanWarp warps[PLAN_WARPS];
    const int lane = threadIdx.x & 31, s0 = lane * 8;  // the lane's symbols: s0 .. s0 + 7
    const i64 b = (i64)blockIdx.x * PLAN_WARPS + (threadIdx.x >> 5);
    if (b >= blocks) return;
    PlanWarp& s = warps[threadIdx.x >> 5];
    const int n = len[b];
    int* out = info + b * 8;
    if (n == 0) {  // an empty block past the streams' blocks (the launch is sized by a bound)
        if (lane < 8) out[lane] = 0;
        return;
    }
    for (int k = lane; k < 4 * HIST_ROW / 4; k += 32) ((uint4*)s.u.hist)[k] = make_uint4(0, 0, 0, 0);
    *(uint2*)(s.L + s0) = make_uint2(0, 0);
    s.tree[lane] = 0;
    __syncwarp();
    // The histograms: 8 lanes a quarter (quarters of the one stream below ONE_STREAM_BELOW too,
    // their bits summed), so one atomic's lanes hit four histograms, 8 banks apart.
    const int quarter = (n + 3) / 4, q = lane >> 3, lo = min(q * quarter, n), hi = min(lo + quarter, n);
    const unsigned char* p = buf + src[b];
    count_bytes(s.u.hist[q], p + lo, p + hi, lane & 7);
    __syncwarp();
    unsigned key[8];  // count << 8 | symbol of the lane's symbols (absent: ~0)
    uint2 quarters[8];
    int mine = 0, high = 0;  // the lane's symbols present, the largest
    {
        uint4 c[4][2];
#pragma unroll
        for (int k = 0; k < 4; k++) {
            c[k][0] = *(const uint4*)&s.u.hist[k][s0];
            c[k][1] = *(const uint4*)&s.u.hist[k][s0 + 4];
        }
#pragma unroll
        for (int k = 0; k < 8; k++) {
            unsigned h[4];
#pragma unroll
            for (int j = 0; j < 4; j++) h[j] = k < 4 ? (&c[j][0].x)[k] : (&c[j][1].x)[k - 4];
            const unsigned total = h[0] + h[1] + h[2] + h[3];
            quarters[k] = make_uint2(h[0] | h[1] << 16, h[2] | h[3] << 16);
            key[k] = total ? total << 8 | (s0 + k) : ~0u;
            if (total) {
                mine++;
                high = s0 + k;
            }
        }
    }
    const int m = (int)warp_sum((unsigned)mine), last = warp_max(high);
    if (m == 1) {
        if (lane == 0) {
            out[0] = RLE;
            out[1] = 1;
        }
        return;
    }
    __syncwarp();  // the histograms read: their words take the quarters' counts, the ranks, the lengths
#pragma unroll
    for (int k = 0; k < 8; k += 2)
        *(uint4*)&s.u.t.quarters[s0 + k] = make_uint4(quarters[k].x, quarters[k].y, quarters[k + 1].x,
                                                      quarters[k + 1].y);
    rank_keys(s, key, mine, m, lane);
    __syncwarp();
    if (lane == 0) huffman_lengths(s.u.t.cnt, m, s.u.t.parent, s.u.t.depth);
    __syncwarp();
    for (int i = lane; i < m; i += 32) s.L[s.order[i]] = s.u.t.depth[i];
    __syncwarp();
    const uint2 own = *(const uint2*)(s.L + s0);
    int len_k[8], longest = 0;
#pragma unroll
    for (int k = 0; k < 8; k++) {
        len_k[k] = (int)((k < 4 ? own.x >> (8 * k) : own.y >> (8 * (k - 4))) & 255);
        longest = max(longest, len_k[k]);
    }
    const int top = warp_max(longest);
    unsigned weight2[2] = {0, 0};  // the lane's symbols' weights (the FSE form's chains read them)
#pragma unroll
    for (int k = 0; k < 8; k++) weight2[k / 4] |= (unsigned)(len_k[k] ? top + 1 - len_k[k] : 0) << (8 * (k & 3));
    *(uint2*)(s.order + s0) = make_uint2(weight2[0], weight2[1]);
    // Canonical codes, by weight (top + 1 - length), then symbol: a symbol's code is the rows
    // of the longer codes in units of its own (their sum, lane x for length x) plus its rank
    // among its length's symbols (those of the lanes below, then its own lane's).
    u64 own_a = 0, own_b = 0;
#pragma unroll
    for (int k = 0; k < 8; k++) count_length(own_a, own_b, len_k[k]);
    u64 inc_a = own_a, inc_b = own_b;
    for (int d = 1; d < 32; d <<= 1) {
        const u64 xa = __shfl_up_sync(FULL, inc_a, d), xb = __shfl_up_sync(FULL, inc_b, d);
        if (lane >= d) {
            inc_a += xa;
            inc_b += xb;
        }
    }
    const u64 all_a = __shfl_sync(FULL, inc_a, 31), all_b = __shfl_sync(FULL, inc_b, 31);
    u64 rank_a = inc_a - own_a, rank_b = inc_b - own_b;
    int base = 0;
    if (lane >= 1 && lane <= top) {
        int rows = 0;
        for (int x = top; x > lane; x--) rows += length_count(all_a, all_b, x) << (top - x);
        base = rows >> (top - lane);
    }
    unsigned code2[4] = {0, 0, 0, 0};
    int bits[4] = {0, 0, 0, 0};  // the quarters' bits
#pragma unroll
    for (int k = 0; k < 8; k++) {
        const int x = len_k[k], from = __shfl_sync(FULL, base, x);
        if (x) {
            code2[k / 2] |= (unsigned)(from + length_count(rank_a, rank_b, x)) << (16 * (k & 1));
            count_length(rank_a, rank_b, x);
        }
        const uint2 h = s.u.t.quarters[s0 + k];
        bits[0] += x * (int)(h.x & 0xffff);
        bits[1] += x * (int)(h.x >> 16);
        bits[2] += x * (int)(h.y & 0xffff);
        bits[3] += x * (int)(h.y >> 16);
    }
    *(uint4*)(codes + b * 256 + s0) = make_uint4(code2[0], code2[1], code2[2], code2[3]);
    *(uint2*)(lengths + b * 256 + s0) = own;
#pragma unroll
    for (int k = 0; k < 4; k++) bits[k] = (int)warp_sum((unsigned)bits[k]);
    // The tree description: the direct weights from the lanes, the FSE form by tree_fse().
    int tree_len, first = 127 + last;
    unsigned char* tree = trees + b * TREE_MAX;
    if (last <= MAX_SYMBOL) {
        for (int k = 2 * lane; k < last; k += 64) tree[1 + k / 2] = direct_pair(s.L, last, top, k);
        tree_len = 1 + (last + 1) / 2;
    } else {
        tree_len = tree_fse(s, last, top, all_a, all_b, lane, first);
        __syncwarp();
        for (int k = lane + 1; k < tree_len; k += 32) tree[k] = ((const unsigned char*)s.tree)[k];
    }
    if (lane == 0) {
        if (tree_len) tree[0] = (unsigned char)first;
        const int streams = n < ONE_STREAM_BELOW ? 1 : 4;
        if (streams == 1) bits[0] += bits[1] + bits[2] + bits[3];
        int body = streams == 4 ? 6 : 0;
#pragma unroll
        for (int k = 0; k < 4; k++) {  // zeros past the streams
            out[2 + k] = k < streams ? bits[k] / 8 + 1 : 0;
            body += out[2 + k];
        }
        const int head = n < ONE_STREAM_BELOW ? 3 : n < (1 << 14) ? 4 : 5;
        const int content = head + tree_len + body + 1;
        const bool smaller = tree_len > 0 && content < n;
        out[0] = smaller ? COMPRESSED : RAW;
        out[1] = smaller ? content : n;
        out[6] = tree_len;
        out[7] = top;
    }
}

extern "C" __global__ void __launch_bounds__(WRITE_THREADS)
huf_write(const unsigned char* buf, const i64* src, const int* len, const int* info, const unsigned short* codes,
          const unsigned char* lengths, const unsigned char* trees, const i64* at, const i64* frame,
          const int* is_last, unsigned* out, i64 blocks) {
    __shared__ unsigned short code[256];
    __shared__ unsigned char L[256];
    __shared__ int warp_sum[WRITE_THREADS / 32];
    const int t = threadIdx.x, lane = t & 31, wp = t >> 5;
    const i64 b = blockIdx.x;
    if (at[b] < 0) return;  // a block of a stream coded otherwise
    const int n = len[b];
    const unsigned char* p = buf + src[b];
    const int* in = info + b * 8;
    const int kind = in[0];
    i64 pos = at[b];
    if (t == 0) {
        if (frame[b]) {  // the frame's magic and single-segment header with its content size
            const i64 size = frame[b];
            const int fh = size < 256 ? 6 : size < 65536 + 256 ? 7 : 9;
            put_le(out, pos - fh, 0xFD2FB528ull, 4);
            if (fh == 6) put_le(out, pos - 2, 0x20 | (u64)size << 8, 2);
            else if (fh == 7) put_le(out, pos - 3, 0x60 | (u64)(size - 256) << 8, 3);
            else put_le(out, pos - 5, 0xA0 | (u64)size << 8, 5);
        }
        put_le(out, pos, (u64)is_last[b] | (u64)kind << 1 | (u64)(kind == COMPRESSED ? in[1] : n) << 3, 3);
        if (kind == RLE) put_byte(out, pos + 3, p[0]);
    }
    pos += 3;
    if (kind == RAW) {
        for (int i = t; i < n; i += WRITE_THREADS) put_byte(out, pos + i, p[i]);
        return;
    }
    if (kind != COMPRESSED) return;
    code[t] = codes[b * 256 + t];
    L[t] = lengths[b * 256 + t];
    const int tree = in[6], streams = n < ONE_STREAM_BELOW ? 1 : 4;
    const int head = n < ONE_STREAM_BELOW ? 3 : n < (1 << 14) ? 4 : 5;
    if (t < tree) put_byte(out, pos + head + t, trees[b * TREE_MAX + t]);
    __syncthreads();
    if (t == 0) {
        const u64 size = (u64)(in[1] - head - 1);  // tree, jump table and streams
        const u64 h = head == 3 ? 2 | (u64)n << 4 | size << 14
                    : head == 4 ? 2 | 2 << 2 | (u64)n << 4 | size << 18 : 2 | 3 << 2 | (u64)n << 4 | size << 22;
        put_le(out, pos, h, head);
        if (streams == 4)
            for (int q = 0; q < 3; q++) put_le(out, pos + head + tree + 2 * q, (u64)in[2 + q], 2);
    }
    i64 start = pos + head + tree + (streams == 4 ? 6 : 0);
    const int quarter = quarter_of(n);
    for (int q = 0; q < streams; q++) {
        const int a = q * quarter, m = min(quarter, n - a), run = (m + WRITE_THREADS - 1) / WRITE_THREADS;
        const int r0 = min(t * run, m), r1 = min(r0 + run, m);
        int mine = 0;
        for (int i = r0; i < r1; i++) mine += L[p[a + i]];
        int incl = mine;
        for (int d = 1; d < 32; d <<= 1) {
            const int v = __shfl_up_sync(0xffffffffu, incl, d);
            if (lane >= d) incl += v;
        }
        if (lane == 31) warp_sum[wp] = incl;
        __syncthreads();
        int before = 0, all = 0;
        for (int k = 0; k < WRITE_THREADS / 32; k++) {
            before += k < wp ? warp_sum[k] : 0;
            all += warp_sum[k];
        }
        const i64 g = start * 8 + (all - (before + incl));  // bits of the runs after this one come first
        u64 acc = 0;
        int nacc = (int)(g & 31);
        i64 word = g >> 5;
        for (int i = r1 - 1; i >= r0; i--) {
            const int s = p[a + i];
            acc |= (u64)code[s] << nacc;
            nacc += L[s];
            if (nacc >= 32) {
                atomicOr(out + word, (unsigned)acc);
                acc >>= 32;
                nacc -= 32;
                word++;
            }
        }
        if (nacc > 0 && acc) atomicOr(out + word, (unsigned)acc);
        if (t == 0) {  // the end mark
            const i64 e = start * 8 + all;
            atomicOr(out + (e >> 5), 1u << (e & 31));
        }
        start += in[2 + q];
        __syncthreads();  // warp_sum is reused
    }
}
