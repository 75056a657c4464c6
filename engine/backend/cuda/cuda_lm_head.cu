// CUDA backend kernel of the softmax cross-entropy: the crossentropy_* ops (whole logits, in
// place) and the language-model head's fused loss (Backend::lm_head_loss; its host side and
// products are in cuda_lm_head_ops.cpp): logit rows with a row stride, the gradient written as
// fp32 (in place) or straight into the bf16 operand of the head's backward products, so no
// separate rounding pass reads it again.
//
// Determinism: one block per row; the running maxima and sums of the threads merge in a fixed
// tree (lanes, then warps). No atomics.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>

#include "backend/cuda/cuda_device.cuh"
#include "backend/cuda/cuda_kernels.h"

namespace ctx::cuda {

namespace {

constexpr int kThreads = 256;

// (m, s) <- the merge of two running softmax states: s sums exp(x - m) over the values seen.
__device__ __forceinline__ void merge_softmax(float& m, float& s, float m2, float s2) {
    const float M = fmaxf(m, m2);
    if (M == -INFINITY) return;  // both empty
    s = s * expf(m - M) + s2 * expf(m2 - M);
    m = M;
}

// The block's (max, sum of exp(x - max)); every thread gets it. shared: 64 floats.
__device__ __forceinline__ void block_softmax_state(float& m, float& s, float* shared) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float m2 = __shfl_xor_sync(kFullMask, m, o), s2 = __shfl_xor_sync(kFullMask, s, o);
        merge_softmax(m, s, m2, s2);  // symmetric: both lanes of a pair get the same bits
    }
    if (lane == 0) {
        shared[warp] = m;
        shared[32 + warp] = s;
    }
    __syncthreads();
    m = lane < nw ? shared[lane] : -INFINITY;
    s = lane < nw ? shared[32 + lane] : 0.0f;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float m2 = __shfl_xor_sync(kFullMask, m, o), s2 = __shfl_xor_sync(kFullMask, s, o);
        merge_softmax(m, s, m2, s2);
    }
    __syncthreads();
}

template <class G>
__device__ __forceinline__ G to_grad(float v);
template <>
__device__ __forceinline__ float to_grad<float>(float v) { return v; }
template <>
__device__ __forceinline__ __nv_bfloat16 to_grad<__nv_bfloat16>(float v) {
    return __float2bfloat16_rn(v);
}

// Row n of logits (rows, ldl), columns [0, V): losses[n] = mask * (log sum exp - logit[target]);
// dl != null: dl (rows, ldd) = grad_scale * mask * (softmax - onehot) in columns [0, V) and 0 in
// [V, ldd) (the padding the backward products read). One pass for the max and the sum (online
// softmax), one for the gradient. dl may alias logits (G = float, ldd == ldl): each element is
// read and written by one thread, and the target logit is read before the first barrier.
template <class G>
__global__ void xent_rows_kernel(float* losses, G* dl, int ldd, const float* logits, int ldl,
                                 const int32_t* targets, const float* mask, int V,
                                 float grad_scale) {
    __shared__ float red[64];
    const int n = blockIdx.x;
    const float mk = mask != nullptr ? mask[n] : 1.0f;
    const float* x = logits + size_t(n) * ldl;
    G* d = dl != nullptr ? dl + size_t(n) * ldd : nullptr;
    if (mk == 0.0f) {
        if (threadIdx.x == 0) losses[n] = 0.0f;
        if (d != nullptr)
            for (int i = threadIdx.x; i < ldd; i += blockDim.x) d[i] = to_grad<G>(0.0f);
        return;
    }
    int t = targets[n];
    t = t < 0 ? 0 : (t >= V ? V - 1 : t);  // validated on the host; never read outside
    const float xt = x[t];
    float m = -INFINITY, s = 0.0f;
    for (int i = threadIdx.x; i < V; i += blockDim.x) {
        const float v = x[i];
        if (v > m) {
            s = s * expf(m - v) + 1.0f;
            m = v;
        } else {
            s += expf(v - m);
        }
    }
    block_softmax_state(m, s, red);
    if (threadIdx.x == 0) losses[n] = mk * (logf(s) + m - xt);
    if (d == nullptr) return;
    const float g = grad_scale * mk, sc = g / s;
    for (int i = threadIdx.x; i < V; i += blockDim.x) {
        const float p = expf(x[i] - m) * sc;
        d[i] = to_grad<G>(i == t ? p - g : p);
    }
    for (int i = V + threadIdx.x; i < ldd; i += blockDim.x) d[i] = to_grad<G>(0.0f);
}

}  // namespace

cudaError_t launch_xent_rows(float* losses, float* dl_f32, uint16_t* dl_bf16, int ldd,
                             const float* logits, int ldl, const int32_t* targets,
                             const float* mask, int N, int V, float grad_scale, cudaStream_t s) {
    if (N <= 0) return cudaSuccess;
    if (ldl < V || ((dl_f32 != nullptr || dl_bf16 != nullptr) && ldd < V) ||
        (dl_f32 != nullptr && dl_bf16 != nullptr))
        return cudaErrorInvalidValue;
    if (dl_bf16 != nullptr)
        xent_rows_kernel<__nv_bfloat16><<<N, kThreads, 0, s>>>(
            losses, reinterpret_cast<__nv_bfloat16*>(dl_bf16), ldd, logits, ldl, targets, mask,
            V, grad_scale);
    else
        xent_rows_kernel<float><<<N, kThreads, 0, s>>>(losses, dl_f32, ldd, logits, ldl, targets,
                                                       mask, V, grad_scale);
    return cudaGetLastError();
}

}  // namespace ctx::cuda
