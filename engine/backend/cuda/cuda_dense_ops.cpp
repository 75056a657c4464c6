// CUDA backend, host side: token + position embedding, layer norm, dense layer (cuBLAS sgemm, or
// bf16 cublasGemmEx with fp32 accumulation in Precision::Bf16), GELU, softmax cross-entropy and
// AdamW. Validation mirrors the CPU backend (same checks, same messages); kernels are in
// cuda_dense.cu (and the bf16 rounding in cuda_bf16.cu).
#include <algorithm>
#include <cmath>
#include <numeric>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_bf16.h"  // the bf16 rounding launchers
#include "backend/op_common.h"
#include "core/error.h"

namespace ctx::cuda {

namespace {

// Groups of a deterministic scatter-add (launch_grouped_row_add), packed as
// [target (G) | start (G + 1) | row (K)] for one upload. Entries k = 0 .. K-1 add source row
// src[k] (times weight[k]) into destination dst[k]; entries are grouped by destination in a
// stable order (so each destination's sum runs in the order of its entries).
int build_groups(const std::vector<int>& dst, const std::vector<int>& src,
                 const std::vector<float>* weight, std::vector<int>& order,
                 std::vector<int32_t>& packed, std::vector<float>* packed_weight) {
    const size_t K = dst.size();
    order.resize(K);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int x, int y) { return dst[x] < dst[y]; });
    int G = 0;
    for (size_t k = 0; k < K; k++)
        if (k == 0 || dst[order[k]] != dst[order[k - 1]]) G++;
    packed.assign(size_t(G) + size_t(G) + 1 + K, 0);
    int32_t* target = packed.data();
    int32_t* start = target + G;
    int32_t* row = start + G + 1;
    if (packed_weight != nullptr) packed_weight->assign(K, 0.0f);
    int g = -1;
    for (size_t k = 0; k < K; k++) {
        const int e = order[k];
        if (k == 0 || dst[e] != dst[order[k - 1]]) {
            g++;
            target[g] = dst[e];
            start[g] = int32_t(k);
        }
        row[k] = src[e];
        if (packed_weight != nullptr) (*packed_weight)[k] = (*weight)[e];
    }
    start[G] = int32_t(K);
    return G;
}

// The row length of bf16(dout) for the backward products: OC rounded up to a multiple of 8 (16
// bytes, zeros past OC), the alignment cuBLAS's tensor-core kernels want of a leading dimension,
// which an odd OC (GPT-2's vocabulary, 50257) would deny both products.
int bf16_grad_ld(int OC) { return (OC + 7) / 8 * 8; }

}  // namespace

// ---------------------------------------------------------------- embedding

void CudaBackend::embedding_forward(float* out, const int32_t* tokens, const float* positions,
                                    const float* wte, const float* wpe, int N, int C, int V,
                                    int P, VocabShard shard) {
    static constexpr const char* op = "embedding_forward";
    if (N <= 0) return;
    activate();
    if (!is_staged_tokens(tokens)) {  // a staged batch was checked by its caller on the host
        const int32_t* h_tok = host_view(tokens, size_t(N), h_ints_, op);
        const float* h_pos =
            wpe != nullptr ? host_view(positions, size_t(N), h_floats_, op) : nullptr;
        check_embedding_tokens(h_tok, h_pos, N, shard.total > 0 ? shard.total : V, P);
    }
    const int32_t* d_tok = device_view(tokens, size_t(N), d_tokens_, op);
    done(launch_embedding_forward(out, d_tok, positions, wte, wpe, N, C, V, P, shard.begin,
                                  stream_),
         op);
}

