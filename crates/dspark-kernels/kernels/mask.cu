// Padded vocabulary columns -> -inf: dst[i] = (i % cols) >= valid ? NEG_INF : src[i].
//
// The op only copies values or writes the -inf bit pattern, so one kernel per element width
// serves every dtype (f16 and bf16 share the 16-bit one; the caller passes the pattern:
// f16 0xFC00, bf16 0xFF80, f32 0xFF800000, f64 0xFFF0000000000000). No fp16 headers needed.
// Grid-stride loop over n = rows * cols elements; src and dst are contiguous and may alias.

#include <stdint.h>

template <typename T>
__device__ __forceinline__ void mask_padded(const size_t n, const size_t cols, const size_t valid,
                                            const T neg_inf, const T *src, T *dst) {
    const size_t stride = (size_t)blockDim.x * gridDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        dst[i] = (i % cols) >= valid ? neg_inf : src[i];
    }
}

#define MASK_OP(NAME, T)                                                                         \
    extern "C" __global__ void NAME(const size_t n, const size_t cols, const size_t valid,       \
                                    const T neg_inf, const T *src, T *dst) {                     \
        mask_padded<T>(n, cols, valid, neg_inf, src, dst);                                       \
    }

MASK_OP(dspark_mask_padded_b16, uint16_t)
MASK_OP(dspark_mask_padded_b32, uint32_t)
MASK_OP(dspark_mask_padded_b64, uint64_t)
