// An activation that matrix products read (a norm's output, the MLP's activation and
// pre-activation, the attention output), in the storage its backend keeps it in: fp32, or bf16 on a
// backend whose bf16_activations() is true (backend.h, "bf16 activation storage"). The model's one
// code path passes Operands, and the functions below run the op for the storage: its fp32 form, or
// its
// *_bf16 form.
#pragma once

#include <cstddef>

#include "backend/backend.h"

namespace ctx {

struct Operand {
    float* f32 = nullptr;
    Bf16* bf16 = nullptr;

    Operand() = default;
    // fp32 storage: implicit, so that code holding fp32 buffers passes them as they are
    Operand(float* p) : f32(p) {}  // NOLINT(google-explicit-constructor)
    static Operand in_bf16(Bf16* p) {
        Operand o;
        o.bf16 = p;
        return o;
    }
    bool is_bf16() const { return bf16 != nullptr; }
    // The operand `elems` elements further on (a layer's or a row's slice), same storage.
    Operand at(size_t elems) const {
        return is_bf16() ? in_bf16(bf16 + elems) : Operand(f32 + elems);
    }
    // The fp32 buffer, for the paths that read activations as floats (contextual sparsity,
    // sequence-parallel gathers); a bf16 operand there is an internal error naming `what`.
    float* fp32(const char* what) const;
};

// Storage elements (floats) a buffer of n activations takes: n in fp32, n / 2 rounded up in bf16.
inline size_t operand_floats(size_t n, bool bf16) { return bf16 ? (n + 1) / 2 : n; }

// The ops of backend.h on Operands. Where operands meet (the MLP's product, its pre-activation
// and activation), all have the same storage.
void layernorm_forward(Backend& be, Operand out, float* mean, float* rstd, const float* inp,
                       const float* w, const float* b, int N, int C, float eps);
void rmsnorm_forward(Backend& be, Operand out, float* rstd, const float* inp, const float* w,
                     int N, int C, float eps);
void activation_forward(Backend& be, Operand out, const float* inp, size_t n, Activation act);
void swiglu_forward(Backend& be, Operand out, const float* inp, int N, int F);
void matmul_forward(Backend& be, float* out, Operand inp, const float* W, const float* bias,
                    int N, int IC, int OC);
void matmul_residual_forward(Backend& be, float* out, const float* residual, Operand inp,
                             const float* W, const float* bias, int N, int IC, int OC);
void matmul_activation_forward(Backend& be, Operand pre, Operand out, Operand inp,
                               const float* W, const float* bias, int N, int IC, int OC,
                               Activation act);
void matmul_backward(Backend& be, float* dinp, float* dW, float* dbias, const float* dout,
                     Operand inp, const float* W, int N, int IC, int OC,
                     GradStore dinp_store = GradStore::Accumulate);
void activation_matmul_backward(Backend& be, float* dinp, float* dW, float* dbias, float* dpre,
                                const float* dact, Operand pre, Operand inp, const float* W,
                                int N, int IC, int OC, Activation act,
                                GradStore dinp_store = GradStore::Accumulate);
// The MLP's backward (backend.h MlpBackwardBf16; its pre, act_out and inp come from the
// Operands, all of one storage): bf16 storage runs Backend::mlp_backward_bf16, fp32 storage
// matmul_backward (dact written) then activation_matmul_backward.
void mlp_backward(Backend& be, MlpBackwardBf16 m, Operand pre, Operand act_out, Operand inp);
void attention_forward(Backend& be, Operand out, float* saved, const float* qkv,
                       const float* positions, int B, int T, int C, int H,
                       const AttentionOptions& opt);
void attention_backward(Backend& be, float* dqkv, float* scratch, const float* dout,
                        const float* qkv, const float* saved, Operand out, const float* positions,
                        int B, int T, int C, int H, const AttentionOptions& opt);
void lm_head_loss(Backend& be, float* losses, float* dinp, float* dW, float* scratch,
                  Operand inp, const float* W, const int32_t* targets, const float* mask, int N,
                  int C, int V, float grad_scale);

}  // namespace ctx