// Deterministic: rows are grouped by their destination (token for dwte, table row for dwpe) on
// the host, and each destination row is summed by one block in ascending row order, so the
// result does not depend on scheduling (the CPU backend also sums in row order).
void CudaBackend::embedding_backward(float* dwte, float* dwpe, const float* dout,
                                     const int32_t* tokens, const float* positions, int N, int C,
                                     int V, int P, VocabShard shard) {
    static constexpr const char* op = "embedding_backward";
    if (N <= 0) return;
    activate();
    // the grouping is planned on the host: a staged batch's host copy, else a copy of the input
    const bool staged = is_staged_tokens(tokens) && positions == staged_.positions;
    const int32_t* h_tok = staged ? h_batch_tokens_.data() : host_view(tokens, size_t(N), h_ints_, op);
    const float* h_pos = dwpe == nullptr ? nullptr
                         : staged        ? h_batch_positions_.data()
                                         : host_view(positions, size_t(N), h_floats_, op);
    if (!staged) check_embedding_tokens(h_tok, h_pos, N, shard.total > 0 ? shard.total : V, P);

    // dwte: group rows n by token (this vocabulary shard's tokens only)
    std::vector<int> dst, src;
    dst.reserve(static_cast<size_t>(N));
    src.reserve(static_cast<size_t>(N));
    for (int n = 0; n < N; n++) {
        const int row = h_tok[n] - shard.begin;
        if (row < 0 || row >= V) continue;
        dst.push_back(row);
        src.push_back(n);
    }
    const int G = build_groups(dst, src, nullptr, h_order_, h_groups_, nullptr);
    int32_t* d = d_groups_.ensure(h_groups_.size(), op);
    upload(d, h_groups_.data(), h_groups_.size() * sizeof(int32_t), op);
    check(launch_grouped_row_add(dwte, dout, d, d + G, d + 2 * G + 1, nullptr, G, C, stream_), op);

    if (dwpe != nullptr) {
        // dwpe: row n adds (1 - f) dout[n] to row j0 and f dout[n] to row j1 (backend.h interp)
        std::vector<int> pdst(2 * size_t(N)), psrc(2 * size_t(N));
        std::vector<float> pw(2 * size_t(N));
        for (int n = 0; n < N; n++) {
            const float p = h_pos[n];
            const int j0 = std::min(int(std::floor(p)), P - 1), j1 = std::min(j0 + 1, P - 1);
            const float f = p - float(j0);
            pdst[2 * size_t(n)] = j0;
            pdst[2 * size_t(n) + 1] = j1;
            psrc[2 * size_t(n)] = psrc[2 * size_t(n) + 1] = n;
            pw[2 * size_t(n)] = 1.0f - f;
            pw[2 * size_t(n) + 1] = f;
        }
        const int GP = build_groups(pdst, psrc, &pw, h_order_, h_groups_pe_, &h_weights_pe_);
        int32_t* dp = d_groups_pe_.ensure(h_groups_pe_.size(), op);
        float* dw = d_weights_pe_.ensure(h_weights_pe_.size(), op);
        upload(dp, h_groups_pe_.data(), h_groups_pe_.size() * sizeof(int32_t), op);
        upload(dw, h_weights_pe_.data(), h_weights_pe_.size() * sizeof(float), op);
        check(launch_grouped_row_add(dwpe, dout, dp, dp + GP, dp + 2 * GP + 1, dw, GP, C, stream_),
              op);
    }
    if (sync_each_op_) sync(op);
}

// ---------------------------------------------------------------- layer norm

void CudaBackend::layernorm_forward(float* out, float* mean, float* rstd, const float* inp,
                                    const float* w, const float* b, int N, int C, float eps) {
    activate();
    done(launch_layernorm_forward(out, mean, rstd, inp, w, b, N, C, eps, stream_),
         "layernorm_forward");
}

void CudaBackend::layernorm_backward(float* dinp, float* dw, float* db, const float* dout,
                                     const float* inp, const float* w, const float* mean,
                                     const float* rstd, int N, int C) {
    static constexpr const char* op = "layernorm_backward";
    if (N <= 0 || C <= 0) return;
    activate();
    if (C <= kNormOnePassMaxC) {  // x and dout read once (cuda_norm.cu)
        float* part = d_partials_.ensure(2 * size_t(norm_backward_chunks(N)) * size_t(C), op);
        done(launch_norm_backward(dinp, dw, db, part, dout, inp, w, mean, rstd, N, C, stream_),
             op);
        return;
    }
    check(launch_layernorm_backward_dinp(dinp, dout, inp, w, mean, rstd, N, C, stream_), op);
    float* part = d_partials_.ensure(2 * size_t(column_chunks(N)) * size_t(C), op);
    done(launch_layernorm_backward_params(dw, db, part, dout, inp, mean, rstd, N, C, stream_), op);
}

// ---------------------------------------------------------------- RMS norm
// The layer-norm kernels with no mean (cuda_kernels.h): no centering, no bias.

