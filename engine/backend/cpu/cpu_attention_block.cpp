// CPU backend: attention across blocks of a row (backend.h, context parallelism). Plain loops
// over (b, h, i, j) that read like the math; the visibility rule works on global indices, so a
// block may hold any set of a row's tokens (the zigzag split gives each rank two chunks).
//   forward : s_ij = q_i . k_j / sqrt(D) + bias_h(p_i - p_j) over visible j;
//             lse_i = log sum_j exp(s_ij), out_i = sum_j exp(s_ij - lse_i) v_j
//   merge   : the online softmax of flash attention, one block at a time
//   backward: with the merged out and lse, P_ij = exp(s_ij - lse_i), D_i = dout_i . out_i,
//             dS_ij = P_ij (dout_i . v_j - D_i); dq_i += dS_ij k_j / sqrt(D),
//             dk_j += dS_ij q_i / sqrt(D), dv_j += P_ij dout_i, bias gradients from dS.
// Every (b, h) pair runs on one thread with its own bias-gradient slots, reduced in a fixed
// order, so results do not depend on the thread count.
#include <omp.h>

#include <cmath>
#include <limits>
#include <vector>

#include "backend/cpu/cpu_backend.h"
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
        std::vector<float> s(static_cast<size_t>(Tk));  // (Tk) one query's logits
#pragma omp for schedule(static)
        for (int bh = 0; bh < B * H; bh++) {
            const int b = bh / H, h = bh % H;
            for (int i = 0; i < Tq; i++) {
                const size_t qi = size_t(b) * Tq + i;
                const float* qv = q + qi * 3 * C + size_t(h) * D;  // (D)
                float* o = out_b + qi * C + size_t(h) * D;         // (D)
                float mx = kNegInf;
                for (int j = 0; j < Tk; j++) {
                    const size_t kj = size_t(b) * Tk + j;
                    s[j] = kNegInf;
                    if (!visible(qr, kr, qi, kj, opt.window)) continue;
                    const float* kvec = kv + kj * 2 * C + size_t(h) * D;  // (D)
                    float dot = 0.0f;
                    for (int d = 0; d < D; d++) dot += qv[d] * kvec[d];
                    const float table = opt.bias.kind == BiasKind::Table
                                            ? opt.bias.table[(size_t(bh) * Tq + i) * Tk + j]
                                            : 0.0f;
                    s[j] = dot * scale + bias_value(opt.bias, h, qr.positions[qi],
                                                    kr.positions[kj], table);
                    mx = std::max(mx, s[j]);
                }
                for (int d = 0; d < D; d++) o[d] = 0.0f;
                float* lse = lse_b + size_t(bh) * Tq + i;
                if (mx == kNegInf) {  // no visible key in this block
                    *lse = kNegInf;
                    continue;
                }
                double sum = 0.0;
                for (int j = 0; j < Tk; j++) {
                    if (s[j] == kNegInf) continue;
                    const float e = std::exp(s[j] - mx);
                    sum += e;
                    const float* v = kv + (size_t(b) * Tk + j) * 2 * C + C + size_t(h) * D;
                    for (int d = 0; d < D; d++) o[d] += e * v[d];
                }
                const float inv = float(1.0 / sum);
                for (int d = 0; d < D; d++) o[d] *= inv;
                *lse = mx + float(std::log(sum));
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
#pragma omp parallel for schedule(static) num_threads(threads_)
    for (int bh = 0; bh < B * H; bh++) {
        const int b = bh / H, h = bh % H;
        double* gh = param_grads ? g.data() + size_t(bh) * slots : nullptr;
        for (int i = 0; i < Tq; i++) {
            const size_t qi = size_t(b) * Tq + i;
            const float l = lse[size_t(bh) * Tq + i];
            if (l == kNegInf) continue;
            const float* qv = q + qi * 3 * C + size_t(h) * D;
            const float* go = dout + qi * C + size_t(h) * D;
            const float* o = out + qi * C + size_t(h) * D;
            float* gq = dq + qi * 3 * C + size_t(h) * D;
            float Drow = 0.0f;
            for (int d = 0; d < D; d++) Drow += go[d] * o[d];
            for (int j = 0; j < Tk; j++) {
                const size_t kj = size_t(b) * Tk + j;
                if (!visible(qr, kr, qi, kj, opt.window)) continue;
                const float* kvec = kv + kj * 2 * C + size_t(h) * D;
                const float* v = kvec + C;
                float dot = 0.0f, dp = 0.0f;
                for (int d = 0; d < D; d++) {
                    dot += qv[d] * kvec[d];
                    dp += go[d] * v[d];
                }
                const size_t t = (size_t(bh) * Tq + i) * Tk + j;  // the pair's Table entry
                const float table = bs.kind == BiasKind::Table ? bs.table[t] : 0.0f;
                const float pi = qr.positions[qi], pj = kr.positions[kj];
                const float p = std::exp(dot * scale + bias_value(bs, h, pi, pj, table) - l);
                const float ds = p * (dp - Drow);
                float* gk = dkv + kj * 2 * C + size_t(h) * D;
                float* gv = gk + C;
                for (int d = 0; d < D; d++) {
                    gq[d] += ds * scale * kvec[d];
                    gk[d] += ds * scale * qv[d];
                    gv[d] += p * go[d];
                }
                if (gh) bias_grad(gh, bs, h, pi, pj, ds);
                if (bs.kind == BiasKind::Table && bs.dtable) bs.dtable[t] += ds;
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
