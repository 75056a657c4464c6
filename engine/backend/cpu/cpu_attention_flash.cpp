// CPU backend: the flash mode of causal attention (backend.h AttentionMode::Flash). Same math,
// bias code (cpu_attention_bias.h) and query-block sgemms as the materialised mode in
// cpu_attention.cpp, but nothing of size (B, H, T, T) is kept:
//   forward : per query block [i0, i1), the logits against keys [j0, i1) go to a per-thread
//             (kAttnBlock, T) buffer, are turned into exp(logit - max) there, out = E v / rowsum,
//             and only lse_i = max_i + log(rowsum_i) is saved (B, H, T).
//   backward: per query block, P = exp(logit - lse) is recomputed from q, k, the bias and lse;
//             with Drow_i = dout_i . out_i, dS = P (dout v^T - Drow); then dq, dk, dv, the bias
//             parameter slots and dtable exactly as the materialised backward does.
// Memory grows as T: (kAttnBlock, T) per thread instead of (T, T) per (b, h) pair. Every (b, h)
// pair runs start to end on one thread and the bias-parameter slots are reduced in a fixed
// order, so results do not depend on the thread count.
#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "backend/cpu/cpu_attention_bias.h"
#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_math.h"
#include "backend/op_common.h"
#include "core/error.h"

namespace ctx::cpu {

namespace {

// The forward op has no scratch argument: each thread keeps one logits buffer, grown to the
// largest T seen and reused by every later call (no allocation once it is big enough).
float* forward_buffer(size_t n) {
    static thread_local std::vector<float> buf;
    if (buf.size() < n) buf.resize(n);
    return buf.data();
}

// Per-thread part of the backward scratch: P and dS blocks (kAttnBlock, T) and Drow (kAttnBlock).
inline size_t flash_thread_floats(int T) { return 2 * attn_buffer_floats(T) + kAttnBlock; }

}  // namespace

size_t CpuBackend::flash_scratch_floats(int B, int T, int H) const {
    // [threads_ x (P | dS | Drow)][(B*H) x kMaxT5Buckets bias-gradient slots]
    return size_t(threads_) * flash_thread_floats(T) + size_t(B) * H * kMaxT5Buckets;
}

void CpuBackend::flash_forward(float* out, float* lse, const float* qkv, const float* positions,
                               int B, int T, int C, int H, const AttentionOptions& opt) {
    CTX_CHECK(out != nullptr && lse != nullptr,
              "attention_forward: flash mode writes out (B, T, C) and the saved lse (B, H, T); "
              "got null");
    const int D = C / H, C3 = 3 * C;
    const float scale = 1.0f / std::sqrt(float(D));
    int lut[kT5LutSize + 1];
    const BiasEval be = make_bias_eval(opt.bias, lut);
    const size_t buf_floats = attn_buffer_floats(T);

#pragma omp parallel num_threads(threads_)
    {
        float* e_buf = forward_buffer(buf_floats);  // (kAttnBlock, T)
#pragma omp for schedule(static)
        for (int bh = 0; bh < B * H; bh++) {
            const int b = bh / H, h = bh % H;
            const float* q = qkv + size_t(b) * T * C3 + size_t(h) * D;  // (T, D), ld 3C
            const float* k = q + C;                                     // (T, D), ld 3C
            const float* v = q + 2 * C;                                 // (T, D), ld 3C
            const float* pos = positions + size_t(b) * T;               // (T)
            float* out_bh = out + size_t(b) * T * C + size_t(h) * D;    // (T, D), ld C
            float* lse_bh = lse + size_t(bh) * T;                       // (T)
            const float* table_bh = opt.bias.kind == BiasKind::Table
                                        ? opt.bias.table + size_t(bh) * T * T  // (T, T)
                                        : nullptr;
            for (int i0 = 0; i0 < T; i0 += kAttnBlock) {
                const int i1 = std::min(T, i0 + kAttnBlock), j0 = key_lo(opt, b, T, i0);
                const int M = i1 - i0, Nk = i1 - j0;
                float inv[kAttnBlock];  // (M) 1 / rowsum
                // logits (M, Nk) = q[i0:i1] k[j0:i1]^T / sqrt(D); row r holds keys j0 .. i1-1
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, Nk, D, scale,
                            q + size_t(i0) * C3, C3, k + size_t(j0) * C3, C3, 0.0f, e_buf, Nk);
                for (int i = i0; i < i1; i++) {
                    float* row = e_buf + size_t(i - i0) * Nk;  // (Nk)
                    const int lo = key_lo(opt, b, T, i);
                    add_bias_row(row, j0, table_bh ? table_bh + size_t(i) * T : nullptr, pos, i,
                                 lo, h, opt.bias, be);
                    float* r = row + (lo - j0);  // (n) keys lo .. i
                    const int n = i - lo + 1;
                    const float mx = row_max(r, n);
                    const float sum = exp_shifted_sum(r, n, Nk - (lo - j0), mx);
                    // masked keys of this row: before the window, after the diagonal
                    for (int x = 0; x < lo - j0; x++) row[x] = 0.0f;
                    for (int x = i - j0 + 1; x < Nk; x++) row[x] = 0.0f;
                    inv[i - i0] = 1.0f / sum;
                    lse_bh[i] = mx + std::log(sum);
                }
                // out[i0:i1] = (E v[j0:i1]) / rowsum
                float* o = out_bh + size_t(i0) * C;  // (M, D), ld C
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, M, D, Nk, 1.0f, e_buf, Nk,
                            v + size_t(j0) * C3, C3, 0.0f, o, C);
                for (int r = 0; r < M; r++) {
                    const float s = inv[r];
#pragma omp simd
                    for (int d = 0; d < D; d++) o[size_t(r) * C + d] *= s;
                }
            }
        }
    }
}