void CudaBackend::rmsnorm_forward(float* out, float* rstd, const float* inp, const float* w, int N,
                                  int C, float eps) {
    activate();
    done(launch_layernorm_forward(out, nullptr, rstd, inp, w, nullptr, N, C, eps, stream_),
         "rmsnorm_forward");
}

void CudaBackend::rmsnorm_backward(float* dinp, float* dw, const float* dout, const float* inp,
                                   const float* w, const float* rstd, int N, int C) {
    static constexpr const char* op = "rmsnorm_backward";
    if (N <= 0 || C <= 0) return;
    activate();
    if (C <= kNormOnePassMaxC) {
        float* part = d_partials_.ensure(size_t(norm_backward_chunks(N)) * size_t(C), op);
        done(launch_norm_backward(dinp, dw, nullptr, part, dout, inp, w, nullptr, rstd, N, C,
                                  stream_),
             op);
        return;
    }
    check(launch_layernorm_backward_dinp(dinp, dout, inp, w, nullptr, rstd, N, C, stream_), op);
    float* part = d_partials_.ensure(size_t(column_chunks(N)) * size_t(C), op);
    done(launch_layernorm_backward_params(dw, nullptr, part, dout, inp, nullptr, rstd, N, C,
                                          stream_),
         op);
}

// ---------------------------------------------------------------- dense layer

// The bias (and GELU) in the product's epilogue (cuda_blaslt.h), the operands rounded first in
// bf16 as the unfused path rounds them.
bool CudaBackend::lt_forward(float* out, float* pre, const float* inp, const float* W,
                             const float* bias, int N, int IC, int OC, const char* op,
                             const float* residual) {
    if (!lt_.takes(OC, pre != nullptr)) return false;
    BlasLt::Product p{N,    IC,   OC, precision_ == Precision::Bf16, inp, W, bias, out,
                      pre, residual};
    if (p.bf16) {
        p.inp = round_to_bf16(inp, size_t(N) * IC, bf16_act_, op);
        p.W = round_to_bf16(W, size_t(OC) * IC, bf16_weight_, op);
    }
    return lt_.forward(p, stream_, op);
}

void CudaBackend::matmul_forward(float* out, const float* inp, const float* W, const float* bias,
                                 int N, int IC, int OC) {
    static constexpr const char* op = "matmul_forward";
    activate();
    if (precision_ == Precision::Bf16) {
        forward_bf16(out, round_to_bf16(inp, size_t(N) * IC, bf16_act_, op), W, bias, N, IC, OC,
                     op);
    } else if (bias == nullptr || !lt_forward(out, nullptr, inp, W, bias, N, IC, OC, op)) {
        // out starts as the bias in every row, then sgemm adds inp @ W^T, W (OC, IC)
        const float beta = start_output(out, nullptr, bias, N, OC, op);
        gemm(op, false, true, N, OC, IC, 1.0f, inp, IC, W, IC, beta, out, OC);
    }
    if (sync_each_op_) sync(op);
}

float CudaBackend::start_output(float* out, const float* residual, const float* bias, int N,
                                int OC, const char* op) {
    const size_t n = size_t(N) * size_t(OC);
    if (bias != nullptr) check(launch_broadcast_rows(out, bias, N, OC, stream_), op);
    if (residual != nullptr) {
        if (bias != nullptr)
            check(launch_accumulate(out, residual, n, stream_), op);
        else
            check(cudaMemcpyAsync(out, residual, n * sizeof(float), cudaMemcpyDeviceToDevice,
                                  stream_),
                  op);
    }
    return bias != nullptr || residual != nullptr ? 1.0f : 0.0f;
}

void CudaBackend::matmul_residual_forward(float* out, const float* residual, const float* inp,
                                          const float* W, const float* bias, int N, int IC,
                                          int OC) {
    static constexpr const char* op = "matmul_residual_forward";
    CTX_CHECK(out != inp && out != residual,
              "{}: out must be a buffer of its own (not inp or residual)", op);
    activate();
    if (precision_ == Precision::Bf16) {
        forward_bf16(out, round_to_bf16(inp, size_t(N) * IC, bf16_act_, op), W, bias, N, IC, OC,
                     op, residual);
    } else if (!lt_forward(out, nullptr, inp, W, bias, N, IC, OC, op, residual)) {
        const float beta = start_output(out, residual, bias, N, OC, op);
        gemm(op, false, true, N, OC, IC, 1.0f, inp, IC, W, IC, beta, out, OC);
    }
    if (sync_each_op_) sync(op);
}

