// Naive reference implementations of the backend ops (backend.h, METHODS.md 1.3-1.6) and
// finite-difference helpers for the op tests. Plain loops in double precision, written from the
// op contract alone (not from the optimized CPU code), so the tests compare two independent
// implementations. Gradients are never written by hand here: tests get them by central
// differences of these forward functions.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <vector>

namespace ref {

using Vec = std::vector<double>;

// ---------------------------------------------------------------- random data + conversions

struct Rng {
    std::mt19937_64 gen;
    explicit Rng(uint64_t seed) : gen(seed) {}
    double uniform(double lo, double hi) { return std::uniform_real_distribution<double>(lo, hi)(gen); }
    double normal(double stddev = 1.0) { return std::normal_distribution<double>(0.0, stddev)(gen); }
    int integer(int lo, int hi_inclusive) {
        return std::uniform_int_distribution<int>(lo, hi_inclusive)(gen);
    }
    // n values, each exactly representable in float (so float and double tests see the same data)
    Vec normals(size_t n, double stddev = 1.0) {
        Vec v(n);
        for (auto& x : v) x = double(float(normal(stddev)));
        return v;
    }
    Vec uniforms(size_t n, double lo, double hi) {
        Vec v(n);
        for (auto& x : v) x = double(float(uniform(lo, hi)));
        return v;
    }
};

inline std::vector<float> to_float(const Vec& v) { return std::vector<float>(v.begin(), v.end()); }
inline Vec to_double(const std::vector<float>& v) { return Vec(v.begin(), v.end()); }

inline double dot(const Vec& a, const Vec& b) {
    double s = 0.0;
    for (size_t i = 0; i < a.size(); i++) s += a[i] * b[i];
    return s;
}

// ---------------------------------------------------------------- finite differences

// Central-difference gradient of f at x, for the coordinates in `which` (all if empty); the
// entries not in `which` are left at 0.
inline Vec numeric_grad(const std::function<double(const Vec&)>& f, Vec x, double eps = 1e-6,
                        const std::vector<size_t>& which = {}) {
    Vec g(x.size(), 0.0);
    auto one = [&](size_t i) {
        const double x0 = x[i];
        x[i] = x0 + eps;
        const double fp = f(x);
        x[i] = x0 - eps;
        const double fm = f(x);
        x[i] = x0;
        g[i] = (fp - fm) / (2.0 * eps);
    };
    if (which.empty()) {
        for (size_t i = 0; i < x.size(); i++) one(i);
    } else {
        for (size_t i : which) one(i);
    }
    return g;
}

// Largest |got - want| over the entries, divided by the largest |want| (0 when both are 0).
// `which` limits the comparison to some entries (all if empty).
template <class Got>  // std::vector<float> or Vec
double max_rel_error(const Got& got, const Vec& want,
                            const std::vector<size_t>& which = {}) {
    double err = 0.0, mag = 0.0;
    auto one = [&](size_t i) {
        err = std::max(err, std::fabs(double(got[i]) - want[i]));
        mag = std::max(mag, std::fabs(want[i]));
    };
    if (which.empty()) {
        for (size_t i = 0; i < want.size(); i++) one(i);
    } else {
        for (size_t i : which) one(i);
    }
    if (err == 0.0) return 0.0;
    return mag > 0.0 ? err / mag : INFINITY;
}

// ---------------------------------------------------------------- embedding

// out (N, C) = wte[tokens[n]] + interp(wpe, positions[n]); wpe empty: no position table.
inline Vec embedding_forward(const std::vector<int32_t>& tokens, const std::vector<float>& positions,
                             const Vec& wte, const Vec& wpe, int N, int C, int P) {
    Vec out(size_t(N) * C);
    for (int n = 0; n < N; n++) {
        for (int c = 0; c < C; c++) out[size_t(n) * C + c] = wte[size_t(tokens[n]) * C + c];
        if (wpe.empty()) continue;
        const double p = positions[n];
        const int j = int(std::floor(p));
        const double f = p - j;
        const int j1 = std::min(j + 1, P - 1);
        for (int c = 0; c < C; c++)
            out[size_t(n) * C + c] += (1.0 - f) * wpe[size_t(j) * C + c] + f * wpe[size_t(j1) * C + c];
    }
    return out;
}

// ---------------------------------------------------------------- layer norm

// out (N, C) = (x - mean) / sqrt(var + eps) * w + b (b empty: no bias); mean, rstd (N) if given.
inline Vec layernorm_forward(const Vec& inp, const Vec& w, const Vec& b, int N, int C, double eps,
                             Vec* mean = nullptr, Vec* rstd = nullptr) {
    Vec out(size_t(N) * C);
    if (mean) mean->assign(N, 0.0);
    if (rstd) rstd->assign(N, 0.0);
    for (int n = 0; n < N; n++) {
        const double* x = &inp[size_t(n) * C];
        double m = 0.0;
        for (int c = 0; c < C; c++) m += x[c];
        m /= C;
        double var = 0.0;
        for (int c = 0; c < C; c++) var += (x[c] - m) * (x[c] - m);
        var /= C;
        const double s = 1.0 / std::sqrt(var + eps);
        for (int c = 0; c < C; c++)
            out[size_t(n) * C + c] = (x[c] - m) * s * w[c] + (b.empty() ? 0.0 : b[c]);
        if (mean) (*mean)[n] = m;
        if (rstd) (*rstd)[n] = s;
    }
    return out;
}

// out (N, C) = x / sqrt(mean(x^2) + eps) * w   (RMS norm; rstd saved)
inline Vec rmsnorm_forward(const Vec& inp, const Vec& w, int N, int C, double eps,
                           Vec* rstd = nullptr) {
    Vec out(size_t(N) * C);
    if (rstd) rstd->assign(N, 0.0);
    for (int n = 0; n < N; n++) {
        const double* x = &inp[size_t(n) * C];
        double ms = 0.0;
        for (int c = 0; c < C; c++) ms += x[c] * x[c];
        const double s = 1.0 / std::sqrt(ms / C + eps);
        for (int c = 0; c < C; c++) out[size_t(n) * C + c] = x[c] * s * w[c];
        if (rstd) (*rstd)[n] = s;
    }
    return out;
}

// ---------------------------------------------------------------- dense layer

// out (N, OC) = inp (N, IC) @ W^T (W is (OC, IC)) + bias (empty: none)
inline Vec matmul_forward(const Vec& inp, const Vec& W, const Vec& bias, int N, int IC, int OC) {
    Vec out(size_t(N) * OC);
    for (int n = 0; n < N; n++)
        for (int o = 0; o < OC; o++) {
            double s = bias.empty() ? 0.0 : bias[o];
            for (int i = 0; i < IC; i++) s += inp[size_t(n) * IC + i] * W[size_t(o) * IC + i];
            out[size_t(n) * OC + o] = s;
        }
    return out;
}

// ---------------------------------------------------------------- activations

inline double gelu_tanh(double x) {
    const double k = std::sqrt(2.0 / M_PI);
    return 0.5 * x * (1.0 + std::tanh(k * (x + 0.044715 * x * x * x)));
}
inline double gelu_erf(double x) { return 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0))); }

