// CUDA backend, host side of bf16 activation storage (backend.h, "bf16 activation storage";
// docs/CUDA.md): the norms, the MLP's activation and SwiGLU write their outputs in bf16 (the
// kernels of cuda_dense.cu, templated on the output's type), and the products and the head read
// them as they are, where the fp32 storage rounds them into bf16_act_ on every call. Only in
// Precision::Bf16, whose products round those operands anyway: the same bits either way.
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_kernels.h"
#include "backend/op_common.h"
#include "core/error.h"

namespace ctx::cuda {

namespace {

uint16_t* bits(Bf16* p) { return reinterpret_cast<uint16_t*>(p); }
const uint16_t* bits(const Bf16* p) { return reinterpret_cast<const uint16_t*>(p); }

}  // namespace

void CudaBackend::require_bf16_activations(const char* op) const {
    CTX_CHECK(bf16_activations_,
              "{}: {} does not store activations in bf16 (precision bf16 does, unless "
              "CTX_BF16_ACTIVATIONS=0)",
              op, name_);
}

void CudaBackend::layernorm_forward_bf16(Bf16* out, float* mean, float* rstd, const float* inp,
                                         const float* w, const float* b, int N, int C,
                                         float eps) {
    static constexpr const char* op = "layernorm_forward_bf16";
    require_bf16_activations(op);
    activate();
    done(launch_layernorm_forward(bits(out), mean, rstd, inp, w, b, N, C, eps, stream_), op);
}

void CudaBackend::rmsnorm_forward_bf16(Bf16* out, float* rstd, const float* inp, const float* w,
                                       int N, int C, float eps) {
    static constexpr const char* op = "rmsnorm_forward_bf16";
    require_bf16_activations(op);
    activate();
    done(launch_layernorm_forward(bits(out), nullptr, rstd, inp, w, nullptr, N, C, eps, stream_),
         op);
}

void CudaBackend::activation_forward_bf16(Bf16* out, const float* inp, size_t n,
                                          Activation act) {
    static constexpr const char* op = "activation_forward_bf16";
    CTX_CHECK(act != Activation::SwiGLU, "internal: SwiGLU is gated; use swiglu_forward_bf16");
    require_bf16_activations(op);
    activate();
    done(launch_activation_forward(bits(out), inp, n, int(act), stream_), op);
}

void CudaBackend::swiglu_forward_bf16(Bf16* out, const float* inp, int N, int F) {
    static constexpr const char* op = "swiglu_forward_bf16";
    require_bf16_activations(op);
    activate();
    done(launch_swiglu_forward(bits(out), inp, N, F, stream_), op);
}

void CudaBackend::matmul_forward_bf16(float* out, const Bf16* inp, const float* W,
                                      const float* bias, int N, int IC, int OC) {
    static constexpr const char* op = "matmul_forward_bf16";
    require_bf16_activations(op);
    activate();
    forward_bf16(out, bits(inp), W, bias, N, IC, OC, op);
    if (sync_each_op_) sync(op);
}

void CudaBackend::matmul_residual_forward_bf16(float* out, const float* residual,
                                               const Bf16* inp, const float* W, const float* bias,
                                               int N, int IC, int OC) {
    static constexpr const char* op = "matmul_residual_forward_bf16";
    CTX_CHECK(out != residual, "{}: out must not be residual", op);
    require_bf16_activations(op);
    activate();
    forward_bf16(out, bits(inp), W, bias, N, IC, OC, op, residual);
    if (sync_each_op_) sync(op);
}

void CudaBackend::matmul_backward_bf16(float* dinp, float* dW, float* dbias, const float* dout,
                                       const Bf16* inp, const float* W, int N, int IC, int OC,
                                       GradStore dinp_store) {
    static constexpr const char* op = "matmul_backward_bf16";
    require_bf16_activations(op);
    activate();
    backward_bf16(dinp, dW, dbias, dout, bits(inp), W, N, IC, OC, dinp_store, op);
    if (sync_each_op_) sync(op);
}

// GELU (tanh form): one cuBLASLt product whose epilogue adds the bias, keeps pre and writes
// gelu(pre), both rounded to bf16 as it stores them (GELU_AUX_BIAS with bf16 D and aux): the
// product's only writes are the two bf16 activations. Otherwise (other activations, a width or
// configuration cuBLASLt refuses, CTX_MLP_GELU=kernel) the product in fp32 into mlp_pre_ (bias
// in the epilogue), then one activation kernel writes pre rounded and the activation of the
// fp32 value rounded: out has the bits of the fp32-storage op's unfused path, rounded.
void CudaBackend::matmul_activation_forward_bf16(Bf16* pre, Bf16* out, const Bf16* inp,
                                                 const float* W, const float* bias, int N, int IC,
                                                 int OC, Activation act) {
    static constexpr const char* op = "matmul_activation_forward_bf16";
    require_bf16_activations(op);
    CTX_CHECK(N >= 0 && IC >= 1 && OC >= 1, "{}: bad shape N {} IC {} OC {}", op, N, IC, OC);
    check_swiglu_width(op, OC, act);
    if (N == 0) return;
    activate();
    const uint16_t* w = round_to_bf16(W, size_t(OC) * IC, bf16_weight_, op);
    if (act == Activation::GeluTanh && mlp_gelu_epilogue_ && lt_.takes(OC, true, true)) {
        BlasLt::Product lt{N, IC, OC, true, bits(inp), w, bias, bits(out), bits(pre)};
        lt.out_bf16 = true;
        if (lt_.forward(lt, stream_, op)) {
            if (sync_each_op_) sync(op);
            return;
        }
    }
    float* p = mlp_pre_.ensure(size_t(N) * size_t(OC), op);
    forward_bf16_rounded(p, bits(inp), w, bias, N, IC, OC, op);
    if (act == Activation::SwiGLU)
        done(launch_swiglu_forward(bits(out), p, N, OC / 2, stream_, bits(pre)), op);
    else
        done(launch_activation_forward(bits(out), p, size_t(N) * size_t(OC), int(act), stream_,
                                       bits(pre)),
             op);
}

void CudaBackend::activation_matmul_backward_bf16(float* dinp, float* dW, float* dbias,
                                                  float* dpre, const float* dact,
                                                  const Bf16* pre, const Bf16* inp,
                                                  const float* W, int N, int IC, int OC,
                                                  Activation act, GradStore dinp_store) {
    static constexpr const char* op = "activation_matmul_backward_bf16";
    require_bf16_activations(op);  // first, as the default refuses (the same error everywhere)
    check_activation_matmul_backward(op, dpre, dact, pre, N, IC, OC, act);
    activate();
    activation_products_bf16(dinp, dW, dbias, dact, nullptr, bits(pre), bits(inp), W, N, IC, OC,
                             act, dinp_store, op);
    if (sync_each_op_) sync(op);
}

}  // namespace ctx::cuda