// out (N, OC) = a (N, IC) @ bf16(W)^T (+ bias), fp32 accumulation and output: the bias in
// cuBLASLt's epilogue when it has an algorithm, else broadcast first and added to (beta = 1).
void CudaBackend::forward_bf16(float* out, const uint16_t* a, const float* W, const float* bias,
                               int N, int IC, int OC, const char* op, const float* residual) {
    forward_bf16_rounded(out, a, round_to_bf16(W, size_t(OC) * IC, bf16_weight_, op), bias, N, IC,
                         OC, op, residual);
}

void CudaBackend::forward_bf16_rounded(float* out, const uint16_t* a, const uint16_t* w,
                                       const float* bias, int N, int IC, int OC, const char* op,
                                       const float* residual) {
    if ((bias != nullptr || residual != nullptr) && lt_.takes(OC, false)) {
        const BlasLt::Product p{N, IC, OC, true, a, w, bias, out, nullptr, residual};
        if (lt_.forward(p, stream_, op)) return;
    }
    const float beta = start_output(out, residual, bias, N, OC, op);
    gemm_bf16(op, false, true, N, OC, IC, 1.0f, a, IC, w, IC, beta, out, OC);
}

void CudaBackend::matmul_backward(float* dinp, float* dW, float* dbias, const float* dout,
                                  const float* inp, const float* W, int N, int IC, int OC,
                                  GradStore dinp_store) {
    static constexpr const char* op = "matmul_backward";
    activate();
    if (precision_ == Precision::Bf16) {
        backward_bf16(dinp, dW, dbias, dout, round_to_bf16(inp, size_t(N) * IC, bf16_act_, op), W,
                      N, IC, OC, dinp_store, op);
    } else {
        // dinp (N, IC) (+)= dout (N, OC) @ W (OC, IC): beta 0 writes (cuBLAS reads no C then)
        const float beta = dinp_store == GradStore::Accumulate ? 1.0f : 0.0f;
        if (dinp != nullptr)
            gemm(op, false, false, N, IC, OC, 1.0f, dout, OC, W, IC, beta, dinp, IC);
        // dW (OC, IC) += dout^T (OC, N) @ inp (N, IC)
        gemm(op, true, false, OC, IC, N, 1.0f, dout, OC, inp, IC, 1.0f, dW, IC);
        // dbias (OC) += column sums of dout (two-stage, fixed order)
        if (dbias != nullptr && N > 0 && OC > 0) {
            float* part = d_partials_.ensure(size_t(column_chunks(N)) * size_t(OC), op);
            check(launch_column_sum_add(dbias, part, dout, N, OC, stream_), op);
        }
    }
    if (sync_each_op_) sync(op);
}

// Both products take bf16 operands (dout too: cublasGemmEx needs A and B of one type) and
// accumulate in fp32: dW gets added to (beta 1), dinp too unless dinp_store says Overwrite
// (beta 0). bf16(dout)'s rows are padded (bf16_grad_ld).
void CudaBackend::backward_bf16(float* dinp, float* dW, float* dbias, const float* dout,
                                const uint16_t* a, const float* W, int N, int IC, int OC,
                                GradStore dinp_store, const char* op) {
    const int ldg = bf16_grad_ld(OC);
    backward_bf16_products(dinp, dW, round_grad_bf16(dbias, dout, N, OC, op), ldg, a, W, N, IC, OC,
                           dinp_store, op);
}

const uint16_t* CudaBackend::round_grad_bf16(float* dbias, const float* dout, int N, int OC,
                                             const char* op) {
    const int ldg = bf16_grad_ld(OC);
    if (dbias == nullptr || N <= 0 || OC <= 0)
        return round_rows_to_bf16(dout, N, OC, ldg, bf16_grad_, op);
    // dbias (OC) += colsum(dout) in the same pass
    uint16_t* g = bf16_grad_.ensure(size_t(N) * size_t(ldg), op);
    float* part = d_partials_.ensure(size_t(column_chunks(N)) * size_t(OC), op);
    check(launch_round_rows_colsum_bf16(g, size_t(ldg), dbias, part, dout, N, OC, stream_), op);
    return g;
}

