// Zstandard frames of Huffman-coded literals (codec/huffman_frames.py is the reference, byte
// for byte, and says why), written on the GPU in two launches over blocks of at most 128 KiB
// of streams:
// - huf_plan, a CTA per block: the histograms of the block's four quarters, its code lengths
//   (the reference's construction, run by one thread), canonical codes, its tree description
//   (direct or FSE-compressed weights, one thread) and what the block will be (raw, RLE or
//   compressed) with the sizes of its parts ([blocks, 8] int32: kind, content bytes, four
//   stream bytes, tree description bytes, longest code; zeros for an empty block). The
//   frames are laid out from the sizes on the device.
// - huf_write, a CTA per block: its frame header (first block of a stream), block header and
//   content at its offset (none: the block's stream is stored raw). Threads of a quarter take
//   runs of its literals; a run's first bit is the sum of the code lengths of the runs after
//   it (a backward stream), and its bits go out a 32-bit word at a time with atomicOr, like
//   every other byte, into a zeroed buffer.

typedef long long i64;
typedef unsigned long long u64;

#define T 256
#define MAX_BITS 11
#define MAX_SYMBOL 128
#define ONE_STREAM_BELOW 1024
#define RAW 0
#define RLE 1
#define COMPRESSED 2
#define TREE_MAX 128     // a tree description's bytes: the FSE form is used below 128
#define NODES 511        // nodes of a Huffman tree of up to 256 symbols
#define WEIGHT_LOG 6     // accuracy log of the FSE table of compressed weights

__device__ __forceinline__ void put_byte(unsigned* out, i64 at, unsigned v) {
    atomicOr(out + (at >> 2), (v & 0xffu) << ((at & 3) * 8));
}

__device__ __forceinline__ void put_le(unsigned* out, i64 at, u64 v, int n) {
    for (int k = 0; k < n; k++) put_byte(out, at + k, (unsigned)(v >> (8 * k)));
}

__device__ __forceinline__ int quarter_of(int n) { return n < ONE_STREAM_BELOW ? n : (n + 3) / 4; }

// HOST-TESTED BEGIN: Bits, describe() and code_lengths() compile for the host too
// (tests/test_huffman_frames.py holds them to the reference without a GPU).

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

