// CPU backend: attention across blocks of a row (backend.h, context parallelism). Per (b, h)
// pair and tile of kAttnBlock queries, the products are sgemms over the whole key block and the
// mask, bias and softmax plain loops; the visibility rule works on global indices, so a block
// may hold any set of a row's tokens (the zigzag split gives each rank two chunks).
//   forward : s_ij = q_i . k_j / sqrt(D) + bias_h(p_i - p_j) over visible j;
//             lse_i = log sum_j exp(s_ij), out_i = sum_j exp(s_ij - lse_i) v_j
//   merge   : the online softmax of flash attention, one block at a time
//   backward: with the merged out and lse, P_ij = exp(s_ij - lse_i), D_i = dout_i . out_i,
//             dS_ij = P_ij (dout_i . v_j - D_i); dq_i += dS_ij k_j / sqrt(D),
//             dk_j += dS_ij q_i / sqrt(D), dv_j += P_ij dout_i, bias gradients from dS.
// Every (b, h) pair runs on one thread with its own bias-gradient slots, reduced in a fixed
// order, so results do not depend on the thread count. Each query tile computes only the span
// of keys it can see (visible_keys): a tile that sees none of a block skips it.
#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_math.h"
#include "backend/op_common.h"
#include "core/error.h"

namespace ctx::cpu {

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

bool visible(const AttnBlockRows& q, const AttnBlockRows& k, size_t qi, size_t kj, int window) {
    return attn_block_visible(q, k, qi, kj, window);
}

// bias_h(pi - pj) of BiasSpec (backend.h). table: the pair's entry of a Table bias.
float bias_value(const BiasSpec& bs, int h, float pi, float pj, float table) {
    const float d = pi - pj;
    switch (bs.kind) {
        case BiasKind::Linear: return -bs.a[h] * d;
        case BiasKind::KerpleLog: return -bs.a[h] * std::log(1.0f + bs.b[h] * std::fabs(d));
        case BiasKind::KerplePower: {
            const float ad = std::fabs(d);
            return ad > 0.0f ? -bs.a[h] * std::pow(ad, bs.b[h]) : 0.0f;
        }
        case BiasKind::T5:
            return bs.a[size_t(h) * bs.num_buckets +
                        t5_bucket(double(pi) - double(pj), bs.num_buckets, bs.max_distance)];
        case BiasKind::Table: return table;
        default: return 0.0f;
    }
}

// g (slots of head h) += ds * d(bias)/d(parameters): [a, b] or T5's buckets.
void bias_grad(double* g, const BiasSpec& bs, int h, float pi, float pj, float ds) {
    const float d = pi - pj, ad = std::fabs(d);
    switch (bs.kind) {
        case BiasKind::Linear: g[0] -= double(ds) * d; break;
        case BiasKind::KerpleLog: {
            const float u = 1.0f + bs.b[h] * ad;
            g[0] -= double(ds) * std::log(u);
            g[1] -= double(ds) * bs.a[h] * ad / u;
            break;
        }
        case BiasKind::KerplePower:
            if (ad > 0.0f) {
                const float pw = std::pow(ad, bs.b[h]);
                g[0] -= double(ds) * pw;
                g[1] -= double(ds) * bs.a[h] * pw * std::log(ad);
            }
            break;
        case BiasKind::T5:
            g[t5_bucket(double(pi) - double(pj), bs.num_buckets, bs.max_distance)] += ds;
            break;
        default: break;
    }
}

void check_block(const float* q, const float* kv, const AttnBlockRows& qr,
                 const AttnBlockRows& kr, int C, int H, const AttentionOptions& opt) {
    CTX_CHECK(q && kv && qr.index && kr.index && qr.positions && kr.positions,
              "attention_block: q, kv and both blocks' indices and positions are required");
    CTX_CHECK(qr.T >= 0 && kr.T >= 0, "attention_block: negative block length");
    check_attention(1, C, H, opt);
    CTX_CHECK(opt.bias.kind != BiasKind::Table || opt.bias.table,
              "attention_block: a Table bias needs its (B, H, Tq, Tk) table");
}

// Keys [j0, j1) of row b that some query of rows [i0, i0 + M) may see; every pair outside is
// masked. Indices ascend along a row, so causality ends the span at the tile's last query, and
// the window and the document start (both non-decreasing along the row) begin it at the tile's
// first query. The zigzag split makes many (tile, block) pairs empty or partly masked.
struct KeySpan {
    int j0 = 0, n = 0;
};
KeySpan visible_keys(const AttnBlockRows& qr, const AttnBlockRows& kr, int b, int i0, int M,
                     int window) {
    const int32_t* qi = qr.index + size_t(b) * qr.T;
    const int32_t* ki = kr.index + size_t(b) * kr.T;
    int64_t lo = std::numeric_limits<int64_t>::min();
    if (window > 0) lo = int64_t(qi[i0]) - window + 1;
    if (qr.doc_start) lo = std::max<int64_t>(lo, qr.doc_start[size_t(b) * qr.T + i0]);
    const int j1 = int(std::upper_bound(ki, ki + kr.T, qi[i0 + M - 1]) - ki);
    const int j0 = int(std::lower_bound(ki, ki + kr.T, lo,
                                        [](int32_t k, int64_t v) { return int64_t(k) < v; }) -
                       ki);
    return j0 < j1 ? KeySpan{j0, j1 - j0} : KeySpan{j1, 0};
}

// Logits of query rows [i0, i0 + M) of pair (b, h) against keys [ks.j0, ks.j0 + ks.n) of the
// block into S (M, ks.n): q k^T / sqrt(D) by sgemm, then the bias on visible pairs and -inf on
// the others.
void block_logits(float* S, int M, int i0, const KeySpan& ks, int b, int h, int bh,
                  const float* q, const float* kv, const AttnBlockRows& qr,
                  const AttnBlockRows& kr, int C, int D, float scale, const AttentionOptions& opt) {
    const int Tq = qr.T, Tk = kr.T, n = ks.n;
    const float* qb = q + (size_t(b) * Tq + i0) * 3 * C + size_t(h) * D;            // (M, D) ld 3C
    const float* kb = kv + (size_t(b) * Tk + ks.j0) * 2 * C + size_t(h) * D;        // (n, D) ld 2C
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, n, D, scale, qb, 3 * C, kb, 2 * C,
                0.0f, S, n);
    for (int m = 0; m < M; m++) {
        const size_t qi = size_t(b) * Tq + i0 + m;
        float* row = S + size_t(m) * n;
        for (int j = 0; j < n; j++) {
            const size_t kj = size_t(b) * Tk + ks.j0 + j;
            if (!visible(qr, kr, qi, kj, opt.window)) {
                row[j] = kNegInf;
                continue;
            }
            const float table = opt.bias.kind == BiasKind::Table
                                    ? opt.bias.table[(size_t(bh) * Tq + i0 + m) * Tk + ks.j0 + j]
                                    : 0.0f;
            row[j] += bias_value(opt.bias, h, qr.positions[qi], kr.positions[kj], table);
        }
    }
}

}  // namespace