void CpuBackend::flash_backward(float* dqkv, float* scratch, const float* dout, const float* qkv,
                                const float* lse, const float* out, const float* positions, int B,
                                int T, int C, int H, const AttentionOptions& opt) {
    CTX_CHECK(out != nullptr,
              "attention_backward: flash mode needs the forward's output `out` (B, T, C) (Drow_i "
              "= dout_i . out_i); got null (only the materialised mode may pass null)");
    CTX_CHECK(lse != nullptr,
              "attention_backward: flash mode needs the forward's saved lse (B, H, T); got null");
    const int D = C / H, C3 = 3 * C;
    const float scale = 1.0f / std::sqrt(float(D));
    const BiasSpec& bs = opt.bias;
    int lut[kT5LutSize + 1];
    const BiasEval be = make_bias_eval(bs, lut);
    const BiasGrads bg = bias_grads_of(bs);
    const size_t buf_floats = attn_buffer_floats(T), thread_floats = flash_thread_floats(T);
    float* slots = scratch + size_t(threads_) * thread_floats;  // (B*H, kMaxT5Buckets)

#pragma omp parallel num_threads(threads_)
    {
        float* p_buf = scratch + size_t(omp_get_thread_num()) * thread_floats;  // (kAttnBlock, T)
        float* ds_buf = p_buf + buf_floats;                                     // (kAttnBlock, T)
        float* drow = ds_buf + buf_floats;                                      // (kAttnBlock)
#pragma omp for schedule(static)
        for (int bh = 0; bh < B * H; bh++) {
            const int b = bh / H, h = bh % H;
            const size_t head = size_t(b) * T * C3 + size_t(h) * D;
            const float* q = qkv + head;                                        // (T, D), ld 3C
            const float* k = q + C;                                             // (T, D), ld 3C
            const float* v = q + 2 * C;                                         // (T, D), ld 3C
            float* dq = dqkv + head;                                            // (T, D), ld 3C
            float* dk = dq + C;                                                 // (T, D), ld 3C
            float* dv = dq + 2 * C;                                             // (T, D), ld 3C
            const size_t orow = size_t(b) * T * C + size_t(h) * D;
            const float* dout_bh = dout + orow;                                 // (T, D), ld C
            const float* out_bh = out + orow;                                   // (T, D), ld C
            const float* lse_bh = lse + size_t(bh) * T;                         // (T)
            const float* pos = positions + size_t(b) * T;                       // (T)
            const float* table_bh = bs.kind == BiasKind::Table
                                        ? bs.table + size_t(bh) * T * T  // (T, T)
                                        : nullptr;
            float* dtable_bh = bg.table ? bs.dtable + size_t(bh) * T * T : nullptr;  // (T, T)
            double g[kMaxT5Buckets];  // this pair's bias-parameter gradients
            if (bg.params) std::fill(g, g + bg.n, 0.0);

            for (int i0 = 0; i0 < T; i0 += kAttnBlock) {
                const int i1 = std::min(T, i0 + kAttnBlock), j0 = key_lo(opt, b, T, i0);
                const int M = i1 - i0, Nk = i1 - j0;
                // P (M, Nk) = exp(q[i0:i1] k[j0:i1]^T / sqrt(D) + bias - lse), 0 where masked
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, Nk, D, scale,
                            q + size_t(i0) * C3, C3, k + size_t(j0) * C3, C3, 0.0f, p_buf, Nk);
                for (int i = i0; i < i1; i++) {
                    float* row = p_buf + size_t(i - i0) * Nk;  // (Nk) keys j0 .. i1-1
                    const int lo = key_lo(opt, b, T, i);
                    add_bias_row(row, j0, table_bh ? table_bh + size_t(i) * T : nullptr, pos, i,
                                 lo, h, bs, be);
                    const float l = lse_bh[i];
                    float* r = row + (lo - j0);  // (n) keys lo .. i
                    const int n = i - lo + 1;
#pragma omp simd
                    for (int x = 0; x < n; x++) r[x] = fast_exp(r[x] - l);
                    for (int x = 0; x < lo - j0; x++) row[x] = 0.0f;
                    for (int x = i - j0 + 1; x < Nk; x++) row[x] = 0.0f;
                    // Drow_i = dout_i . out_i  (= sum_j P_ij dP_ij)
                    const float* dor = dout_bh + size_t(i) * C;
                    const float* our = out_bh + size_t(i) * C;
                    float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
                    for (int d = 0; d < D; d++) dot += dor[d] * our[d];
                    drow[i - i0] = dot;
                }
                // dP (M, Nk) = dout[i0:i1] v[j0:i1]^T
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, Nk, D, 1.0f,
                            dout_bh + size_t(i0) * C, C, v + size_t(j0) * C3, C3, 0.0f, ds_buf,
                            Nk);
                // dv[j0:i1] += P^T dout[i0:i1]
                cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, Nk, D, M, 1.0f, p_buf, Nk,
                            dout_bh + size_t(i0) * C, C, 1.0f, dv + size_t(j0) * C3, C3);
                // dlogit = P (dP - Drow), in place in ds_buf (0 where P is masked)
                for (int i = i0; i < i1; i++) {
                    const float* p = p_buf + size_t(i - i0) * Nk;  // (Nk)
                    float* ds = ds_buf + size_t(i - i0) * Nk;      // (Nk)
                    const float dr = drow[i - i0];
#pragma omp simd
                    for (int j = 0; j < Nk; j++) ds[j] = p[j] * (ds[j] - dr);
                    const int lo = key_lo(opt, b, T, i);
                    if (bg.params) bias_grad_row(g, ds, j0, pos, i, lo, h, bs, be);
                    if (dtable_bh != nullptr) {  // d logit / d table = 1 on the entries read
                        float* dtr = dtable_bh + size_t(i) * T;
#pragma omp simd
                        for (int j = lo; j <= i; j++) dtr[j] += ds[j - j0];
                    }
                }
                // dq[i0:i1] += dS k[j0:i1] / sqrt(D);  dk[j0:i1] += dS^T q[i0:i1] / sqrt(D)
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, M, D, Nk, scale, ds_buf,
                            Nk, k + size_t(j0) * C3, C3, 1.0f, dq + size_t(i0) * C3, C3);
                cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, Nk, D, M, scale, ds_buf, Nk,
                            q + size_t(i0) * C3, C3, 1.0f, dk + size_t(j0) * C3, C3);
            }
            if (bg.params) {
                float* slot = slots + size_t(bh) * kMaxT5Buckets;
                for (int x = 0; x < bg.n; x++) slot[x] = float(g[x]);
            }
        }
    }

    // Reduce the per-(b, h) slots in a fixed order (deterministic for any thread count).
    if (bg.params) reduce_bias_slots(slots, B, H, bs);
}

}  // namespace ctx::cpu
