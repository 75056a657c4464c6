// CUDA backend (private, device code only): the MLP activations' derivatives, one definition
// for every kernel that applies them (cuda_dense.cu's activation and SwiGLU backward,
// cuda_bf16.cu's fused backward into bf16), so those kernels compute the same fp32 values.
#pragma once

#include <cuda_runtime.h>

namespace ctx::cuda {

inline constexpr float kGeluTanhScale = 0.7978845608028654f;  // sqrt(2 / pi)
inline constexpr float kGeluCubic = 0.044715f;
inline constexpr float kInvSqrt2 = 0.7071067811865476f;
inline constexpr float kInvSqrt2Pi = 0.3989422804014327f;

// act'(x) for act 0 = GeluTanh, 1 = GeluErf, 3 = Relu (Activation's values)
__device__ __forceinline__ float activation_grad(float x, int act) {
    if (act == 0) {
        const float u = kGeluTanhScale * (x + kGeluCubic * x * x * x);
        const float t = tanhf(u);
        const float du = kGeluTanhScale * (1.0f + 3.0f * kGeluCubic * x * x);
        return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * du;
    }
    if (act == 3) return x > 0.0f ? 1.0f : 0.0f;
    const float cdf = 0.5f * (1.0f + erff(x * kInvSqrt2));
    const float pdf = kInvSqrt2Pi * expf(-0.5f * x * x);
    return cdf + x * pdf;
}

// SwiGLU, out = silu(g) * u: the gradients of gate g and up u for the output's gradient dy.
__device__ __forceinline__ float swiglu_gate_grad(float g, float u, float dy) {
    const float sig = 1.0f / (1.0f + expf(-g));
    return dy * u * sig * (1.0f + g * (1.0f - sig));
}
__device__ __forceinline__ float swiglu_up_grad(float g, float dy) {
    const float sig = 1.0f / (1.0f + expf(-g));
    return dy * g * sig;
}

}  // namespace ctx::cuda