void CpuBackend::attention_block_forward(float* out_b, float* lse_b, const float* q,
                                         const float* kv, const AttnBlockRows& qr,
                                         const AttnBlockRows& kr, int B, int C, int H,
                                         const AttentionOptions& opt) {
    check_block(q, kv, qr, kr, C, H, opt);
    const int D = C / H, Tq = qr.T, Tk = kr.T;
    const float scale = 1.0f / std::sqrt(float(D));
#pragma omp parallel num_threads(threads_)
    {
        std::vector<float> S(size_t(kAttnBlock) * Tk);  // (M, Tk) one query tile's logits
#pragma omp for schedule(static)
        for (int bh = 0; bh < B * H; bh++) {
            const int b = bh / H, h = bh % H;
            for (int i0 = 0; i0 < Tq; i0 += kAttnBlock) {
                const int M = std::min(kAttnBlock, Tq - i0);
                float* o = out_b + (size_t(b) * Tq + i0) * C + size_t(h) * D;  // (M, D) ld C
                const KeySpan ks = visible_keys(qr, kr, b, i0, M, opt.window);
                const int n = ks.n;
                if (n == 0) {  // no query of the tile sees a key of this block
                    for (int m = 0; m < M; m++) {
                        for (int d = 0; d < D; d++) o[size_t(m) * C + d] = 0.0f;
                        lse_b[size_t(bh) * Tq + i0 + m] = kNegInf;
                    }
                    continue;
                }
                block_logits(S.data(), M, i0, ks, b, h, bh, q, kv, qr, kr, C, D, scale, opt);
                float inv[kAttnBlock];
                for (int m = 0; m < M; m++) {  // P = exp(S - max) in place, its row sums
                    float* row = S.data() + size_t(m) * n;
                    float mx = kNegInf;
#pragma omp simd reduction(max : mx)
                    for (int j = 0; j < n; j++) mx = std::max(mx, row[j]);
                    float* lse = lse_b + size_t(bh) * Tq + i0 + m;
                    if (mx == kNegInf) {  // no visible key in this block
                        for (int j = 0; j < n; j++) row[j] = 0.0f;
                        *lse = kNegInf;
                        inv[m] = 0.0f;
                        continue;
                    }
                    double sum = 0.0;  // masked entries: fast_exp(-inf) = 0
#pragma omp simd reduction(+ : sum)
                    for (int j = 0; j < n; j++) {
                        row[j] = fast_exp(row[j] - mx);
                        sum += row[j];
                    }
                    *lse = mx + float(std::log(sum));
                    inv[m] = float(1.0 / sum);
                }
                // out (M, D) = P v / rowsum over the span's values
                const float* v = kv + (size_t(b) * Tk + ks.j0) * 2 * C + C + size_t(h) * D;
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, M, D, n, 1.0f, S.data(),
                            n, v, 2 * C, 0.0f, o, C);
                for (int m = 0; m < M; m++)
                    for (int d = 0; d < D; d++) o[size_t(m) * C + d] *= inv[m];
            }
        }
    }
}