// ---------------------------------------------------------------- rotary (METHODS.md 1.3)

struct Rotary {
    int dr = 0;
    bool interleaved = false;
    Vec inv_freq;            // (dr/2)
    double position_scale = 1.0;
    double attention_factor = 1.0;
    Vec amp_base;            // (dr/2) or empty
    double amp_scale_base = 512.0;
};

// Rotates the q and k thirds of qkv (B, T, 3C) per the spec; v and dims >= dr are copied.
inline Vec rotary_forward(const Vec& qkv, const std::vector<float>& positions, int B, int T, int C,
                          int H, const Rotary& r) {
    Vec out = qkv;
    const int D = C / H;
    for (int bt = 0; bt < B * T; bt++) {
        const double p = positions[bt];
        for (int which = 0; which < 2; which++) {  // 0: q, 1: k
            for (int h = 0; h < H; h++) {
                const size_t base = size_t(bt) * 3 * C + size_t(which) * C + size_t(h) * D;
                for (int k = 0; k < r.dr / 2; k++) {
                    const int i0 = r.interleaved ? 2 * k : k;
                    const int i1 = r.interleaved ? 2 * k + 1 : k + r.dr / 2;
                    const double a = p * r.position_scale * r.inv_freq[k];
                    double s = r.attention_factor;
                    if (!r.amp_base.empty())
                        s *= std::pow(r.amp_base[k], (which == 0 ? p : -p) / r.amp_scale_base);
                    const double x0 = qkv[base + i0], x1 = qkv[base + i1];
                    out[base + i0] = s * (std::cos(a) * x0 - std::sin(a) * x1);
                    out[base + i1] = s * (std::sin(a) * x0 + std::cos(a) * x1);
                }
            }
        }
    }
    return out;
}

// ---------------------------------------------------------------- attention bias (METHODS 1.4-1.6)

enum BiasKind { kNone = 0, kLinear = 1, kKerpleLog = 2, kKerplePower = 3, kT5 = 4 };

struct Bias {
    int kind = kNone;
    Vec a;  // (H) or (H, num_buckets) for T5
    Vec b;  // (H)
    int num_buckets = 32;
    int max_distance = 128;
};

// METHODS.md 1.6: n = max(0, floor(d)), max_exact = num_buckets / 2.
inline int t5_bucket(double d, int num_buckets, int max_distance) {
    const double n = std::max(0.0, std::floor(d));
    const int max_exact = num_buckets / 2;
    if (n < max_exact) return int(n);
    const double v = max_exact + std::floor(std::log(n / max_exact) /
                                            std::log(double(max_distance) / max_exact) *
                                            (num_buckets - max_exact));
    return int(std::min<double>(num_buckets - 1, v));
}