void CudaBackend::backward_bf16_products(float* dinp, float* dW, const uint16_t* g, int ldg,
                                         const uint16_t* a, const float* W, int N, int IC,
                                         int OC, GradStore dinp_store, const char* op) {
    if (dinp != nullptr) {  // dinp (N, IC) (+)= bf16(dout) (N, OC) @ bf16(W) (OC, IC)
        const uint16_t* w = round_to_bf16(W, size_t(OC) * IC, bf16_weight_, op);
        const float beta = dinp_store == GradStore::Accumulate ? 1.0f : 0.0f;
        gemm_bf16(op, false, false, N, IC, OC, 1.0f, g, ldg, w, IC, beta, dinp, IC);
    }
    // dW (OC, IC) += bf16(dout)^T (OC, N) @ a (N, IC)
    gemm_bf16(op, true, false, OC, IC, N, 1.0f, g, ldg, a, IC, 1.0f, dW, IC);
}

// The activation's backward writes bf16(dpre) in the products' padded rows and adds the bias
// gradient's column sums on the way (launch_activation_backward_bf16): the same bits as
// activation_backward into fp32 then matmul_backward's rounding pass, without the fp32 dpre.
void CudaBackend::activation_products_bf16(float* dinp, float* dW, float* dbias, const float* dact,
                                           const float* pre, const uint16_t* pre16,
                                           const uint16_t* a, const float* W, int N, int IC, int OC,
                                           Activation act, GradStore dinp_store, const char* op) {
    if (N == 0) return;
    const int ldg = bf16_grad_ld(OC);
    uint16_t* g = bf16_grad_.ensure(size_t(N) * size_t(ldg), op);
    float* part = dbias != nullptr
                      ? d_partials_.ensure(size_t(column_chunks(N)) * size_t(OC), op)
                      : nullptr;
    check(pre16 != nullptr ? launch_activation_backward_bf16(g, size_t(ldg), dbias, part, pre16,
                                                             dact, N, OC, int(act), stream_)
                           : launch_activation_backward_bf16(g, size_t(ldg), dbias, part, pre,
                                                             dact, N, OC, int(act), stream_),
          op);
    backward_bf16_products(dinp, dW, g, ldg, a, W, N, IC, OC, dinp_store, op);
}

void CudaBackend::activation_matmul_backward(float* dinp, float* dW, float* dbias, float* dpre,
                                             const float* dact, const float* pre,
                                             const float* inp, const float* W, int N, int IC,
                                             int OC, Activation act, GradStore dinp_store) {
    static constexpr const char* op = "activation_matmul_backward";
    if (precision_ != Precision::Bf16) {
        Backend::activation_matmul_backward(dinp, dW, dbias, dpre, dact, pre, inp, W, N, IC, OC,
                                            act, dinp_store);
        return;
    }
    check_activation_matmul_backward(op, dpre, dact, pre, N, IC, OC, act);
    activate();
    activation_products_bf16(dinp, dW, dbias, dact, pre, nullptr,
                             round_to_bf16(inp, size_t(N) * IC, bf16_act_, op), W, N, IC, OC, act,
                             dinp_store, op);
    if (sync_each_op_) sync(op);
}

