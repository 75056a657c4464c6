#include "backend/operand.h"

#include "backend/op_common.h"
#include "core/error.h"

namespace ctx {

// ---------------------------------------------------------------- the defaults of backend.h

namespace {

[[noreturn]] void no_bf16_storage(const Backend& be, const char* op) {
    fail("{}: the {} backend does not store activations in bf16 (Backend::bf16_activations)", op,
         be.name());
}

}  // namespace

void Backend::layernorm_forward_bf16(Bf16*, float*, float*, const float*, const float*,
                                     const float*, int, int, float) {
    no_bf16_storage(*this, "layernorm_forward_bf16");
}

void Backend::rmsnorm_forward_bf16(Bf16*, float*, const float*, const float*, int, int, float) {
    no_bf16_storage(*this, "rmsnorm_forward_bf16");
}

void Backend::activation_forward_bf16(Bf16*, const float*, size_t, Activation) {
    no_bf16_storage(*this, "activation_forward_bf16");
}

void Backend::swiglu_forward_bf16(Bf16*, const float*, int, int) {
    no_bf16_storage(*this, "swiglu_forward_bf16");
}

void Backend::matmul_forward_bf16(float*, const Bf16*, const float*, const float*, int, int,
                                  int) {
    no_bf16_storage(*this, "matmul_forward_bf16");
}

void Backend::matmul_activation_forward_bf16(Bf16*, Bf16*, const Bf16*, const float*,
                                             const float*, int, int, int, Activation) {
    no_bf16_storage(*this, "matmul_activation_forward_bf16");
}

void Backend::matmul_residual_forward_bf16(float* out, const float* residual, const Bf16* inp,
                                           const float* W, const float* bias, int N, int IC,
                                           int OC) {
    CTX_CHECK(out != residual, "matmul_residual_forward_bf16: out must not be residual");
    matmul_forward_bf16(out, inp, W, bias, N, IC, OC);
    add(out, residual, out, static_cast<size_t>(N) * static_cast<size_t>(OC));
}

void Backend::matmul_backward_bf16(float*, float*, float*, const float*, const Bf16*,
                                   const float*, int, int, int, GradStore) {
    no_bf16_storage(*this, "matmul_backward_bf16");
}

void Backend::activation_matmul_backward_bf16(float*, float*, float*, float*, const float*,
                                              const Bf16*, const Bf16*, const float*, int, int,
                                              int, Activation, GradStore) {
    no_bf16_storage(*this, "activation_matmul_backward_bf16");
}

void Backend::mlp_backward_bf16(const MlpBackwardBf16& m) {
    if (!bf16_activations()) no_bf16_storage(*this, "mlp_backward_bf16");
    matmul_backward_bf16(m.dact, m.dW_proj, m.db_proj, m.dout, m.act_out, m.W_proj, m.N, m.OA(),
                         m.OP, GradStore::Overwrite);
    activation_matmul_backward_bf16(m.dinp, m.dW_fc, m.db_fc, m.dpre, m.dact, m.pre, m.inp, m.W_fc,
                                    m.N, m.IC, m.OC, m.act, m.dinp_store);
}

void Backend::lm_head_loss_bf16(float*, float*, float*, float*, const Bf16*, const float*,
                                const int32_t*, const float*, int, int, int, float) {
    no_bf16_storage(*this, "lm_head_loss_bf16");
}

void Backend::attention_forward_bf16(Bf16*, float*, const float*, const float*, int, int, int, int,
                                     const AttentionOptions&) {
    no_bf16_storage(*this, "attention_forward_bf16");
}

void Backend::attention_backward_bf16(float*, float*, const float*, const float*, const float*,
                                      const Bf16*, const float*, int, int, int, int,
                                      const AttentionOptions&) {
    no_bf16_storage(*this, "attention_backward_bf16");
}

// ---------------------------------------------------------------- Operand

float* Operand::fp32(const char* what) const {
    CTX_CHECK(!is_bf16(), "internal: {} reads activations as fp32, but they are stored in bf16",
              what);
    return f32;
}

void layernorm_forward(Backend& be, Operand out, float* mean, float* rstd, const float* inp,
                       const float* w, const float* b, int N, int C, float eps) {
    if (out.is_bf16())
        be.layernorm_forward_bf16(out.bf16, mean, rstd, inp, w, b, N, C, eps);
    else
        be.layernorm_forward(out.f32, mean, rstd, inp, w, b, N, C, eps);
}

void rmsnorm_forward(Backend& be, Operand out, float* rstd, const float* inp, const float* w,
                     int N, int C, float eps) {
    if (out.is_bf16())
        be.rmsnorm_forward_bf16(out.bf16, rstd, inp, w, N, C, eps);
    else
        be.rmsnorm_forward(out.f32, rstd, inp, w, N, C, eps);
}

void activation_forward(Backend& be, Operand out, const float* inp, size_t n, Activation act) {
    if (out.is_bf16())
        be.activation_forward_bf16(out.bf16, inp, n, act);
    else
        be.activation_forward(out.f32, inp, n, act);
}

void swiglu_forward(Backend& be, Operand out, const float* inp, int N, int F) {
    if (out.is_bf16())
        be.swiglu_forward_bf16(out.bf16, inp, N, F);
    else
        be.swiglu_forward(out.f32, inp, N, F);
}

void matmul_forward(Backend& be, float* out, Operand inp, const float* W, const float* bias,
                    int N, int IC, int OC) {
    if (inp.is_bf16())
        be.matmul_forward_bf16(out, inp.bf16, W, bias, N, IC, OC);
    else
        be.matmul_forward(out, inp.f32, W, bias, N, IC, OC);
}

void matmul_residual_forward(Backend& be, float* out, const float* residual, Operand inp,
                             const float* W, const float* bias, int N, int IC, int OC) {
    if (inp.is_bf16())
        be.matmul_residual_forward_bf16(out, residual, inp.bf16, W, bias, N, IC, OC);
    else
        be.matmul_residual_forward(out, residual, inp.f32, W, bias, N, IC, OC);
}

void matmul_activation_forward(Backend& be, Operand pre, Operand out, Operand inp,
                               const float* W, const float* bias, int N, int IC, int OC,
                               Activation act) {
    CTX_CHECK(out.is_bf16() == inp.is_bf16() && pre.is_bf16() == inp.is_bf16(),
              "internal: matmul_activation_forward's operands are stored differently");
    if (inp.is_bf16())
        be.matmul_activation_forward_bf16(pre.bf16, out.bf16, inp.bf16, W, bias, N, IC, OC, act);
    else
        be.matmul_activation_forward(pre.f32, out.f32, inp.f32, W, bias, N, IC, OC, act);
}

void matmul_backward(Backend& be, float* dinp, float* dW, float* dbias, const float* dout,
                     Operand inp, const float* W, int N, int IC, int OC, GradStore dinp_store) {
    if (inp.is_bf16())
        be.matmul_backward_bf16(dinp, dW, dbias, dout, inp.bf16, W, N, IC, OC, dinp_store);
    else
        be.matmul_backward(dinp, dW, dbias, dout, inp.f32, W, N, IC, OC, dinp_store);
}

void lm_head_loss(Backend& be, float* losses, float* dinp, float* dW, float* scratch,
                  Operand inp, const float* W, const int32_t* targets, const float* mask, int N,
                  int C, int V, float grad_scale) {
    if (inp.is_bf16())
        be.lm_head_loss_bf16(losses, dinp, dW, scratch, inp.bf16, W, targets, mask, N, C, V,
                             grad_scale);
    else
        be.lm_head_loss(losses, dinp, dW, scratch, inp.f32, W, targets, mask, N, C, V,
                        grad_scale);
}

void mlp_backward(Backend& be, MlpBackwardBf16 m, Operand pre, Operand act_out, Operand inp) {
    CTX_CHECK(pre.is_bf16() == inp.is_bf16() && act_out.is_bf16() == inp.is_bf16(),
              "internal: mlp_backward's operands are stored differently");
    if (inp.is_bf16()) {
        m.pre = pre.bf16;
        m.act_out = act_out.bf16;
        m.inp = inp.bf16;
        be.mlp_backward_bf16(m);
        return;
    }
    const int OA = m.OA();
    be.matmul_backward(m.dact, m.dW_proj, m.db_proj, m.dout, act_out.f32, m.W_proj, m.N, OA, m.OP,
                       GradStore::Overwrite);
    be.activation_matmul_backward(m.dinp, m.dW_fc, m.db_fc, m.dpre, m.dact, pre.f32, inp.f32,
                                  m.W_fc, m.N, m.IC, m.OC, m.act, m.dinp_store);
}

void activation_matmul_backward(Backend& be, float* dinp, float* dW, float* dbias, float* dpre,
                                const float* dact, Operand pre, Operand inp, const float* W,
                                int N, int IC, int OC, Activation act, GradStore dinp_store) {
    CTX_CHECK(pre.is_bf16() == inp.is_bf16(),
              "internal: activation_matmul_backward's operands are stored differently");
    if (inp.is_bf16())
        be.activation_matmul_backward_bf16(dinp, dW, dbias, dpre, dact, pre.bf16, inp.bf16, W, N,
                                           IC, OC, act, dinp_store);
    else
        be.activation_matmul_backward(dinp, dW, dbias, dpre, dact, pre.f32, inp.f32, W, N, IC,
                                      OC, act, dinp_store);
}

void attention_forward(Backend& be, Operand out, float* saved, const float* qkv,
                       const float* positions, int B, int T, int C, int H,
                       const AttentionOptions& opt) {
    if (out.is_bf16())
        be.attention_forward_bf16(out.bf16, saved, qkv, positions, B, T, C, H, opt);
    else
        be.attention_forward(out.f32, saved, qkv, positions, B, T, C, H, opt);
}

void attention_backward(Backend& be, float* dqkv, float* scratch, const float* dout,
                        const float* qkv, const float* saved, Operand out, const float* positions,
                        int B, int T, int C, int H, const AttentionOptions& opt) {
    if (out.is_bf16())
        be.attention_backward_bf16(dqkv, scratch, dout, qkv, saved, out.bf16, positions, B, T, C, H,
                                   opt);
    else
        be.attention_backward(dqkv, scratch, dout, qkv, saved, out.f32, positions, B, T, C, H, opt);
}

}  // namespace ctx
