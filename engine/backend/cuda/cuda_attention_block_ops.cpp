// CUDA backend, host side: attention across blocks of a row (Backend::attention_block_*, context
// parallelism; backend.h). Kernels in cuda_attention_block.cu, which documents them.
//
// The argument checks are the CPU backend's (cpu_attention_block.cpp, same messages) plus the
// device-memory rule of this backend: the blocks' token data (AttnBlockRows: index, positions,
// doc_start) are read by the kernels, so they must be device memory (backend memory, as
// backend.h says); a Table bias and its gradient too (BiasStaging checks them). Bias parameters
// a, b may be host memory (fixed ALiBi slopes) and are staged as for attention_forward.
//
// Backward: dq, dtable and the bias-parameter partial sums per (b, h, query tile), dk and dv per
// (b, h, key tile), then one fixed-order reduction of the partials (in d_block_partials_, double)
// into da / db. Every op enqueues on stream_ and returns.
#include "backend/backend.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/op_common.h"
#include "core/error.h"

namespace ctx::cuda {

namespace {

void check_rows(const AttnBlockRows& r, const char* which, const char* op) {
    CTX_CHECK(is_device_memory(r.index) && is_device_memory(r.positions) &&
                  (r.doc_start == nullptr || is_device_memory(r.doc_start)),
              "{}: the {} block's index, positions and doc_start must be device memory of the "
              "backend",
              op, which);
}

// The CPU backend's checks (same messages), then device memory for the blocks' tokens.
void check_block(const float* q, const float* kv, const AttnBlockRows& qr,
                 const AttnBlockRows& kr, int C, int H, const AttentionOptions& opt,
                 const char* op) {
    CTX_CHECK(q && kv && qr.index && kr.index && qr.positions && kr.positions,
              "attention_block: q, kv and both blocks' indices and positions are required");
    CTX_CHECK(qr.T >= 0 && kr.T >= 0, "attention_block: negative block length");
    check_attention(1, C, H, opt);
    CTX_CHECK(opt.bias.kind != BiasKind::Table || opt.bias.table,
              "attention_block: a Table bias needs its (B, H, Tq, Tk) table");
    check_rows(qr, "query", op);
    check_rows(kr, "key", op);
}

}  // namespace

void CudaBackend::attention_block_forward(float* out_b, float* lse_b, const float* q,
                                          const float* kv, const AttnBlockRows& qrows,
                                          const AttnBlockRows& krows, int B, int C, int H,
                                          const AttentionOptions& opt) {
    static constexpr const char* op = "attention_block_forward";
    check_block(q, kv, qrows, krows, C, H, opt, op);
    if (B <= 0 || qrows.T == 0) return;
    activate();
    const BiasArgs ba = bias_args(opt.bias, H, op);
    // Tk == 0 too: the kernel writes out_b = 0, lse_b = -inf (no visible key)
    done(launch_attention_block_forward(out_b, lse_b, q, kv, qrows, krows, B, C, H, opt.window,
                                        ba, stream_),
         op);
}

void CudaBackend::attention_block_merge(float* out, float* lse, const float* out_b,
                                        const float* lse_b, int B, int Tq, int C, int H) {
    static constexpr const char* op = "attention_block_merge";
    CTX_CHECK(H > 0 && C % H == 0, "attention: d_model {} is not divisible by {} heads", C, H);
    CTX_CHECK(Tq >= 0, "attention_block: negative block length");
    if (B <= 0 || Tq == 0) return;
    activate();
    done(launch_attention_block_merge(out, lse, out_b, lse_b, B, Tq, C, H, stream_), op);
}

void CudaBackend::attention_block_backward(float* dq, float* dkv, const float* dout,
                                           const float* q, const float* kv, const float* out,
                                           const float* lse, const AttnBlockRows& qrows,
                                           const AttnBlockRows& krows, int B, int C, int H,
                                           const AttentionOptions& opt) {
    static constexpr const char* op = "attention_block_backward";
    check_block(q, kv, qrows, krows, C, H, opt, op);
    CTX_CHECK(dq && dkv && dout && out && lse,
              "{}: dq, dkv, dout and the merged forward's out and lse are required", op);
    if (B <= 0 || qrows.T == 0 || krows.T == 0) return;
    activate();
    const BiasSpec& bs = opt.bias;
    const BiasArgs ba = bias_args(bs, H, op);
    const bool bias_grads = bs.kind != BiasKind::None && bs.kind != BiasKind::Table &&
                            (bs.da != nullptr || bs.db != nullptr);
    double* partials =
        bias_grads ? d_block_partials_.ensure(
                         attention_block_partials(B, qrows.T, H, ba.kind, ba.nb), op)
                   : nullptr;
    float* dtable = bs.kind == BiasKind::Table ? bs.dtable : nullptr;
    done(launch_attention_block_backward(dq, dkv, partials, bs.da, bs.db, dtable, dout, q, kv, out,
                                         lse, qrows, krows, B, C, H, opt.window, ba, stream_),
         op);
}

}  // namespace ctx::cuda