// The MLP's backward with bf16 storage, GELU (tanh) and the epilogue path on (CTX_MLP_GELU):
// bf16(dout) with fc_proj's bias gradient in one pass, dW_proj from it, then dpre = (bf16(dout)
// @ W_proj) * gelu'(pre) from one cuBLASLt product (DGELU_BGRAD: dpre rounded to bf16 as fc's
// products take it, fc's bias gradient summed in fp32 from the unrounded values), then fc's
// products. No fp32 dact is written and read back (N x OC x 4 bytes each way), nor dpre.
// Other activations, and what cuBLASLt refuses, take the two ops (the default's composition).
void CudaBackend::mlp_backward_bf16(const MlpBackwardBf16& m) {
    static constexpr const char* op = "mlp_backward_bf16";
    require_bf16_activations(op);
    if (m.act != Activation::GeluTanh || !mlp_gelu_epilogue_ || !lt_.takes(m.OC, true, true) ||
        m.N <= 0) {
        Backend::mlp_backward_bf16(m);
        return;
    }
    CTX_CHECK(m.IC >= 1 && m.OP >= 1, "{}: bad shape N {} IC {} OC {} OP {}", op, m.N, m.IC, m.OC,
              m.OP);
    CTX_CHECK(m.dW_fc != nullptr && m.dW_proj != nullptr && m.dact != nullptr &&
                  m.dout != nullptr && m.pre != nullptr && m.act_out != nullptr &&
                  m.inp != nullptr && m.W_fc != nullptr && m.W_proj != nullptr,
              "{}: a null gradient, input or weight (only dinp, db_fc, db_proj and dpre may be "
              "null)",
              op);
    activate();
    const int N = m.N, OA = m.OA(), ldg = bf16_grad_ld(m.OP);
    const uint16_t* g = round_grad_bf16(m.db_proj, m.dout, N, m.OP, op);  // (N, ldg)
    const uint16_t* act = reinterpret_cast<const uint16_t*>(m.act_out);
    // dW_proj (OP, OA) += g^T (OP, N) @ act_out (N, OA)
    gemm_bf16(op, true, false, m.OP, OA, N, 1.0f, g, ldg, act, OA, 1.0f, m.dW_proj, OA);
    const uint16_t* wp = round_to_bf16(m.W_proj, size_t(m.OP) * OA, bf16_weight_, op);
    BlasLt::DgeluProduct d;
    d.N = N;
    d.OP = m.OP;
    d.OC = m.OC;
    d.g = g;
    d.ldg = ldg;
    d.W = wp;
    d.pre = m.pre;
    d.ldd = bf16_grad_ld(m.OC);  // = OC = OA (takes() wants OC % 8 == 0)
    // bf16(dpre) in the caller's fp32 dact scratch, which this path does not otherwise use:
    // (N, OA) floats hold (N, 2 OA) bf16
    d.dpre = m.dact;
    d.dbias = m.db_fc != nullptr ? lt_bias_grad_.ensure(size_t(m.OC), op) : nullptr;
    const uint16_t* inp = reinterpret_cast<const uint16_t*>(m.inp);
    if (lt_.backward_dgelu(d, stream_, op)) {
        if (d.dbias != nullptr)
            check(launch_accumulate(m.db_fc, d.dbias, size_t(m.OC), stream_), op);
        backward_bf16_products(m.dinp, m.dW_fc, static_cast<const uint16_t*>(d.dpre), d.ldd, inp,
                               m.W_fc, N, m.IC, m.OC, m.dinp_store, op);
    } else {  // dact (N, OA) = g @ bf16(W_proj), then the activation kernel's path
        gemm_bf16(op, false, false, N, OA, m.OP, 1.0f, g, ldg, wp, OA, 0.0f, m.dact, OA);
        activation_products_bf16(m.dinp, m.dW_fc, m.db_fc, m.dact, nullptr,
                                 reinterpret_cast<const uint16_t*>(m.pre), inp, m.W_fc, N, m.IC,
                                 m.OC, m.act, m.dinp_store, op);
    }
    if (sync_each_op_) sync(op);
}

// pre = inp W^T + bias and out = gelu_tanh(pre) from one cuBLASLt product (GELU_AUX_BIAS); other
// activations, and shapes the epilogue refuses, as the product then the activation kernel.
void CudaBackend::matmul_activation_forward(float* pre, float* out, const float* inp,
                                            const float* W, const float* bias, int N, int IC,
                                            int OC, Activation act) {
    static constexpr const char* op = "matmul_activation_forward";
    activate();
    if (act == Activation::GeluTanh && lt_forward(out, pre, inp, W, bias, N, IC, OC, op)) {
        if (sync_each_op_) sync(op);
        return;
    }
    Backend::matmul_activation_forward(pre, out, inp, W, bias, N, IC, OC, act);
}

// ---------------------------------------------------------------- activation

void CudaBackend::activation_forward(float* out, const float* inp, size_t n, Activation act) {
    CTX_CHECK(act != Activation::SwiGLU, "internal: SwiGLU is gated; use swiglu_forward");
    activate();
    done(launch_activation_forward(out, inp, n, int(act), stream_), "activation_forward");
}

void CudaBackend::swiglu_forward(float* out, const float* inp, int N, int F) {
    activate();
    done(launch_swiglu_forward(out, inp, N, F, stream_), "swiglu_forward");
}

