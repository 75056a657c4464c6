#include "model/sparsity.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/error.h"
#include "core/rng.h"
#include "model/decoder.h"
#include "model/generate.h"

namespace ctx {

int keep_count(float keep, int total) {
    return std::clamp(static_cast<int>(std::lround(static_cast<double>(keep) * total)), 1, total);
}

// ---------------------------------------------------------------- the predictors

SparsityPredictors::SparsityPredictors(const ModelConfig& c, Backend& backend,
                                       const PredictorShape& shape, uint64_t seed)
    : config_(c), backend_(&backend), shape_(shape) {
    CTX_CHECK(shape.unit_rank >= 1 && shape.head_rank >= 1, "sparsity predictors: ranks must be "
              ">= 1, got units {} and heads {}", shape.unit_rank, shape.head_rank);
    CTX_CHECK(shape.label_units > 0 && shape.label_units <= 1 && shape.label_heads > 0 &&
                  shape.label_heads <= 1,
              "sparsity predictors: label fractions must be in (0, 1], got units {} and heads {}",
              shape.label_units, shape.label_heads);
    const int64_t C = c.d_model, F = c.ffn(), H = c.n_head;
    const int64_t ru = shape.unit_rank, rh = shape.head_rank;
    for (int l = 0; l < c.n_layer; ++l) {
        const std::string p = "layers." + std::to_string(l) + ".";
        layout_.add(p + "units.a", {ru, C}, true);
        layout_.add(p + "units.b", {F, ru}, true);
        layout_.add(p + "units.bias", {F}, false);
        layout_.add(p + "heads.a", {rh, C}, true);
        layout_.add(p + "heads.b", {H, rh}, true);
        layout_.add(p + "heads.bias", {H}, false);
    }
    // N(0, 1/fan_in) for both factors; biases start at zero (training moves them to the base rate)
    std::vector<float> host(layout_.total(), 0.0f);
    Rng rng(seed);
    for (const ParamView& v : layout_.views()) {
        if (v.shape.size() != 2) continue;
        const double sd = 1.0 / std::sqrt(static_cast<double>(v.shape[1]));
        for (size_t i = 0; i < v.numel; ++i) host[v.offset + i] = static_cast<float>(rng.normal() * sd);
    }
    params_ = Arena(backend, layout_.total());
    backend.copy_to_device(params_.data(), host.data(), host.size());
}

std::pair<size_t, size_t> SparsityPredictors::layer_range(int l) const {
    const auto& views = layout_.views();
    const size_t first = static_cast<size_t>(l) * 6;
    const ParamView& last = views[first + 5];
    return {views[first].offset, last.offset + (last.numel + 15) / 16 * 16};
}

namespace {

struct LowRank {
    const float *a, *b, *bias;
    int rank, out;
};

LowRank unit_view(const SparsityPredictors& p, const Arena& a, int l) {
    const auto& v = p.layout().views();
    const size_t i = static_cast<size_t>(l) * 6;
    return {a.at(v[i]), a.at(v[i + 1]), a.at(v[i + 2]), p.shape().unit_rank, p.config().ffn()};
}

LowRank head_view(const SparsityPredictors& p, const Arena& a, int l) {
    const auto& v = p.layout().views();
    const size_t i = static_cast<size_t>(l) * 6 + 3;
    return {a.at(v[i]), a.at(v[i + 1]), a.at(v[i + 2]), p.shape().head_rank, p.config().n_head};
}

// scores (N, out) = (z A^T) B^T + bias
void low_rank_forward(Backend& be, const LowRank& w, const float* z, float* scores, float* u,
                      int N, int C) {
    be.matmul_forward(u, z, w.a, nullptr, N, C, w.rank);
    be.matmul_forward(scores, u, w.b, w.bias, N, w.rank, w.out);
}

}  // namespace

void SparsityPredictors::unit_scores(int l, const float* z, float* scores, float* u, int N) const {
    low_rank_forward(*backend_, unit_view(*this, params_, l), z, scores, u, N, config_.d_model);
}

void SparsityPredictors::head_scores(int l, const float* z, float* scores, float* u, int N) const {
    low_rank_forward(*backend_, head_view(*this, params_, l), z, scores, u, N, config_.d_model);
}

// ---------------------------------------------------------------- collecting activations

SparsityData collect_sparsity_data(Model& model, const std::vector<std::vector<int32_t>>& rows) {
    CTX_CHECK(!model.tensor_parallel(), "sparsity predictors: collecting activations under "
              "tensor parallelism is not supported; run on one rank of the group");
    CTX_CHECK(!rows.empty(), "sparsity predictors: no rows of text to learn from");
    const ModelConfig& c = model.config();
    Backend& be = model.backend();
    const int L = c.n_layer, C = c.d_model, F = c.ffn(), H = c.n_head, D = C / H;
    SparsityData d;
    d.z.assign(static_cast<size_t>(L), {});
    d.unit_out.assign(static_cast<size_t>(L), {});
    d.head_norm.assign(static_cast<size_t>(L), {});
    size_t longest = 0;
    for (const auto& r : rows) longest = std::max(longest, r.size());
    KvGenerator gen(model, 1, static_cast<int>(longest));
    // the output projections, host, per layer (C, A)
    std::vector<std::vector<float>> proj(static_cast<size_t>(L));
    for (int l = 0; l < L; ++l) {
        proj[static_cast<size_t>(l)].resize(static_cast<size_t>(C) * C);
        be.copy_to_host(proj[static_cast<size_t>(l)].data(), model.layer_weights(l).attn_proj_w,
                        proj[static_cast<size_t>(l)].size());
    }
    std::vector<float> ln1, act, atty;
    gen.set_layer_observer([&](int l, const BlockActs& a, int N) {
        const size_t NC = static_cast<size_t>(N) * C;
        ln1.resize(NC);
        act.resize(static_cast<size_t>(N) * F);
        atty.resize(NC);
        // generation keeps its activations in fp32
        be.copy_to_host(ln1.data(), a.ln1.fp32("the predictors' training data"), NC);
        be.copy_to_host(act.data(), a.fch_act.fp32("the predictors' training data"), act.size());
        be.copy_to_host(atty.data(), a.atty.fp32("the predictors' training data"), NC);
        // layer l's ln1 output is the input of layer l + 1's predictors (and layer 0's own)
        if (l + 1 < L) {
            auto& z = d.z[static_cast<size_t>(l + 1)];
            z.insert(z.end(), ln1.begin(), ln1.end());
        }
        if (l == 0) d.z[0].insert(d.z[0].end(), ln1.begin(), ln1.end());
        auto& u = d.unit_out[static_cast<size_t>(l)];
        u.insert(u.end(), act.begin(), act.end());
        // head h's contribution: proj[:, h D : (h+1) D] atty[h D : (h+1) D], its norm
        const std::vector<float>& W = proj[static_cast<size_t>(l)];
        auto& hn = d.head_norm[static_cast<size_t>(l)];
        std::vector<double> contrib(static_cast<size_t>(C));
        for (int n = 0; n < N; ++n)
            for (int h = 0; h < H; ++h) {
                std::fill(contrib.begin(), contrib.end(), 0.0);
                const float* y = atty.data() + static_cast<size_t>(n) * C + static_cast<size_t>(h) * D;
                for (int o = 0; o < C; ++o) {
                    const float* w = W.data() + static_cast<size_t>(o) * C + static_cast<size_t>(h) * D;
                    double s = 0;
                    for (int k = 0; k < D; ++k) s += static_cast<double>(w[k]) * y[k];
                    contrib[static_cast<size_t>(o)] = s;
                }
                double sq = 0;
                for (double v : contrib) sq += v * v;
                hn.push_back(static_cast<float>(std::sqrt(sq)));
            }
    });
    for (size_t r = 0; r < rows.size(); ++r) {
        CTX_CHECK(!rows[r].empty(), "sparsity predictors: row {} is empty", r);
        gen.prefill(0, rows[r].data(), nullptr, static_cast<int>(rows[r].size()));
        d.tokens += static_cast<int>(rows[r].size());
    }
    return d;
}

// ---------------------------------------------------------------- labels

namespace {

// 1 for the `keep` largest of each row of x (Ntok, M) by |value|, else 0
std::vector<float> top_fraction_labels(const std::vector<float>& x, int Ntok, int M, int keep) {
    std::vector<float> y(x.size(), 0.0f);
    std::vector<int> order(static_cast<size_t>(M));
    for (int n = 0; n < Ntok; ++n) {
        const float* r = x.data() + static_cast<size_t>(n) * M;
        std::iota(order.begin(), order.end(), 0);
        std::nth_element(order.begin(), order.begin() + (keep - 1), order.end(), [r](int a, int b) {
            return std::fabs(r[a]) > std::fabs(r[b]) || (std::fabs(r[a]) == std::fabs(r[b]) && a < b);
        });
        for (int k = 0; k < keep; ++k)
            y[static_cast<size_t>(n) * M + order[static_cast<size_t>(k)]] = 1.0f;
    }
    return y;
}

}  // namespace

std::vector<float> unit_labels(const SparsityData& d, int l, const ModelConfig& c,
                               float label_units) {
    const std::vector<float>& x = d.unit_out[static_cast<size_t>(l)];
    if (c.activation == Activation::Relu) {  // exact: active or not
        std::vector<float> y(x.size());
        for (size_t i = 0; i < x.size(); ++i) y[i] = x[i] > 0.0f ? 1.0f : 0.0f;
        return y;
    }
    return top_fraction_labels(x, d.tokens, c.ffn(), keep_count(label_units, c.ffn()));
}

std::vector<float> head_labels(const SparsityData& d, int l, int H, float label_heads) {
    return top_fraction_labels(d.head_norm[static_cast<size_t>(l)], d.tokens, H,
                               keep_count(label_heads, H));
}

// ---------------------------------------------------------------- training

namespace {

// Mean binary cross-entropy of scores s (n) against labels y; s becomes its gradient
// (sigmoid(s) - y) / n. softplus(s) - y s, computed stably.
double bce_and_grad(std::vector<float>& s, const float* y) {
    double loss = 0;
    const double inv = 1.0 / static_cast<double>(s.size());
    for (size_t i = 0; i < s.size(); ++i) {
        const double v = s[i];
        loss += std::max(v, 0.0) + std::log1p(std::exp(-std::fabs(v))) - y[i] * v;
        s[i] = static_cast<float>((1.0 / (1.0 + std::exp(-v)) - y[i]) * inv);
    }
    return loss * inv;
}

}  // namespace

PredictorLosses train_predictors(SparsityPredictors& p, const SparsityData& train,
                                 const PredictorTraining& opt) {
    CTX_CHECK(opt.epochs >= 1 && opt.batch >= 1 && opt.lr > 0, "sparsity predictors: training "
              "needs epochs >= 1, batch >= 1 and lr > 0, got {}, {}, {}", opt.epochs, opt.batch,
              opt.lr);
    CTX_CHECK(train.tokens >= 1, "sparsity predictors: no tokens to train on");
    const ModelConfig& c = p.config();
    Backend& be = p.backend();
    const int L = c.n_layer, C = c.d_model, Ntok = train.tokens;
    const int B = std::min(opt.batch, Ntok);
    const int rmax = std::max(p.shape().unit_rank, p.shape().head_rank);
    const int Mmax = std::max(c.ffn(), c.n_head);
    Arena grads(be, p.layout().total()), m(be, p.layout().total()), v(be, p.layout().total());
    Arena z(be, static_cast<size_t>(B) * C), u(be, static_cast<size_t>(B) * rmax),
        du(be, static_cast<size_t>(B) * rmax), s(be, static_cast<size_t>(B) * Mmax);
    PredictorLosses out;
    std::vector<float> zb(static_cast<size_t>(B) * C), sb, yb;
    std::vector<int> order(static_cast<size_t>(Ntok));
    int64_t step = 0;
    for (int l = 0; l < L; ++l) {
        const std::vector<float> yu = unit_labels(train, l, c, p.shape().label_units);
        const std::vector<float> yh = head_labels(train, l, c.n_head, p.shape().label_heads);
        const auto [begin, end] = p.layer_range(l);
        Rng rng(opt.seed + static_cast<uint64_t>(l));
        std::iota(order.begin(), order.end(), 0);
        double first_u = 0, first_h = 0, last_u = 0, last_h = 0;
        for (int e = 0; e < opt.epochs; ++e) {
            for (int i = Ntok - 1; i > 0; --i)
                std::swap(order[static_cast<size_t>(i)], order[rng.below(static_cast<uint64_t>(i + 1))]);
            double sum_u = 0, sum_h = 0;
            int batches = 0;
            for (int b0 = 0; b0 + B <= Ntok; b0 += B, ++batches) {
                for (int i = 0; i < B; ++i)
                    std::copy_n(train.z[static_cast<size_t>(l)].data() +
                                    static_cast<size_t>(order[static_cast<size_t>(b0 + i)]) * C,
                                C, zb.data() + static_cast<size_t>(i) * C);
                be.copy_to_device(z.data(), zb.data(), zb.size());
                be.zero(grads.data() + begin, end - begin);
                for (int which = 0; which < 2; ++which) {  // units, then heads
                    const LowRank w = which == 0 ? unit_view(p, p.params(), l)
                                                 : head_view(p, p.params(), l);
                    const LowRank g = which == 0 ? unit_view(p, grads, l) : head_view(p, grads, l);
                    const std::vector<float>& y = which == 0 ? yu : yh;
                    const int M = w.out;
                    low_rank_forward(be, w, z.data(), s.data(), u.data(), B, C);
                    sb.resize(static_cast<size_t>(B) * M);
                    yb.resize(sb.size());
                    be.copy_to_host(sb.data(), s.data(), sb.size());
                    for (int i = 0; i < B; ++i)
                        std::copy_n(y.data() + static_cast<size_t>(order[static_cast<size_t>(b0 + i)]) * M,
                                    M, yb.data() + static_cast<size_t>(i) * M);
                    const double loss = bce_and_grad(sb, yb.data());
                    (which == 0 ? sum_u : sum_h) += loss;
                    be.copy_to_device(s.data(), sb.data(), sb.size());
                    be.zero(du.data(), static_cast<size_t>(B) * w.rank);
                    be.matmul_backward(du.data(), const_cast<float*>(g.b), const_cast<float*>(g.bias),
                                       s.data(), u.data(), w.b, B, w.rank, M);
                    be.matmul_backward(nullptr, const_cast<float*>(g.a), nullptr, du.data(),
                                       z.data(), w.a, B, C, w.rank);
                }
                AdamWParams hp;
                hp.lr = opt.lr;
                hp.weight_decay = opt.weight_decay;
                hp.step = ++step;
                be.adamw_update(p.params().data() + begin, grads.data() + begin, m.data() + begin,
                                v.data() + begin, end - begin, hp);
            }
            sum_u /= std::max(batches, 1);
            sum_h /= std::max(batches, 1);
            if (e == 0) first_u = sum_u, first_h = sum_h;
            last_u = sum_u;
            last_h = sum_h;
        }
        step = 0;  // each layer's moments start afresh (their ranges are disjoint anyway)
        out.units_first.push_back(first_u);
        out.units_last.push_back(last_u);
        out.heads_first.push_back(first_h);
        out.heads_last.push_back(last_h);
    }
    return out;
}

// ---------------------------------------------------------------- recall

double PredictorRecall::mean_units() const {
    return units.empty() ? 0.0 : std::accumulate(units.begin(), units.end(), 0.0) / units.size();
}
double PredictorRecall::mean_heads() const {
    return heads.empty() ? 0.0 : std::accumulate(heads.begin(), heads.end(), 0.0) / heads.size();
}

namespace {

// Mean over rows of |top-k(pred) ∩ top-k(|truth|)| / k.
double topk_recall(const std::vector<float>& pred, const std::vector<float>& truth, int Ntok,
                   int M, int k) {
    const std::vector<float> want = top_fraction_labels(truth, Ntok, M, k);
    std::vector<float> got(pred.size());
    std::vector<int> order(static_cast<size_t>(M));
    double sum = 0;
    for (int n = 0; n < Ntok; ++n) {
        const float* r = pred.data() + static_cast<size_t>(n) * M;
        std::iota(order.begin(), order.end(), 0);
        std::nth_element(order.begin(), order.begin() + (k - 1), order.end(),
                         [r](int a, int b) { return r[a] > r[b] || (r[a] == r[b] && a < b); });
        int hit = 0;
        for (int i = 0; i < k; ++i)
            hit += want[static_cast<size_t>(n) * M + order[static_cast<size_t>(i)]] > 0.5f;
        sum += static_cast<double>(hit) / k;
    }
    return sum / Ntok;
}

}  // namespace

PredictorRecall predictor_recall(const SparsityPredictors& p, const SparsityData& d,
                                 float keep_units, float keep_heads) {
    const ModelConfig& c = p.config();
    Backend& be = p.backend();
    const int C = c.d_model, F = c.ffn(), H = c.n_head, N = d.tokens;
    const int rmax = std::max(p.shape().unit_rank, p.shape().head_rank);
    Arena z(be, static_cast<size_t>(N) * C), u(be, static_cast<size_t>(N) * rmax),
        s(be, static_cast<size_t>(N) * std::max(F, H));
    PredictorRecall out;
    std::vector<float> su(static_cast<size_t>(N) * F), sh(static_cast<size_t>(N) * H);
    for (int l = 0; l < c.n_layer; ++l) {
        be.copy_to_device(z.data(), d.z[static_cast<size_t>(l)].data(), static_cast<size_t>(N) * C);
        p.unit_scores(l, z.data(), s.data(), u.data(), N);
        be.copy_to_host(su.data(), s.data(), su.size());
        p.head_scores(l, z.data(), s.data(), u.data(), N);
        be.copy_to_host(sh.data(), s.data(), sh.size());
        out.units.push_back(topk_recall(su, d.unit_out[static_cast<size_t>(l)], N, F,
                                        keep_count(keep_units, F)));
        out.heads.push_back(topk_recall(sh, d.head_norm[static_cast<size_t>(l)], N, H,
                                        keep_count(keep_heads, H)));
        if (c.activation != Activation::Relu) continue;
        const std::vector<float>& act = d.unit_out[static_cast<size_t>(l)];
        double active = 0, found = 0, selected = 0;
        for (size_t i = 0; i < act.size(); ++i) {
            active += act[i] > 0.0f;
            selected += su[i] > 0.0f;
            found += act[i] > 0.0f && su[i] > 0.0f;
        }
        out.active_recall.push_back(active > 0 ? found / active : 1.0);
        out.active_selected.push_back(selected / static_cast<double>(act.size()));
    }
    return out;
}

}  // namespace ctx
