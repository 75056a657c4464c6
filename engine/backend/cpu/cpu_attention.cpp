// CPU backend: rotary position embedding and causal multi-head attention with per-token float
// positions and an additive per-head bias: a family evaluated in-kernel (METHODS.md 1.4-1.6) or
// an explicit (B, H, T, T) table from the generic PE path (backend.h).
//
// Attention works per (batch, head) pair, one pair per OpenMP iteration, with strided views into
// qkv (B, T, 3C): q_bh row i is qkv[b, i, h*D : h*D + D] (leading dimension 3C), k_bh and v_bh are
// the same at offsets C and 2C. Queries go in row blocks of kAttnBlock; a block [i0, i1) only
// needs keys [j0, i1) (j0 = 0, or the window start of row i0), and within it each group of
// kTileMR rows only the keys up to its last row: causal attention does about half of the (T, T)
// work. The products are cpu_tile_gemm.h's (BLAS spent more time packing and dispatching these
// 64 x 128 x 32 products than multiplying); keys go transposed into a per-thread (D, T) panel so
// that a score row is contiguous in the vector lanes.
//
// This file holds the materialised mode (saves the (B, H, T, T) probabilities);
// cpu_attention_flash.cpp the flash mode (saves lse, recomputes the probabilities in backward).
// The bias helpers both use live in cpu_attention_bias.h.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "backend/cpu/cpu_attention_bias.h"
#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_math.h"
#include "backend/cpu/cpu_tile_gemm.h"
#include "backend/op_common.h"
#include "core/error.h"