void CpuBackend::attention_block_merge(float* out, float* lse, const float* out_b,
                                       const float* lse_b, int B, int Tq, int C, int H) {
    const int D = C / H;
#pragma omp parallel for schedule(static) num_threads(threads_)
    for (int bh = 0; bh < B * H; bh++) {
        const int b = bh / H, h = bh % H;
        for (int i = 0; i < Tq; i++) {
            float& l = lse[size_t(bh) * Tq + i];
            const float lb = lse_b[size_t(bh) * Tq + i];
            if (lb == kNegInf) continue;  // the block saw nothing for this query
            const float m = std::max(l, lb);
            const float merged = m + std::log(std::exp(l - m) + std::exp(lb - m));
            const float wa = std::exp(l - merged), wb = std::exp(lb - merged);
            float* o = out + (size_t(b) * Tq + i) * C + size_t(h) * D;
            const float* ob = out_b + (size_t(b) * Tq + i) * C + size_t(h) * D;
            for (int d = 0; d < D; d++) o[d] = wa * o[d] + wb * ob[d];
            l = merged;
        }
    }
}

void CpuBackend::attention_block_backward(float* dq, float* dkv, const float* dout,
                                          const float* q, const float* kv, const float* out,
                                          const float* lse, const AttnBlockRows& qr,
                                          const AttnBlockRows& kr, int B, int C, int H,
                                          const AttentionOptions& opt) {
    check_block(q, kv, qr, kr, C, H, opt);
    const int D = C / H, Tq = qr.T, Tk = kr.T;
    const float scale = 1.0f / std::sqrt(float(D));
    const BiasSpec& bs = opt.bias;
    const bool param_grads = (bs.da || bs.db) && bs.kind != BiasKind::Table;
    const int slots = bs.kind == BiasKind::T5 ? bs.num_buckets : 2;
    std::vector<double> g(param_grads ? size_t(B) * H * slots : 0, 0.0);  // per (b, h)
    // Each (b, h) pair writes only its head's D columns of dq and dkv: pairs run in parallel.
#pragma omp parallel num_threads(threads_)
    {
        std::vector<float> P(size_t(kAttnBlock) * Tk), dS(size_t(kAttnBlock) * Tk);
#pragma omp for schedule(static)
        for (int bh = 0; bh < B * H; bh++) {
            const int b = bh / H, h = bh % H;
            double* gh = param_grads ? g.data() + size_t(bh) * slots : nullptr;
            const float* kb = kv + size_t(b) * Tk * 2 * C + size_t(h) * D;  // (Tk, D) ld 2C
            const float* vb = kb + C;
            float* dkb = dkv + size_t(b) * Tk * 2 * C + size_t(h) * D;
            float* dvb = dkb + C;
            for (int i0 = 0; i0 < Tq; i0 += kAttnBlock) {
                const int M = std::min(kAttnBlock, Tq - i0);
                const size_t q0 = size_t(b) * Tq + i0;
                const float* qb = q + q0 * 3 * C + size_t(h) * D;       // (M, D) ld 3C
                const float* gob = dout + q0 * C + size_t(h) * D;       // (M, D) ld C
                float* dqb = dq + q0 * 3 * C + size_t(h) * D;           // (M, D) ld 3C
                const KeySpan ks = visible_keys(qr, kr, b, i0, M, opt.window);
                const int n = ks.n;
                if (n == 0) continue;  // every pair masked: no gradient
                // P = exp(S - lse) (0 where masked or no key was visible), over the span
                block_logits(P.data(), M, i0, ks, b, h, bh, q, kv, qr, kr, C, D, scale, opt);
                for (int m = 0; m < M; m++) {
                    const float l = lse[size_t(bh) * Tq + i0 + m];
                    float* row = P.data() + size_t(m) * n;
                    if (l == kNegInf) {  // the query saw no key at all
                        std::fill(row, row + n, 0.0f);
                        continue;
                    }
#pragma omp simd
                    for (int j = 0; j < n; j++) row[j] = fast_exp(row[j] - l);  // masked: 0
                }
                const size_t off = size_t(ks.j0) * 2 * C;  // the span's first key row
                // dP (M, n) = dout v^T; dS = P (dP - Drow), Drow_i = dout_i . out_i
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, n, D, 1.0f, gob, C,
                            vb + off, 2 * C, 0.0f, dS.data(), n);
                for (int m = 0; m < M; m++) {
                    const float* go = gob + size_t(m) * C;
                    const float* o = out + (q0 + m) * C + size_t(h) * D;
                    float Drow = 0.0f;
                    for (int d = 0; d < D; d++) Drow += go[d] * o[d];
                    const size_t qi = q0 + m;
                    float* ds = dS.data() + size_t(m) * n;
                    const float* p = P.data() + size_t(m) * n;
                    for (int j = 0; j < n; j++) {
                        ds[j] = p[j] * (ds[j] - Drow);
                        if (p[j] == 0.0f) continue;  // masked (or underflowed: no gradient)
                        const size_t kj = size_t(b) * Tk + ks.j0 + j;
                        if (gh) bias_grad(gh, bs, h, qr.positions[qi], kr.positions[kj], ds[j]);
                        if (bs.kind == BiasKind::Table && bs.dtable)
                            bs.dtable[(size_t(bh) * Tq + i0 + m) * Tk + ks.j0 + j] += ds[j];
                    }
                }
                // dq += dS k / sqrt(D); dk += dS^T q / sqrt(D); dv += P^T dout (the span's rows)
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, M, D, n, scale, dS.data(),
                            n, kb + off, 2 * C, 1.0f, dqb, 3 * C);
                cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, n, D, M, scale, dS.data(), n,
                            qb, 3 * C, 1.0f, dkb + off, 2 * C);
                cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, n, D, M, 1.0f, P.data(), n,
                            gob, C, 1.0f, dvb + off, 2 * C);
            }
        }
    }
    if (!param_grads) return;
    // fixed order: rows b, then heads
    for (int bh = 0; bh < B * H; bh++) {
        const int h = bh % H;
        const double* gh = g.data() + size_t(bh) * slots;
        if (bs.kind == BiasKind::T5) {
            if (bs.da)
                for (int k = 0; k < slots; k++) bs.da[size_t(h) * slots + k] += float(gh[k]);
        } else {
            if (bs.da) bs.da[h] += float(gh[0]);
            if (bs.db) bs.db[h] += float(gh[1]);
        }
    }
}

}  // namespace ctx::cpu
