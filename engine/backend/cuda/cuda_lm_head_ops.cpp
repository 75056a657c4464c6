// CUDA backend, host side of the language-model head fused with its softmax cross-entropy
// (Backend::lm_head_loss; the loss kernel is in cuda_lm_head.cu). Per chunk of rows:
//   logits (n, Vp) = x (n, C) @ W^T                     cuBLAS, into the caller's scratch
//   losses, dl (n, Vp) = mask * grad_scale * (softmax - onehot), 0 in columns [V, Vp)
//   dinp (n, C) += dl @ W;  dW (V, C) += dl^T @ x       cuBLAS, beta = 1
// Vp = V rounded up to 64: every row of the logits and of dl starts 256-byte aligned, which
// cuBLAS's tensor-core kernels want of a leading dimension (GPT-2's V = 50257 is odd and denied
// them every product with the whole (N, V) logits). In Precision::Bf16 the weight is rounded
// once per call into a (Vp, C) bf16 copy whose padding rows are zero, the rows once per call
// (unless they are stored in bf16: lm_head_loss_bf16), and the loss kernel writes dl in bf16
// itself: the products' operands, with no rounding pass.
#include <algorithm>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_bf16.h"
#include "backend/op_common.h"
#include "core/error.h"

namespace ctx::cuda {

namespace {

// 256 MiB of fp32 logits per chunk: at GPT-2's vocabulary about 1300 rows, products large
// enough to keep the tensor cores busy, a fifth of the (8192, 50257) logits' memory.
constexpr size_t kChunkMib = 256;

int padded_vocab(int V) { return (V + 63) / 64 * 64; }

int most_rows(int V) {
    return lm_head_most_rows(static_cast<size_t>(padded_vocab(V)),
                             lm_head_chunk_budget_floats(kChunkMib));
}

}  // namespace

int CudaBackend::lm_head_chunk_rows(int N, int V) const { return lm_head_rows_for(N, most_rows(V)); }

size_t CudaBackend::lm_head_scratch_floats(int N, int V) const {
    return static_cast<size_t>(std::min(std::max(N, 1), most_rows(V))) *
           static_cast<size_t>(padded_vocab(V));
}

void CudaBackend::lm_head_loss(float* losses, float* dinp, float* dW, float* scratch,
                               const float* inp, const float* W, const int32_t* targets,
                               const float* mask, int N, int C, int V, float grad_scale) {
    lm_head(losses, dinp, dW, scratch, inp, nullptr, W, targets, mask, N, C, V, grad_scale,
            "lm_head_loss");
}

void CudaBackend::lm_head_loss_bf16(float* losses, float* dinp, float* dW, float* scratch,
                                    const Bf16* inp, const float* W, const int32_t* targets,
                                    const float* mask, int N, int C, int V, float grad_scale) {
    static constexpr const char* op = "lm_head_loss_bf16";
    require_bf16_activations(op);
    lm_head(losses, dinp, dW, scratch, nullptr, reinterpret_cast<const uint16_t*>(inp), W,
            targets, mask, N, C, V, grad_scale, op);
}

// x is inp (fp32) or inp16 (bf16 activation storage; only in Precision::Bf16).
void CudaBackend::lm_head(float* losses, float* dinp, float* dW, float* scratch,
                          const float* inp, const uint16_t* inp16, const float* W,
                          const int32_t* targets, const float* mask, int N, int C, int V,
                          float grad_scale, const char* op) {
    check_lm_head(N, C, V, dinp, dW);
    if (N == 0) return;
    activate();
    if (targets != staged_.targets || targets == nullptr) {  // staged: checked by the caller
        const int32_t* h_tgt = host_view(targets, size_t(N), h_ints_, op);
        check_targets(h_tgt, host_view(mask, size_t(N), h_mask_, op), N, V);
    }
    const int32_t* tgt = device_view(targets, size_t(N), d_targets_, op);
    const int Vp = padded_vocab(V), R = lm_head_chunk_rows(N, V);
    const bool bf16 = precision_ == Precision::Bf16;
    const uint16_t *w16 = nullptr, *x16 = nullptr;
    if (bf16) {  // W (V, C) -> (Vp, C) bf16, rows [V, Vp) zero: logits 0 there, nothing to dinp
        uint16_t* w = bf16_weight_.ensure(size_t(Vp) * C, op);
        check(launch_round_to_bf16(w, W, size_t(V) * C, stream_), op);
        if (Vp > V)
            check(cudaMemsetAsync(w + size_t(V) * C, 0, size_t(Vp - V) * C * sizeof(uint16_t),
                                  stream_),
                  op);
        w16 = w;
        x16 = inp16 != nullptr ? inp16 : round_to_bf16(inp, size_t(N) * C, bf16_act_, op);
    }
    for (int r0 = 0; r0 < N; r0 += R) {
        const int n = std::min(R, N - r0);
        const size_t o = static_cast<size_t>(r0);
        const float* m = mask != nullptr ? mask + o : nullptr;
        float* logits = scratch;  // (n, Vp)
        if (bf16) {
            const uint16_t* x = x16 + o * C;
            // logits (n, Vp) = bf16(x) (n, C) @ bf16(W)^T (C, Vp)
            gemm_bf16(op, false, true, n, Vp, C, 1.0f, x, C, w16, C, 0.0f, logits, Vp);
            uint16_t* g = dinp != nullptr ? bf16_grad_.ensure(size_t(n) * Vp, op) : nullptr;
            check(launch_xent_rows(losses + o, nullptr, g, Vp, logits, Vp, tgt + o, m, n, V,
                                   grad_scale, stream_),
                  op);
            if (dinp == nullptr) continue;
            // dinp (n, C) += dl (n, Vp) @ bf16(W) (Vp, C)
            gemm_bf16(op, false, false, n, C, Vp, 1.0f, g, Vp, w16, C, 1.0f, dinp + o * C, C);
            // dW (V, C) += dl^T (V, n) @ bf16(x) (n, C): the first V columns of dl
            gemm_bf16(op, true, false, V, C, n, 1.0f, g, Vp, x, C, 1.0f, dW, C);
        } else {
            const float* x = inp + o * C;
            // logits (n, V), row stride Vp = x (n, C) @ W^T (C, V)
            gemm(op, false, true, n, V, C, 1.0f, x, C, W, C, 0.0f, logits, Vp);
            check(launch_xent_rows(losses + o, dinp != nullptr ? logits : nullptr, nullptr, Vp,
                                   logits, Vp, tgt + o, m, n, V, grad_scale, stream_),
                  op);
            if (dinp == nullptr) continue;
            // dinp (n, C) += dl (n, V) @ W (V, C);  dW (V, C) += dl^T (V, n) @ x (n, C)
            gemm(op, false, false, n, C, V, 1.0f, logits, Vp, W, C, 1.0f, dinp + o * C, C);
            gemm(op, true, false, V, C, n, 1.0f, logits, Vp, x, C, 1.0f, dW, C);
        }
    }
    if (sync_each_op_) sync(op);
}

}  // namespace ctx::cuda