void CudaBackend::swiglu_backward(float* dinp, const float* inp, const float* dout, int N, int F,
                                  GradStore store) {
    activate();
    done(launch_swiglu_backward(dinp, inp, dout, N, F, store == GradStore::Accumulate, stream_),
         "swiglu_backward");
}

// ---------------------------------------------------------------- contextual sparsity

void CudaBackend::matmul_rows_forward(float* out, int ldo, const float* inp, const float* W,
                                      const float* bias, const int32_t* idx, int N, int IC, int K,
                                      int G) {
    check_rows_op("matmul_rows_forward", N, K, G);
    activate();
    done(launch_matmul_rows_forward(out, ldo, inp, W, bias, idx, N, IC, K, G, stream_),
         "matmul_rows_forward");
}

void CudaBackend::matmul_rows_project(float* out, const float* h, int ldh, const float* Wt,
                                      const float* bias, const int32_t* idx, int N, int OC, int K,
                                      int G) {
    check_rows_op("matmul_rows_project", N, K, G);
    activate();
    done(launch_matmul_rows_project(out, h, ldh, Wt, bias, idx, N, OC, K, G, stream_),
         "matmul_rows_project");
}

void CudaBackend::select_topk(int32_t* idx, const float* scores, int N, int M, int K,
                              float threshold) {
    check_topk(N, M, K);
    activate();
    done(launch_select_topk(idx, scores, N, M, K, threshold, stream_), "select_topk");
}

void CudaBackend::kv_repeat_forward(float* qkv, const float* grouped, int N, int H, int Hkv,
                                    int D) {
    activate();
    done(launch_kv_repeat(qkv, nullptr, grouped, nullptr, N, H, Hkv, D, stream_),
         "kv_repeat_forward");
}

void CudaBackend::kv_repeat_backward(float* dgrouped, const float* dqkv, int N, int H, int Hkv,
                                     int D) {
    activate();
    done(launch_kv_repeat(nullptr, dgrouped, nullptr, dqkv, N, H, Hkv, D, stream_),
         "kv_repeat_backward");
}

void CudaBackend::activation_backward(float* dinp, const float* inp, const float* dout, size_t n,
                                      Activation act, GradStore store) {
    CTX_CHECK(act != Activation::SwiGLU, "internal: SwiGLU is gated; use swiglu_backward");
    activate();
    done(launch_activation_backward(dinp, inp, dout, n, int(act), store == GradStore::Accumulate,
                                    stream_),
         "activation_backward");
}

// ---------------------------------------------------------------- cross-entropy
// Targets of trained rows are validated on the host as in the CPU backend, which needs the mask
// there: a device mask is copied back first. A staged batch (stage_batch) was validated by its
// caller, so the model's passes copy nothing back.

void CudaBackend::crossentropy_forward(float* losses, const float* logits, const int32_t* targets,
                                       const float* mask, int N, int V) {
    static constexpr const char* op = "crossentropy_forward";
    if (N <= 0) return;
    activate();
    if (targets != staged_.targets || targets == nullptr) {  // staged: checked by the caller
        const int32_t* h_tgt = host_view(targets, size_t(N), h_ints_, op);
        check_targets(h_tgt, host_view(mask, size_t(N), h_mask_, op), N, V);
    }
    const int32_t* d_tgt = device_view(targets, size_t(N), d_targets_, op);
    done(launch_xent_rows(losses, nullptr, nullptr, V, logits, V, d_tgt, mask, N, V, 0.0f, stream_),
         op);
}

void CudaBackend::crossentropy_forward_backward(float* logits_to_dlogits, float* losses,
                                                const int32_t* targets, const float* mask, int N,
                                                int V, float grad_scale) {
    static constexpr const char* op = "crossentropy_forward_backward";
    if (N <= 0) return;
    activate();
    if (targets != staged_.targets || targets == nullptr) {  // staged: checked by the caller
        const int32_t* h_tgt = host_view(targets, size_t(N), h_ints_, op);
        check_targets(h_tgt, host_view(mask, size_t(N), h_mask_, op), N, V);
    }
    const int32_t* d_tgt = device_view(targets, size_t(N), d_targets_, op);
    done(launch_xent_rows(losses, logits_to_dlogits, nullptr, V, logits_to_dlogits, V, d_tgt, mask,
                          N, V, grad_scale, stream_),
         op);
}