namespace ctx::cpu {

namespace {

// ================================================================ attention helpers

// Floats of a head's keys or values transposed into a (D, T) panel (ld T): panel[d, j] = x[j, d].
inline size_t panel_floats(int T, int D) { return (size_t(T) * D + 15) / 16 * 16; }

// ================================================================ rotary

// Per-token tables of the rotation: cos, sin of a_k = (p * position_scale) * inv_freq[k] and the
// scales of q and k, attention_factor * zeta_k^(+-p / amp_scale_base). Angles and powers are
// computed in double (positions reach ~1e5, where a float angle would be off by ~1e-2 rad).
// t (4, half): cos, sin, q scale, k scale.
void fill_rotary_tables(float* t, float p, const RotarySpec& spec) {
    const int half = spec.rotary_dims / 2;
    float *cs = t, *sn = t + half, *qsc = t + 2 * half, *ksc = t + 3 * half;
    const double ps = double(p) * double(spec.position_scale);
    for (int k = 0; k < half; k++) {
        const double a = ps * double(spec.inv_freq[k]);
        cs[k] = float(std::cos(a));
        sn[k] = float(std::sin(a));
        double qs = spec.attention_factor, ks = spec.attention_factor;
        if (spec.amp_base != nullptr) {
            const double e = double(p) / double(spec.amp_scale_base);
            qs *= std::pow(double(spec.amp_base[k]), e);
            ks *= std::pow(double(spec.amp_base[k]), -e);
        }
        qsc[k] = float(qs);
        ksc[k] = float(ks);
    }
}

// Rotates the first dr dims of one head x (D) in place: (x0, x1) <- s * R(sign * a) (x0, x1).
// sign = +1 is the forward map; sign = -1 with the same s is its transpose (the backward map).
inline void rotate_head(float* x, int dr, RotaryLayout layout, const float* cs, const float* sn,
                        const float* s, float sign) {
    const int half = dr / 2;
    if (layout == RotaryLayout::Half) {  // x0 = x[k], x1 = x[k + half]: unit stride, vectorised
        float* x1p = x + half;
#pragma omp simd
        for (int k = 0; k < half; k++) {
            const float x0 = x[k], x1 = x1p[k], c = cs[k], sa = sign * sn[k];
            x[k] = s[k] * (c * x0 - sa * x1);
            x1p[k] = s[k] * (sa * x0 + c * x1);
        }
        return;
    }
    for (int k = 0; k < half; k++) {  // interleaved: x0 = x[2k], x1 = x[2k + 1]
        float* p0 = x + 2 * k;
        const float x0 = p0[0], x1 = p0[1], c = cs[k], sa = sign * sn[k];
        p0[0] = s[k] * (c * x0 - sa * x1);
        p0[1] = s[k] * (sa * x0 + c * x1);
    }
}

// qkv (B*T, 3C) rotated by tables (B*T, 4, half).
void rotary_apply(float* qkv, const float* tables, int BT, int C, int H, const RotarySpec& spec,
                  float sign) {
    const int D = C / H, dr = spec.rotary_dims, half = dr / 2;
#pragma omp parallel for schedule(static)
    for (int bt = 0; bt < BT; bt++) {
        const float* t = tables + size_t(bt) * 4 * half;  // (4, half)
        float* q = qkv + size_t(bt) * 3 * C;  // (C) = H x D
        float* k = q + C;                     // (C)
        for (int h = 0; h < H; h++) {
            rotate_head(q + h * D, dr, spec.layout, t, t + half, t + 2 * half, sign);
            rotate_head(k + h * D, dr, spec.layout, t, t + half, t + 3 * half, sign);
        }
    }
}

}  // namespace

// ================================================================ rotary ops

const float* CpuBackend::rotary_tables(const float* positions, int N, const RotarySpec& spec) {
    const int half = spec.rotary_dims / 2;
    std::vector<float> key = {float(spec.rotary_dims), float(int(spec.layout)),
                              spec.position_scale, spec.attention_factor, spec.amp_scale_base,
                              spec.amp_base != nullptr ? 1.0f : 0.0f};
    key.insert(key.end(), spec.inv_freq, spec.inv_freq + half);
    if (spec.amp_base != nullptr) key.insert(key.end(), spec.amp_base, spec.amp_base + half);
    RotaryCache& c = rotary_cache_;
    // Compared bit for bit (memcmp): a NaN-free key, and -0 vs 0 counts as a change.
    const bool same = c.half == half && c.spec_key.size() == key.size() &&
                      c.positions.size() == size_t(N) &&
                      std::memcmp(c.spec_key.data(), key.data(), key.size() * sizeof(float)) == 0 &&
                      std::memcmp(c.positions.data(), positions, size_t(N) * sizeof(float)) == 0;
    if (!same) {
        c.half = half;
        c.spec_key = std::move(key);
        c.positions.assign(positions, positions + N);
        c.tables.resize(size_t(N) * 4 * half);
        float* tables = c.tables.data();
#pragma omp parallel for schedule(static)
        for (int n = 0; n < N; n++)
            fill_rotary_tables(tables + size_t(n) * 4 * half, positions[n], spec);
    }
    return c.tables.data();
}

void CpuBackend::rotary_forward(float* qkv, const float* positions, int B, int T, int C, int H,
                                const RotarySpec& spec) {
    check_rotary(C, H, spec);
    if (spec.rotary_dims == 0) return;
    rotary_apply(qkv, rotary_tables(positions, B * T, spec), B * T, C, H, spec, +1.0f);
}

void CpuBackend::rotary_backward(float* dqkv, const float* positions, int B, int T, int C, int H,
                                 const RotarySpec& spec) {
    check_rotary(C, H, spec);
    if (spec.rotary_dims == 0) return;
    // The forward map per pair is s * R(a); its transpose is s * R(-a).
    rotary_apply(dqkv, rotary_tables(positions, B * T, spec), B * T, C, H, spec, -1.0f);
}

// ================================================================ attention ops

// Both modes, any head dim (the CPU kernels have no tile limits).
bool CpuBackend::attention_mode_supported(AttentionMode mode, int /*C*/, int /*H*/) const {
    return mode == AttentionMode::Materialised || mode == AttentionMode::Flash;
}

// Materialised: the reference, and the faster one on the CPU at the sizes we train (it skips the
// backward's recomputation of q k^T and the exponentials; see bench_ops_cpu BM_AttentionMode*).
// Flash is for T where (B, H, T, T) does not fit.
AttentionMode CpuBackend::attention_mode_auto(int /*T*/, int /*C*/, int /*H*/) const {
    return AttentionMode::Materialised;
}

size_t CpuBackend::attention_scratch_floats(int B, int T, int C, int H,
                                            AttentionMode mode) const {
    CTX_CHECK(mode == AttentionMode::Materialised || mode == AttentionMode::Flash,
              "attention: unknown mode {}", int(mode));
    if (mode == AttentionMode::Flash) return flash_scratch_floats(B, T, H);
    // [threads_ x ((kAttnBlock, T) dP/dS buffer, (D, T) transposed-values panel)]
    // [(B*H) x kMaxT5Buckets bias-gradient slots]
    return size_t(threads_) * (attn_buffer_floats(T) + panel_floats(T, C / H)) +
           size_t(B) * H * kMaxT5Buckets;
}

void CpuBackend::attention_forward(float* out, float* att, const float* qkv,
                                   const float* positions, int B, int T, int C, int H,
                                   const AttentionOptions& opt) {
    check_attention(T, C, H, opt);
    if (opt.mode == AttentionMode::Flash) {
        flash_forward(out, att, qkv, positions, B, T, C, H, opt);
        return;
    }
    CTX_CHECK(opt.mode == AttentionMode::Materialised, "attention: unknown mode {}",
              int(opt.mode));
    const int D = C / H, C3 = 3 * C;
    const float scale = 1.0f / std::sqrt(float(D));
    int lut[kT5LutSize + 1];
    const BiasEval be = make_bias_eval(opt.bias, lut);

    const size_t panel_size = panel_floats(T, D);
    if (attn_panels_.size() < size_t(threads_) * panel_size)
        attn_panels_.resize(size_t(threads_) * panel_size);

#pragma omp parallel for schedule(static) num_threads(threads_)
    for (int bh = 0; bh < B * H; bh++) {
        const int b = bh / H, h = bh % H;
        const float* q = qkv + size_t(b) * T * C3 + size_t(h) * D;  // (T, D), ld 3C
        const float* k = q + C;                                     // (T, D), ld 3C
        const float* v = q + 2 * C;                                 // (T, D), ld 3C
        const float* pos = positions + size_t(b) * T;               // (T)
        float* att_bh = att + size_t(bh) * T * T;                   // (T, T)
        float* out_bh = out + size_t(b) * T * C + size_t(h) * D;    // (T, D), ld C
        const float* table_bh = opt.bias.kind == BiasKind::Table
                                    ? opt.bias.table + size_t(bh) * T * T  // (T, T)
                                    : nullptr;
        float* kt = attn_panels_.data() + size_t(omp_get_thread_num()) * panel_size;  // (D, T)
        transpose_into(kt, T, k, C3, T, D);  // (D, T) from (T, D)
        for (int i0 = 0; i0 < T; i0 += kAttnBlock) {
            const int i1 = std::min(T, i0 + kAttnBlock), j0 = key_lo(opt, b, T, i0);
            // logits[i, j0 : i_last + 1] = q_i k^T / sqrt(D), kTileMR rows i at a time
            for (int i = i0; i < i1; i += kTileMR) {
                const int mr = std::min(kTileMR, i1 - i);
                tile_gemm_rows(mr, i + mr - j0, D, scale, q + size_t(i) * C3, C3, 1, kt + j0, T,
                               att_bh + size_t(i) * T + j0, T, false);
            }
            for (int i = i0; i < i1; i++) {
                float* row = att_bh + size_t(i) * T;  // (T)
                const int lo = key_lo(opt, b, T, i);
                for (int j = 0; j < lo; j++) row[j] = 0.0f;
                for (int j = i + 1; j < T; j++) row[j] = 0.0f;
                add_bias_row(row, 0, table_bh ? table_bh + size_t(i) * T : nullptr, pos, i, lo,
                             h, opt.bias, be);
                // softmax over [lo, i]
                const float mx = row_max(row + lo, i - lo + 1);
                const float inv = 1.0f / exp_shifted_sum(row + lo, i - lo + 1, T - lo, mx);
                const int end = lo + whole_vector_end(i - lo + 1, T - lo);
#pragma omp simd
                for (int j = lo; j < end; j++) row[j] *= inv;
            }
            // out[i] = P[i, j0 : i_last + 1] v[j0 : i_last + 1] (P is 0 past each row's i)
            for (int i = i0; i < i1; i += kTileMR) {
                const int mr = std::min(kTileMR, i1 - i);
                tile_gemm_rows(mr, D, i + mr - j0, 1.0f, att_bh + size_t(i) * T + j0, T, 1,
                               v + size_t(j0) * C3, C3, out_bh + size_t(i) * C, C, false);
            }
        }
    }
}

void CpuBackend::attention_backward(float* dqkv, float* scratch, const float* dout,
                                    const float* qkv, const float* att, const float* out,
                                    const float* positions, int B, int T, int C, int H,
                                    const AttentionOptions& opt) {
    check_attention(T, C, H, opt);
    // Overwrite: the kernels below add their sums, so they start from zeros
    if (opt.dqkv_store == GradStore::Overwrite) zero(dqkv, size_t(B) * T * 3 * C);
    if (opt.mode == AttentionMode::Flash) {
        flash_backward(dqkv, scratch, dout, qkv, att, out, positions, B, T, C, H, opt);
        return;
    }
    CTX_CHECK(opt.mode == AttentionMode::Materialised, "attention: unknown mode {}",
              int(opt.mode));
    const int D = C / H, C3 = 3 * C;
    const float scale = 1.0f / std::sqrt(float(D));
    const BiasSpec& bs = opt.bias;
    int lut[kT5LutSize + 1];
    const BiasEval be = make_bias_eval(bs, lut);
    const BiasGrads bg = bias_grads_of(bs);
    const bool bias_grads = bg.params, table_grads = bg.table;
    const int n_bias_grads = bg.n;
    const size_t buf_floats = attn_buffer_floats(T), thread_floats = buf_floats + panel_floats(T, D);
    float* slots = scratch + size_t(threads_) * thread_floats;  // (B*H, kMaxT5Buckets)

#pragma omp parallel num_threads(threads_)
    {
        float* buf = scratch + size_t(omp_get_thread_num()) * thread_floats;  // (kAttnBlock, T)
        float* vt = buf + buf_floats;                                         // (D, T)
#pragma omp for schedule(static)
        for (int bh = 0; bh < B * H; bh++) {
            const int b = bh / H, h = bh % H;
            const size_t head = size_t(b) * T * C3 + size_t(h) * D;
            const float* q = qkv + head;                                    // (T, D), ld 3C
            const float* k = q + C;                                         // (T, D), ld 3C
            const float* v = q + 2 * C;                                     // (T, D), ld 3C
            float* dq = dqkv + head;                                        // (T, D), ld 3C
            float* dk = dq + C;                                             // (T, D), ld 3C
            float* dv = dq + 2 * C;                                         // (T, D), ld 3C
            const float* dout_bh = dout + size_t(b) * T * C + size_t(h) * D;  // (T, D), ld C
            const float* att_bh = att + size_t(bh) * T * T;                 // (T, T)
            const float* pos = positions + size_t(b) * T;                   // (T)
            float* dtable_bh = table_grads ? bs.dtable + size_t(bh) * T * T : nullptr;  // (T, T)
            double g[kMaxT5Buckets];  // this pair's bias-parameter gradients
            if (bias_grads) std::fill(g, g + n_bias_grads, 0.0);

            transpose_into(vt, T, v, C3, T, D);  // (D, T) from (T, D)
            for (int i0 = 0; i0 < T; i0 += kAttnBlock) {
                const int i1 = std::min(T, i0 + kAttnBlock), j0 = key_lo(opt, b, T, i0);
                const int M = i1 - i0, Nk = i1 - j0;
                const float* p_blk = att_bh + size_t(i0) * T + j0;  // (M, Nk), ld T
                // dP (M, Nk) = dout[i0:i1] v[j0:i1]^T, each row group to its last row's key
                // (the rest of a row is 0: P is 0 there)
                for (int i = i0; i < i1; i += kTileMR) {
                    const int mr = std::min(kTileMR, i1 - i), n = i + mr - j0;
                    float* dp = buf + size_t(i - i0) * Nk;
                    tile_gemm_rows(mr, n, D, 1.0f, dout_bh + size_t(i) * C, C, 1, vt + j0, T, dp,
                                   Nk, false);
                    for (int r = 0; r < mr; r++)
                        std::fill(dp + size_t(r) * Nk + n, dp + size_t(r + 1) * Nk, 0.0f);
                }
                // dv[j] += sum_i P[i, j] dout[i] over the rows i >= j of the block
                for (int j = j0; j < i1; j += kTileMR) {
                    const int mr = std::min(kTileMR, i1 - j), lo = std::max(i0, j) - i0;
                    tile_gemm_rows(mr, D, M - lo, 1.0f, p_blk + size_t(lo) * T + (j - j0), 1, T,
                                   dout_bh + size_t(i0 + lo) * C, C, dv + size_t(j) * C3, C3,
                                   true);
                }
                // dlogit = P * (dP - sum_j P dP), in place in buf (P = 0 outside the mask)
                for (int i = i0; i < i1; i++) {
                    const float* p = att_bh + size_t(i) * T + j0;  // (Nk) keys j0 .. i1-1
                    float* ds = buf + size_t(i - i0) * Nk;         // (Nk) keys j0 .. i1-1
                    float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
                    for (int j = 0; j < Nk; j++) dot += p[j] * ds[j];
#pragma omp simd
                    for (int j = 0; j < Nk; j++) ds[j] = p[j] * (ds[j] - dot);
                    if (bias_grads)
                        bias_grad_row(g, ds, j0, pos, i, key_lo(opt, b, T, i), h, bs, be);
                    if (dtable_bh != nullptr) {  // d logit / d table = 1 on the entries read
                        float* drow = dtable_bh + size_t(i) * T;
                        const int lo = key_lo(opt, b, T, i);
#pragma omp simd
                        for (int j = lo; j <= i; j++) drow[j] += ds[j - j0];
                    }
                }
                // dq[i] += dS[i, j0 : i_last + 1] k[j0 : i_last + 1] / sqrt(D)
                for (int i = i0; i < i1; i += kTileMR) {
                    const int mr = std::min(kTileMR, i1 - i);
                    tile_gemm_rows(mr, D, i + mr - j0, scale, buf + size_t(i - i0) * Nk, Nk, 1,
                                   k + size_t(j0) * C3, C3, dq + size_t(i) * C3, C3, true);
                }
                // dk[j] += sum_{i >= j} dS[i, j] q[i] / sqrt(D)
                for (int j = j0; j < i1; j += kTileMR) {
                    const int mr = std::min(kTileMR, i1 - j), lo = std::max(i0, j) - i0;
                    tile_gemm_rows(mr, D, M - lo, scale, buf + size_t(lo) * Nk + (j - j0), 1, Nk,
                                   q + size_t(i0 + lo) * C3, C3, dk + size_t(j) * C3, C3, true);
                }
            }
            if (bias_grads) {
                float* slot = slots + size_t(bh) * kMaxT5Buckets;
                for (int x = 0; x < n_bias_grads; x++) slot[x] = float(g[x]);
            }
        }
    }

    // Reduce the per-(b, h) slots in a fixed order (deterministic for any thread count).
    if (bias_grads) reduce_bias_slots(slots, B, H, bs);
}

// ================================================================ attention over a KV cache

size_t CpuBackend::attention_cached_scratch_floats(int S) const {
    return size_t(threads_) * ((size_t(S) + 15) / 16 * 16);
}

// One (row, head, query) per iteration: Tq is 1 when decoding, so parallelism comes from rows
// and heads; a prefill (B = 1, Tq = prompt length) spreads its queries over the threads.
void CpuBackend::attention_cached_forward(float* out, float* scratch, const float* qkv,
                                          const float* kc, const float* vc, const float* kpos,
                                          const int32_t* lens, int B, int Tq, int S, int C, int H,
                                          const AttentionOptions& opt) {
    check_attention_cached(S, C, H, opt);
    CTX_CHECK(Tq >= 1 && Tq <= S, "cached attention: need 1 <= Tq ({}) <= S ({})", Tq, S);
    for (int b = 0; b < B; b++)
        CTX_CHECK(lens[b] >= Tq && lens[b] <= S, "cached attention: row {} holds {} entries; "
                  "need Tq ({}) <= entries <= S ({})", b, lens[b], Tq, S);
    const int D = C / H, C3 = 3 * C;
    const float scale = 1.0f / std::sqrt(float(D));
    const size_t stride = (size_t(S) + 15) / 16 * 16;
    int lut[kT5LutSize + 1];
    const BiasEval be = make_bias_eval(opt.bias, lut);

    // With a head subset, iteration h of a query runs its h-th listed head (HS of them).
    const int HS = opt.heads ? opt.heads_k : H;
#pragma omp parallel for schedule(static) num_threads(threads_)
    for (int bhi = 0; bhi < B * HS * Tq; bhi++) {
        const int b = bhi / (HS * Tq), i = bhi % Tq;
        int h = (bhi / Tq) % HS;
        if (opt.heads) {
            h = opt.heads[(size_t(b) * Tq + i) * HS + h];
            if (h < 0) continue;
        }
        const int c = lens[b] - Tq + i, lo = key_start(c, opt.window);
        const float* q = qkv + (size_t(b) * Tq + i) * C3 + size_t(h) * D;  // (D)
        const float* k = kc + size_t(b) * S * C + size_t(h) * D;            // (S, D), ld C
        const float* v = vc + size_t(b) * S * C + size_t(h) * D;            // (S, D), ld C
        const float* pos = kpos + size_t(b) * S;                            // (S)
        float* row = scratch + size_t(omp_get_thread_num()) * stride;       // (S)
        for (int j = lo; j <= c; j++) {
            const float* kj = k + size_t(j) * C;
            float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
            for (int d = 0; d < D; d++) dot += q[d] * kj[d];
            row[j] = dot * scale;
        }
        const float* trow = opt.bias.kind == BiasKind::Table
                                ? opt.bias.table + ((size_t(b) * H + h) * Tq + i) * S
                                : nullptr;
        add_bias_row(row, 0, trow, pos, c, lo, h, opt.bias, be);
        const float mx = row_max(row + lo, c - lo + 1);
        float sum = 0.0f;
        for (int j = lo; j <= c; j++) {
            row[j] = fast_exp(row[j] - mx);
            sum += row[j];
        }
        const float inv = 1.0f / sum;
        float* o = out + (size_t(b) * Tq + i) * C + size_t(h) * D;  // (D)
        for (int d = 0; d < D; d++) o[d] = 0.0f;
        for (int j = lo; j <= c; j++) {
            const float p = row[j] * inv;
            const float* vj = v + size_t(j) * C;
#pragma omp simd
            for (int d = 0; d < D; d++) o[d] += p * vj[d];
        }
    }
}

}  // namespace ctx::cpu