// The Huffman tree description of code lengths L (symbols below `last`; longest code `top`)
// into tree[]: the direct 4-bit weights up to 128 symbols, else the FSE-compressed weights
// (codec/huffman_frames.py `_fse_weights`, step for step). Its bytes, or 0 where it cannot
// be written (one weight value only, or TREE_MAX bytes or more).
__device__ int describe(const unsigned char* L, int last, int top, unsigned char* tree) {
    if (last <= MAX_SYMBOL) {
        tree[0] = (unsigned char)(127 + last);
        for (int k = 0; k < last; k += 2) {
            const int w0 = L[k] ? top + 1 - L[k] : 0, w1 = k + 1 < last && L[k + 1] ? top + 1 - L[k + 1] : 0;
            tree[1 + k / 2] = (unsigned char)(w0 << 4 | w1);
        }
        return 1 + (last + 1) / 2;
    }
    const int size = 1 << WEIGHT_LOG;
    int count[MAX_BITS + 1] = {0}, norm[MAX_BITS + 1], share[MAX_BITS + 1];
    for (int k = 0; k < last; k++) count[L[k] ? top + 1 - L[k] : 0]++;
    int present = 0;
    for (int v = 0; v <= MAX_BITS; v++) present += count[v] > 0;
    if (present < 2) return 0;
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
    Bits head{tree + 1, 0, TREE_MAX - 1, 0, 0};
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
    unsigned char spread[1 << WEIGHT_LOG];
    unsigned short table[1 << WEIGHT_LOG];
    int next[MAX_BITS + 1], delta_bits[MAX_BITS + 1], delta_state[MAX_BITS + 1];
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
            delta_bits[w] = (out_bits << 16) - (norm[w] << out_bits);
            delta_state[w] = cumul - norm[w];
        } else {
            delta_bits[w] = (WEIGHT_LOG << 16) - size;
            delta_state[w] = cumul - 1;
        }
        cumul += norm[w];
    }
    for (int u = 0; u < size; u++) table[next[spread[u]]++] = (unsigned short)(size + u);
    Bits body{tree + 1 + head.n, 0, TREE_MAX - 1 - head.n, 0, 0};
    auto weight = [&](int k) { return L[k] ? top + 1 - L[k] : 0; };
    auto first = [&](int w) {
        const int k = (delta_bits[w] + (1 << 15)) >> 16;
        return (int)table[(((k << 16) - delta_bits[w]) >> k) + delta_state[w]];
    };
    auto encode = [&](int state, int w) {
        const int k = (state + delta_bits[w]) >> 16;
        body.add((u64)state, k);
        return (int)table[(state >> k) + delta_state[w]];
    };
    int i = last, s1, s2;
    if (i & 1) {
        s1 = first(weight(i - 1));
        s2 = first(weight(i - 2));
        s1 = encode(s1, weight(i - 3));
        i -= 3;
    } else {
        s2 = first(weight(i - 1));
        s1 = first(weight(i - 2));
        i -= 2;
    }
    if (i & 2) {
        s2 = encode(s2, weight(i - 1));
        s1 = encode(s1, weight(i - 2));
        i -= 2;
    }
    for (; i > 0; i -= 4) {
        s2 = encode(s2, weight(i - 1));
        s1 = encode(s1, weight(i - 2));
        s2 = encode(s2, weight(i - 3));
        s1 = encode(s1, weight(i - 4));
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

// Code lengths L[256] of the m >= 2 symbols `order` (by count, then symbol) with counts
// total[]: codec/huffman_frames.py `code_lengths`, step for step (cnt, parent, depth: 2m - 1
// entries of scratch).
__device__ __forceinline__ void code_lengths(const int* total, const int* order, int m, int* cnt, short* parent,
                                             unsigned char* depth, unsigned char* L) {
    for (int i = 0; i < m; i++) cnt[i] = total[order[i]];
    int leaf = 0, inner = m;
    for (int node = m; node < 2 * m - 1; node++) {
        int pick[2];
        for (int k = 0; k < 2; k++) {
            if (leaf < m && (inner >= node || cnt[leaf] <= cnt[inner])) pick[k] = leaf++;
            else pick[k] = inner++;
        }
        cnt[node] = cnt[pick[0]] + cnt[pick[1]];
        parent[pick[0]] = parent[pick[1]] = (short)node;
    }
    depth[2 * m - 2] = 0;
    for (int i = 2 * m - 3; i >= 0; i--) depth[i] = depth[parent[i]] + 1;
    // The reference's two repairs of the Kraft sum, step for step, without its scans: leaves
    // consumed earlier by the two-queue construction are never shallower, so the lengths are
    // non-increasing in i and stay so under both repairs. The first lengthens the first code
    // shorter than MAX_BITS (the longest such, first of its length); the second shortens the
    // last code longer than 1 whose gain fits the deficit (the longest codes are first).
    int kraft = 0, count[MAX_BITS + 1] = {0};  // codes of each length
    for (int i = 0; i < m; i++) {
        depth[i] = depth[i] < MAX_BITS ? depth[i] : MAX_BITS;
        kraft += 1 << (MAX_BITS - depth[i]);
        count[depth[i]]++;
    }
    int j = count[MAX_BITS];  // the first code shorter than MAX_BITS
    while (kraft > 1 << MAX_BITS) {
        count[depth[j]]--;
        depth[j]++;
        count[depth[j]]++;
        kraft -= 1 << (MAX_BITS - depth[j]);
        if (depth[j] == MAX_BITS) j++;
    }
    while (kraft < 1 << MAX_BITS) {
        int shortest = MAX_BITS;  // the shortest length >= 2 whose gain fits: 1 << (MAX_BITS - d) <= deficit
        while (shortest > 2 && 1 << (MAX_BITS - shortest + 1) <= (1 << MAX_BITS) - kraft) shortest--;
        int i = -1;  // the codes of at least that length come first
        for (int d = shortest; d <= MAX_BITS; d++) i += count[d];
        if (i < 0 || 1 << (MAX_BITS - depth[i]) > (1 << MAX_BITS) - kraft) break;  // (never: the reference would not end)
        kraft += 1 << (MAX_BITS - depth[i]);
        count[depth[i]]--;
        depth[i]--;
        count[depth[i]]++;
    }
    for (int i = 0; i < m; i++) L[order[i]] = depth[i];
}
// HOST-TESTED END

extern "C" __global__ void __launch_bounds__(T)
huf_plan(const unsigned char* buf, const i64* src, const int* len, int* info, unsigned short* codes,
         unsigned char* lengths, unsigned char* trees, i64 blocks) {
    __shared__ int hist[4][256];
    __shared__ int total[256], order[256], cnt[NODES], bits[4];
    __shared__ short parent[NODES];
    __shared__ unsigned char depth[NODES], L[256];
    __shared__ int n_sym, last, top, tree_len;
    __shared__ unsigned char tree[TREE_MAX];
    const int t = threadIdx.x;
    const i64 b = blockIdx.x;
    const int n = len[b];
    if (n == 0) {  // an empty block past the streams' blocks (the launch is sized by a bound)
        if (t < 8) info[b * 8 + t] = 0;
        return;
    }
    const unsigned char* p = buf + src[b];
    for (int k = t; k < 4 * 256; k += T) (&hist[0][0])[k] = 0;
    if (t < 4) bits[t] = 0;
    if (t == 0) n_sym = last = top = 0;
    L[t] = 0;
    __syncthreads();
    const int quarter = quarter_of(n);
    for (int i = t; i < n; i += T) atomicAdd(&hist[i / quarter][p[i]], 1);
    __syncthreads();
    const int c = hist[0][t] + hist[1][t] + hist[2][t] + hist[3][t];
    total[t] = c;
    if (c) {
        atomicAdd(&n_sym, 1);
        atomicMax(&last, t);
    }
    __syncthreads();
    int* out = info + b * 8;
    if (n_sym == 1) {
        if (t == 0) {
            out[0] = RLE;
            out[1] = 1;
        }
        return;
    }
    if (c) {  // the symbols ordered by (count, symbol)
        int r = 0;
        for (int s = 0; s < 256; s++) r += total[s] && (total[s] < c || (total[s] == c && s < t));
        order[r] = t;
    }
    __syncthreads();
    if (t == 0) code_lengths(total, order, n_sym, cnt, parent, depth, L);
    __syncthreads();
    if (L[t]) atomicMax(&top, L[t]);
    __syncthreads();
    int code = 0;
    if (L[t]) {  // canonical: by weight (top + 1 - length), then symbol
        const int w = top + 1 - L[t];
        int row = 0;
        for (int s = 0; s < 256; s++) {
            const int ws = L[s] ? top + 1 - L[s] : 0;
            if (ws && (ws < w || (ws == w && s < t))) row += 1 << (ws - 1);
        }
        code = row >> (w - 1);
        for (int q = 0; q < 4; q++)
            if (hist[q][t]) atomicAdd(&bits[q], hist[q][t] * L[t]);
    }
    codes[b * 256 + t] = (unsigned short)code;
    lengths[b * 256 + t] = L[t];
    __syncthreads();
    if (t == 0) {
        tree_len = describe(L, last, top, tree);
        const int streams = n < ONE_STREAM_BELOW ? 1 : 4;
        int body = streams == 4 ? 6 : 0;
        for (int q = 0; q < streams; q++) {
            out[2 + q] = bits[q] / 8 + 1;
            body += out[2 + q];
        }
        const int head = n < ONE_STREAM_BELOW ? 3 : n < (1 << 14) ? 4 : 5;
        const int content = head + tree_len + body + 1;
        const bool smaller = tree_len > 0 && content < n;
        out[0] = smaller ? COMPRESSED : RAW;
        out[1] = smaller ? content : n;
        out[6] = tree_len;
        out[7] = top;
    }
    __syncthreads();
    if (t < tree_len) trees[b * TREE_MAX + t] = tree[t];
}

extern "C" __global__ void __launch_bounds__(T)
huf_write(const unsigned char* buf, const i64* src, const int* len, const int* info, const unsigned short* codes,
          const unsigned char* lengths, const unsigned char* trees, const i64* at, const i64* frame,
          const int* is_last, unsigned* out, i64 blocks) {
    __shared__ unsigned short code[256];
    __shared__ unsigned char L[256];
    __shared__ int warp_sum[T / 32];
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
        for (int i = t; i < n; i += T) put_byte(out, pos + i, p[i]);
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
        const int a = q * quarter, m = min(quarter, n - a), run = (m + T - 1) / T;
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
        for (int k = 0; k < T / 32; k++) {
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