void CudaBackend::crossentropy_shard_stats(float* stats, const float* logits,
                                           const int32_t* targets, int N, int V,
                                           VocabShard shard) {
    static constexpr const char* op = "crossentropy_shard_stats";
    if (N <= 0) return;
    activate();
    if (targets != staged_.targets || targets == nullptr)  // staged: checked by the caller
        check_targets(host_view(targets, size_t(N), h_ints_, op), nullptr, N, shard.total);
    const int32_t* d_tgt = device_view(targets, size_t(N), d_targets_, op);
    done(launch_crossentropy_shard_stats(stats, logits, d_tgt, N, V, shard.begin, stream_), op);
}

void CudaBackend::crossentropy_shard_finish(float* losses, float* logits_to_dlogits,
                                            const float* all_stats, int S,
                                            const int32_t* targets, const float* mask, int N,
                                            int V, VocabShard shard, float grad_scale) {
    static constexpr const char* op = "crossentropy_shard_finish";
    if (N <= 0) return;
    activate();
    if (targets != staged_.targets || targets == nullptr) {  // staged: checked by the caller
        const int32_t* h_tgt = host_view(targets, size_t(N), h_ints_, op);
        check_targets(h_tgt, host_view(mask, size_t(N), h_mask_, op), N, shard.total);
    }
    const int32_t* d_tgt = device_view(targets, size_t(N), d_targets_, op);
    done(launch_crossentropy_shard_finish(losses, logits_to_dlogits, all_stats, S, d_tgt, mask, N,
                                          V, shard.begin, grad_scale, stream_),
         op);
}

// ---------------------------------------------------------------- optimizer

namespace {
AdamWArgs adamw_args(const AdamWParams& hp, const char* op) {
    CTX_CHECK(hp.step >= 1, "{}: step must be >= 1 (1-based), got {}", op, hp.step);
    return {hp.lr,
            hp.beta1,
            hp.beta2,
            hp.eps,
            hp.weight_decay,
            float(1.0 / (1.0 - std::pow(double(hp.beta1), double(hp.step)))),
            float(1.0 / (1.0 - std::pow(double(hp.beta2), double(hp.step)))),
            hp.grad_scale};
}
}  // namespace

void CudaBackend::adamw_update(float* params, const float* grads, float* m, float* v, size_t n,
                               const AdamWParams& hp) {
    const AdamWArgs args = adamw_args(hp, "adamw");
    activate();
    done(launch_adamw(params, grads, m, v, n, args, stream_), "adamw_update");
}

void CudaBackend::adamw_update_segments(float* params, const float* grads, float* m, float* v,
                                        const std::vector<AdamWSegment>& segments,
                                        const AdamWParams& hp) {
    static constexpr const char* op = "adamw_update_segments";
    const AdamWArgs args = adamw_args(hp, "adamw");
    activate();
    // The chunk table is uploaded when it changes (the first step, after a relayout), so a
    // step makes no host-to-device copy; the queued launches of earlier steps read the same
    // table.
    adamw_chunks_.clear();
    for (const AdamWSegment& s : segments)
        for (size_t k = 0; k < s.n; k += kAdamWChunk)
            adamw_chunks_.push_back(AdamWChunk{uint64_t(s.offset + k),
                                               uint32_t(std::min<size_t>(kAdamWChunk, s.n - k)),
                                               uint32_t(s.decay)});
    if (adamw_chunks_.empty()) return;
    // the table as DeviceScratch's 64-bit words; a new one is copied on the stream, after the
    // launches that read the old one (the host vector may change once the call returns: the
    // copy from pageable memory is staged)
    static_assert(sizeof(AdamWChunk) == 2 * sizeof(uint64_t));
    uint64_t* table = d_adamw_chunks_.ensure(2 * adamw_chunks_.size(), op);
    if (adamw_chunks_ != adamw_chunks_on_device_) {
        upload(table, adamw_chunks_.data(), adamw_chunks_.size() * sizeof(AdamWChunk), op);
        adamw_chunks_on_device_ = adamw_chunks_;
    }
    done(launch_adamw_chunks(params, grads, m, v, reinterpret_cast<const AdamWChunk*>(table),
                             adamw_chunks_.size(), args, stream_),
         op);
}

}  // namespace ctx::cuda
