// Zstandard frames of Huffman-coded literals (codec/huffman_frames.py is the reference and
// says why), written on the GPU in two launches over blocks of at most 128 KiB of streams:
// - huf_plan, a CTA per block: the histograms of the block's four quarters, its code
//   lengths (the reference's construction, run by one thread), canonical codes, and what
//   the block will be (raw, RLE, compressed, or "unfit": a symbol past 128) with the sizes
//   of its parts ([blocks, 8] int32: kind, content bytes, four stream bytes, last symbol,
//   longest code). The host reads the sizes and lays the frames out.
// - huf_write, a CTA per block: its frame header (first block of a stream), block header and
//   content at its offset (none: the block's stream is coded otherwise). Threads of a quarter take runs of its literals; a run's first bit
//   is the sum of the code lengths of the runs after it (a backward stream), and its bits go
//   out a 32-bit word at a time with atomicOr, like every other byte, into a zeroed buffer.

typedef long long i64;
typedef unsigned long long u64;

#define T 256
#define MAX_BITS 11
#define MAX_SYMBOL 128
#define ONE_STREAM_BELOW 1024
#define RAW 0
#define RLE 1
#define COMPRESSED 2
#define UNFIT 3

__device__ __forceinline__ void put_byte(unsigned* out, i64 at, unsigned v) {
    atomicOr(out + (at >> 2), (v & 0xffu) << ((at & 3) * 8));
}

__device__ __forceinline__ void put_le(unsigned* out, i64 at, u64 v, int n) {
    for (int k = 0; k < n; k++) put_byte(out, at + k, (unsigned)(v >> (8 * k)));
}

__device__ __forceinline__ int quarter_of(int n) { return n < ONE_STREAM_BELOW ? n : (n + 3) / 4; }

extern "C" __global__ void __launch_bounds__(T)
huf_plan(const unsigned char* buf, const i64* src, const int* len, int* info, unsigned short* codes,
         unsigned char* lengths, i64 blocks) {
    __shared__ int hist[4][256];
    __shared__ int total[256], order[256], cnt[2 * MAX_SYMBOL + 1], bits[4];
    __shared__ short parent[2 * MAX_SYMBOL + 1];
    __shared__ unsigned char depth[2 * MAX_SYMBOL + 1], L[256];
    __shared__ int n_sym, last, top;
    const int t = threadIdx.x;
    const i64 b = blockIdx.x;
    const int n = len[b];
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
    if (last > MAX_SYMBOL || n_sym == 1) {
        if (t == 0) {
            out[0] = last > MAX_SYMBOL ? UNFIT : RLE;
            out[1] = last > MAX_SYMBOL ? n : 1;
        }
        return;
    }
    if (c) {  // the symbols ordered by (count, symbol)
        int r = 0;
        for (int s = 0; s < 256; s++) r += total[s] && (total[s] < c || (total[s] == c && s < t));
        order[r] = t;
    }
    __syncthreads();
    if (t == 0) {
        const int m = n_sym;
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
        int kraft = 0;
        for (int i = 0; i < m; i++) {
            depth[i] = depth[i] < MAX_BITS ? depth[i] : MAX_BITS;
            kraft += 1 << (MAX_BITS - depth[i]);
        }
        while (kraft > 1 << MAX_BITS) {
            int best = -1;
            for (int i = 0; i < m; i++)
                if (depth[i] < MAX_BITS && (best < 0 || depth[i] > depth[best])) best = i;
            depth[best]++;
            kraft -= 1 << (MAX_BITS - depth[best]);
        }
        while (kraft < 1 << MAX_BITS) {
            for (int i = m - 1; i >= 0; i--) {
                if (depth[i] > 1 && (1 << (MAX_BITS - depth[i])) <= (1 << MAX_BITS) - kraft) {
                    kraft += 1 << (MAX_BITS - depth[i]);
                    depth[i]--;
                    break;
                }
            }
        }
        for (int i = 0; i < m; i++) L[order[i]] = depth[i];
    }
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
        const int streams = n < ONE_STREAM_BELOW ? 1 : 4;
        int body = streams == 4 ? 6 : 0;
        for (int q = 0; q < streams; q++) {
            out[2 + q] = bits[q] / 8 + 1;
            body += out[2 + q];
        }
        const int head = n < ONE_STREAM_BELOW ? 3 : n < (1 << 14) ? 4 : 5;
        const int content = head + 1 + (last + 1) / 2 + body + 1;
        out[0] = content < n ? COMPRESSED : RAW;
        out[1] = content < n ? content : n;
        out[6] = last;
        out[7] = top;
    }
}

extern "C" __global__ void __launch_bounds__(T)
huf_write(const unsigned char* buf, const i64* src, const int* len, const int* info, const unsigned short* codes,
          const unsigned char* lengths, const i64* at, const i64* frame, const int* is_last, unsigned* out,
          i64 blocks) {
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
    const int last = in[6], top = in[7], streams = n < ONE_STREAM_BELOW ? 1 : 4;
    const int head = n < ONE_STREAM_BELOW ? 3 : n < (1 << 14) ? 4 : 5, tree = 1 + (last + 1) / 2;
    __syncthreads();
    if (t == 0) {
        const u64 size = (u64)(in[1] - head - 1);  // tree, jump table and streams
        const u64 h = head == 3 ? 2 | (u64)n << 4 | size << 14
                    : head == 4 ? 2 | 2 << 2 | (u64)n << 4 | size << 18 : 2 | 3 << 2 | (u64)n << 4 | size << 22;
        put_le(out, pos, h, head);
        put_byte(out, pos + head, 127 + last);
        for (int k = 0; k < last; k += 2) {
            const unsigned w0 = L[k] ? top + 1 - L[k] : 0, w1 = k + 1 < last && L[k + 1] ? top + 1 - L[k + 1] : 0;
            put_byte(out, pos + head + 1 + k / 2, w0 << 4 | w1);
        }
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