// bias_h(d), d = p_i - p_j
inline double bias_value(const Bias& bias, int h, double d) {
    switch (bias.kind) {
        case kLinear: return -bias.a[h] * d;
        case kKerpleLog: return -bias.a[h] * std::log(1.0 + bias.b[h] * std::fabs(d));
        case kKerplePower: return d == 0.0 ? 0.0 : -bias.a[h] * std::pow(std::fabs(d), bias.b[h]);
        case kT5:
            return bias.a[size_t(h) * bias.num_buckets +
                          t5_bucket(d, bias.num_buckets, bias.max_distance)];
        default: return 0.0;
    }
}

// ALiBi slopes for n heads (METHODS.md 1.4).
inline Vec alibi_slopes(int n) {
    auto pow2 = [](int m) {
        Vec s(m);
        const double start = std::pow(2.0, -8.0 / m);
        for (int h = 0; h < m; h++) s[h] = std::pow(start, h + 1);
        return s;
    };
    int c = 1;
    while (c * 2 <= n) c *= 2;
    Vec s = pow2(c);
    if (c < n) {
        const Vec s2 = pow2(2 * c);
        for (int i = 0; i < n - c; i++) s.push_back(s2[2 * i]);
    }
    return s;
}

// Packed rows: `docs` documents of random lengths (at least 1 token) per row of T; for each
// token the index of its document's first token (AttentionOptions::doc_start).
inline std::vector<int32_t> doc_starts(Rng& rng, int B, int T, int docs) {
    std::vector<int32_t> out(size_t(B) * T);
    for (int b = 0; b < B; b++) {
        std::vector<int> cuts;  // first tokens of documents 2 .. docs
        while (int(cuts.size()) < std::min(docs, T) - 1) {
            const int c = rng.integer(1, T - 1);
            if (std::find(cuts.begin(), cuts.end(), c) == cuts.end()) cuts.push_back(c);
        }
        for (int i = 0; i < T; i++) {
            int start = 0;
            for (int c : cuts) if (c <= i) start = std::max(start, c);
            out[size_t(b) * T + i] = start;
        }
    }
    return out;
}

// Causal attention over qkv (B, T, 3C): out (B, T, C); att (B, H, T, T) probabilities if given.
// window > 0 masks keys j with i - j >= window; doc_start (B, T) if given masks keys before the
// query's document (packed rows).
inline Vec attention_forward(const Vec& qkv, const std::vector<float>& positions, int B, int T,
                             int C, int H, const Bias& bias, int window, Vec* att = nullptr,
                             const std::vector<int32_t>* doc_start = nullptr) {
    const int D = C / H;
    Vec out(size_t(B) * T * C, 0.0);
    if (att) att->assign(size_t(B) * H * T * T, 0.0);
    Vec logit(T);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++)
            for (int i = 0; i < T; i++) {
                int lo = window > 0 ? std::max(0, i - window + 1) : 0;
                if (doc_start) lo = std::max(lo, int((*doc_start)[size_t(b) * T + i]));
                const double* q = &qkv[(size_t(b) * T + i) * 3 * C + size_t(h) * D];
                double mx = -INFINITY;
                for (int j = lo; j <= i; j++) {
                    const double* k = &qkv[(size_t(b) * T + j) * 3 * C + C + size_t(h) * D];
                    double s = 0.0;
                    for (int d = 0; d < D; d++) s += q[d] * k[d];
                    const double dist = double(positions[size_t(b) * T + i]) -
                                        double(positions[size_t(b) * T + j]);
                    logit[j] = s / std::sqrt(double(D)) + bias_value(bias, h, dist);
                    mx = std::max(mx, logit[j]);
                }
                double sum = 0.0;
                for (int j = lo; j <= i; j++) sum += std::exp(logit[j] - mx);
                for (int j = lo; j <= i; j++) {
                    const double p = std::exp(logit[j] - mx) / sum;
                    if (att) (*att)[((size_t(b) * H + h) * T + i) * T + j] = p;
                    const double* v = &qkv[(size_t(b) * T + j) * 3 * C + 2 * C + size_t(h) * D];
                    for (int d = 0; d < D; d++) out[(size_t(b) * T + i) * C + size_t(h) * D + d] += p * v[d];
                }
            }
    return out;
}

// ---------------------------------------------------------------- cross-entropy

// losses (N) = mask[n] * -log softmax(logits[n])[targets[n]]
inline Vec crossentropy(const Vec& logits, const std::vector<int32_t>& targets, const Vec& mask,
                        int N, int V) {
    Vec losses(N, 0.0);
    for (int n = 0; n < N; n++) {
        if (mask[n] == 0.0) continue;
        const double* x = &logits[size_t(n) * V];
        double mx = -INFINITY;
        for (int i = 0; i < V; i++) mx = std::max(mx, x[i]);
        double sum = 0.0;
        for (int i = 0; i < V; i++) sum += std::exp(x[i] - mx);
        losses[n] = mask[n] * (std::log(sum) + mx - x[targets[n]]);
    }
    return losses;
}

}  // namespace ref
