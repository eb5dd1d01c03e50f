// The per-slot Markov bias: out[b, d] = mult * (z[b, d] + dot(W2[d, :], e[b, :])).
//
// z: [B, V] f32, e: [B, r] f32, W2: [V, r] (f32, f16 or bf16), out: [B, V] f32 (may alias z).
// One warp per (b, d) output: lanes stride over r, then a shuffle reduction. Warps of a block take
// consecutive d of one b, so the block's e[b] row stays in L1 and W2 rows stream once per b.
// f16/bf16 weights are widened with plain bit operations / cvt (no fp16 headers).

#include <stdint.h>

__device__ __forceinline__ float load_w(const float *w, size_t i) { return w[i]; }

struct Bf16Bits { uint16_t bits; };
struct F16Bits { uint16_t bits; };

__device__ __forceinline__ float load_w(const Bf16Bits *w, size_t i) {
    return __uint_as_float(((uint32_t)w[i].bits) << 16);
}

__device__ __forceinline__ float load_w(const F16Bits *w, size_t i) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(w[i].bits));
    return f;
}

template <typename W>
__device__ __forceinline__ void markov_bias(const size_t batch, const size_t vocab,
                                            const size_t r, const float mult, const float *z,
                                            const W *w2, const float *e, float *out) {
    const unsigned lane = threadIdx.x & 31u;
    const size_t warps_per_block = blockDim.x >> 5;
    const size_t warp = (size_t)blockIdx.x * warps_per_block + (threadIdx.x >> 5);
    const size_t total_warps = (size_t)gridDim.x * warps_per_block;
    const size_t outputs = batch * vocab;
    for (size_t o = warp; o < outputs; o += total_warps) {
        const size_t b = o / vocab;
        const size_t d = o % vocab;
        const W *wrow = w2 + d * r;
        const float *erow = e + b * r;
        float acc = 0.0f;
        for (size_t j = lane; j < r; j += 32) {
            acc = fmaf(load_w(wrow, j), erow[j], acc);
        }
        for (int off = 16; off > 0; off >>= 1) {
            acc += __shfl_xor_sync(0xffffffffu, acc, off);
        }
        if (lane == 0) {
            out[o] = mult * (z[o] + acc);
        }
    }
}

#define BIAS_OP(NAME, W)                                                                         \
    extern "C" __global__ void NAME(const size_t batch, const size_t vocab, const size_t r,      \
                                    const float mult, const float *z, const W *w2,               \
                                    const float *e, float *out) {                                \
        markov_bias<W>(batch, vocab, r, mult, z, w2, e, out);                                    \
    }

BIAS_OP(dspark_markov_bias_f32, float)
BIAS_OP(dspark_markov_bias_f16, F16Bits)
BIAS_OP(dspark_markov_bias_bf16, Bf16Bits)
