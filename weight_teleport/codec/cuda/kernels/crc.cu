// CRC-32 (zlib's) of many byte ranges of one device buffer, in one launch (codec/cuda/kernels/crc.py).
//
// A CTA takes LANES consecutive pieces of PIECE bytes of one range, counted from the range's
// start (the last may be short), a thread each. A thread runs the CRC of its piece eight bytes
// a step with slicing-by-8 tables in shared memory (16-byte loads once its bytes are aligned),
// then moves it to its place in the range by multiplying with x^(8 * bytes after the piece)
// modulo the polynomial (zlib's crc32_combine); the range's CRC is the XOR of its pieces'
// terms (an atomic XOR). The Triton kernel of crc.py computes the same CRCs a byte and a
// dependent table load from global memory a step, several times slower; it serves Triton's
// interpreter and GPUs NVRTC cannot reach.

#define POLY 0xEDB88320u
#define LANES 128

typedef long long i64;

// a * b modulo the polynomial, bit-reflected (zlib's multmodp), without branches.
__device__ __forceinline__ unsigned multmodp(unsigned a, unsigned b) {
    unsigned p = 0;
#pragma unroll
    for (int i = 0; i < 32; i++) {
        p ^= b & (0u - ((a >> (31 - i)) & 1u));
        b = (b >> 1) ^ (POLY & (0u - (b & 1u)));
    }
    return p;
}

// Eight bytes (lo: the first four) into the CRC register c.
__device__ __forceinline__ unsigned step8(const unsigned (*t)[256], unsigned c, unsigned lo, unsigned hi) {
    lo ^= c;
    return t[7][lo & 0xff] ^ t[6][(lo >> 8) & 0xff] ^ t[5][(lo >> 16) & 0xff] ^ t[4][lo >> 24] ^
           t[3][hi & 0xff] ^ t[2][(hi >> 8) & 0xff] ^ t[1][(hi >> 16) & 0xff] ^ t[0][hi >> 24];
}

// tables: the 8 slicing tables (256 entries each), then x^(2^k) modulo the polynomial for
// k < 32. progs[2 * i], progs[2 * i + 1]: the range and first piece of CTA i. ranges[2 * r],
// ranges[2 * r + 1]: offset and length of range r (pieces past its end add nothing). out[r]
// starts at 0.
extern "C" __global__ void __launch_bounds__(LANES)
crc_ranges(const unsigned char* data, const unsigned* tables, const i64* progs, const i64* ranges, int* out,
           i64 programs) {
    __shared__ unsigned t[8][256];
    for (int i = threadIdx.x; i < 8 * 256; i += LANES) (&t[0][0])[i] = tables[i];
    __syncthreads();
    const i64 r = progs[2 * blockIdx.x], j = progs[2 * blockIdx.x + 1] + threadIdx.x;
    const i64 length = ranges[2 * r + 1], lo = j * PIECE;
    if (lo >= length) return;
    const unsigned char* p = data + ranges[2 * r] + lo;
    const int n = (int)min((i64)PIECE, length - lo);
    unsigned c = 0xffffffffu;
    int i = 0;
    for (; i < n && ((unsigned long long)(p + i) & 15ull); i++) c = t[0][(c ^ p[i]) & 0xff] ^ (c >> 8);
    for (; i + 16 <= n; i += 16) {
        const uint4 v = __ldcs((const uint4*)(p + i));
        c = step8(t, c, v.x, v.y);
        c = step8(t, c, v.z, v.w);
    }
    for (; i < n; i++) c = t[0][(c ^ p[i]) & 0xff] ^ (c >> 8);
    c ^= 0xffffffffu;
    // x^(8 * after) (zlib's x2nmodp(after, 3)), then the piece's term
    unsigned shift = 0x80000000u;  // x^0
    const unsigned* x2n = tables + 8 * 256;
    int k = 3;
    for (i64 after = length - lo - n; after; after >>= 1, k++)
        if (after & 1) shift = multmodp(x2n[k & 31], shift);
    atomicXor((unsigned*)out + r, multmodp(shift, c));
}
