// Contextual sparsity (model/sparsity.h, KvGenerator::set_sparsity): predictors learn from a
// trained tiny model's activations (their loss falls, their recall of the true top-k beats
// chance by a margin), decoding with every unit and head selected through the sparse products
// matches dense decoding, skipped heads still get their keys and values cached, and bad
// options are refused.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "model/generate.h"
#include "model/sparsity.h"
#include "model_fixtures.h"

namespace ctx {
namespace {

using test::cpu;

ModelConfig small_config(Activation act) {
    ModelConfig c = test::tiny_config();
    c.vocab_size = 16;
    c.d_model = 32;
    c.n_head = 4;
    c.n_layer = 3;
    c.ffn_hidden = 128;
    c.context_length = 32;
    c.init_std = 0.05f;
    c.activation = act;
    return c;
}

// Rows of 24 tokens: 12 random ones, then the same 12 again (a copy task that needs attention).
std::vector<std::vector<int32_t>> copy_rows(uint64_t seed, int n) {
    Rng rng(seed);
    std::vector<std::vector<int32_t>> rows;
    for (int i = 0; i < n; ++i) {
        std::vector<int32_t> r(12);
        for (auto& t : r) t = static_cast<int32_t>(rng.below(16));
        r.insert(r.end(), r.begin(), r.end());
        rows.push_back(r);
    }
    return rows;
}

// A model trained for a few hundred AdamW steps on the copy task (about a second).
std::unique_ptr<Model> trained_model(Activation act) {
    const ModelConfig c = small_config(act);
    auto m = std::make_unique<Model>(c, cpu(), test::make_pe("learned", c), 3);
    const size_t n = m->params().size();
    Arena mom(cpu(), n), vel(cpu(), n);
    BatchBuffers b;
    b.resize(8, 23);
    for (int step = 1; step <= 300; ++step) {
        const auto rows = copy_rows(static_cast<uint64_t>(step), 8);
        for (int r = 0; r < 8; ++r)
            for (int t = 0; t < 23; ++t) {
                b.tokens[size_t(r) * 23 + t] = rows[size_t(r)][size_t(t)];
                b.targets[size_t(r) * 23 + t] = rows[size_t(r)][size_t(t) + 1];
                b.positions[size_t(r) * 23 + t] = float(t);
                b.mask[size_t(r) * 23 + t] = 1.0f;
            }
        cpu().zero(m->grads().data(), n);
        m->forward_backward(b.batch(), 1.0f / (8 * 23));
        AdamWParams hp;
        hp.lr = 3e-3f;
        hp.step = step;
        cpu().adamw_update(m->params().data(), m->grads().data(), mom.data(), vel.data(), n, hp);
    }
    return m;
}

struct Trained {
    std::unique_ptr<Model> model;
    std::unique_ptr<SparsityPredictors> predictors;
    PredictorLosses losses;
    PredictorRecall recall;
};

Trained train_all(Activation act) {
    Trained t;
    t.model = trained_model(act);
    const SparsityData train = collect_sparsity_data(*t.model, copy_rows(1001, 96));
    const SparsityData held_out = collect_sparsity_data(*t.model, copy_rows(2002, 32));
    EXPECT_EQ(train.tokens, 96 * 24);
    PredictorShape shape;
    shape.unit_rank = 16;
    shape.head_rank = 8;
    t.predictors = std::make_unique<SparsityPredictors>(t.model->config(), cpu(), shape, 5);
    PredictorTraining opt;
    opt.epochs = 30;
    opt.batch = 128;
    t.losses = train_predictors(*t.predictors, train, opt);
    t.recall = predictor_recall(*t.predictors, held_out, 0.25f, 0.5f);
    return t;
}

TEST(SparsityPredictors, LearnTheTopUnitsAndHeadsOfATrainedModel) {
    for (Activation act : {Activation::GeluTanh, Activation::Relu}) {
        const Trained t = train_all(act);
        const int L = t.model->config().n_layer;
        for (int l = 0; l < L; ++l) {
            EXPECT_LT(t.losses.units_last[size_t(l)], 0.8 * t.losses.units_first[size_t(l)])
                << activation_name(act) << " layer " << l;
            EXPECT_LT(t.losses.heads_last[size_t(l)], t.losses.heads_first[size_t(l)])
                << activation_name(act) << " layer " << l;
        }
        // chance: 0.25 of the units (keep 0.25), 0.5 of the heads (keep 0.5)
        const double units = t.recall.mean_units(), heads = t.recall.mean_heads();
        std::printf("%s: unit recall at keep 0.25 %.3f, head recall at keep 0.5 %.3f\n",
                    activation_name(act), units, heads);
        EXPECT_GT(units, 0.6) << activation_name(act);
        EXPECT_GT(heads, 0.7) << activation_name(act);
        if (act == Activation::Relu) {
            ASSERT_EQ(t.recall.active_recall.size(), size_t(L));
            for (int l = 0; l < L; ++l) {
                std::printf("relu layer %d: active recall %.3f, selected %.3f\n", l,
                            t.recall.active_recall[size_t(l)], t.recall.active_selected[size_t(l)]);
                // chance: selecting a random fraction finds that fraction of the active units
                EXPECT_GT(t.recall.active_recall[size_t(l)],
                          t.recall.active_selected[size_t(l)] + 0.2);
                EXPECT_LT(t.recall.active_selected[size_t(l)], 0.6);
            }
        } else {
            EXPECT_TRUE(t.recall.active_recall.empty());
        }
    }
}

// Decoding through the sparse products with every unit and head kept (fractions skipped so
// small that the keep counts round to all) follows dense decoding: logits to float rounding,
// the same tokens.
TEST(SparseDecode, EverythingSelectedMatchesDense) {
    const ModelConfig c = small_config(Activation::GeluTanh);
    Model m(c, cpu(), test::make_pe("learned", c), 7);
    SparsityPredictors p(c, cpu(), PredictorShape{}, 9);
    const auto prompts = copy_rows(5, 3);
    KvGenerator dense(m, 3, 32), sparse(m, 3, 32);
    SparsityOptions so;
    so.predictors = &p;
    so.units = 1e-4f;
    so.heads = 1e-4f;
    sparse.set_sparsity(so);
    for (int r = 0; r < 3; ++r) {
        dense.prefill(r, prompts[size_t(r)].data(), nullptr, 10);
        sparse.prefill(r, prompts[size_t(r)].data(), nullptr, 10);
    }
    for (int step = 0; step < 8; ++step) {
        std::vector<int32_t> next(3);
        std::vector<float> pos(3);
        for (int r = 0; r < 3; ++r) {
            const float *a = dense.logits(r), *b = sparse.logits(r);
            double worst = 0;
            for (int v = 0; v < c.vocab_size; ++v) worst = std::max(worst, double(std::fabs(a[v] - b[v])));
            EXPECT_LT(worst, 1e-4) << "row " << r << " step " << step;
            next[size_t(r)] = int32_t(std::max_element(a, a + c.vocab_size) - a);
            EXPECT_EQ(next[size_t(r)], int32_t(std::max_element(b, b + c.vocab_size) - b));
            pos[size_t(r)] = dense.last_position(r) + 1;
        }
        dense.decode(next.data(), pos.data());
        sparse.decode(next.data(), pos.data());
    }
    // generate() with fractions of zero is the dense path itself: identical tokens, bit for bit
    GenerateOptions go;
    go.max_new_tokens = 6;
    const auto want = generate(m, prompts, go);
    go.sparsity.predictors = &p;
    const auto got = generate(m, prompts, go);
    for (size_t r = 0; r < prompts.size(); ++r) EXPECT_EQ(got[r].tokens, want[r].tokens);
}

// Half the heads skipped: every head's keys and values are still cached. Layer 0's input (the
// embedding) does not depend on sparsity, so its cached k and v of a decode step equal dense
// decoding's for every head, skipped or not.
TEST(SparseDecode, SkippedHeadsStillCacheTheirKeysAndValues) {
    const ModelConfig c = small_config(Activation::GeluTanh);
    Model m(c, cpu(), test::make_pe("learned", c), 7);
    SparsityPredictors p(c, cpu(), PredictorShape{}, 9);
    const auto prompt = copy_rows(6, 1)[0];
    const int C = c.d_model;
    std::vector<float> kv_dense, kv_sparse, out_dense, out_sparse;
    auto run = [&](bool sparse, std::vector<float>& kv, std::vector<float>& out) {
        KvGenerator gen(m, 1, 32);
        if (sparse) {
            SparsityOptions so;
            so.predictors = &p;
            so.heads = 0.5f;
            so.units = 0.5f;
            gen.set_sparsity(so);
        }
        gen.prefill(0, prompt.data(), nullptr, 10);
        gen.set_layer_observer([&](int l, const BlockActs& a, int N) {
            ASSERT_EQ(N, 1);
            if (l != 0) return;
            kv.assign(a.qkv + C, a.qkv + 3 * C);  // k | v of the new token, every head
            const float* atty = a.atty.fp32("the test");  // generation keeps fp32
            out.assign(atty, atty + C);
        });
        const int32_t next = 3;
        const float pos = 10;
        gen.decode(&next, &pos);
    };
    run(false, kv_dense, out_dense);
    run(true, kv_sparse, out_sparse);
    ASSERT_EQ(kv_dense.size(), size_t(2 * C));
    for (size_t i = 0; i < kv_dense.size(); ++i)
        EXPECT_NEAR(kv_sparse[i], kv_dense[i], 1e-5 * (1 + std::fabs(kv_dense[i]))) << i;
    // the heads that ran give the dense outputs; the others are not all of them
    int equal_heads = 0;
    const int D = C / c.n_head;
    for (int h = 0; h < c.n_head; ++h) {
        bool same = true;
        for (int d = 0; d < D; ++d)
            same = same && std::fabs(out_sparse[size_t(h * D + d)] - out_dense[size_t(h * D + d)]) <
                               1e-5 * (1 + std::fabs(out_dense[size_t(h * D + d)]));
        equal_heads += same;
    }
    EXPECT_GE(equal_heads, 2);  // the 2 heads kept at 0.5 of 4
}

// Teacher-forced decoding scores what one forward pass over the rows scores: the losses of the
// tokens after the prefix, summed.
TEST(DecodeScore, EqualsTheForwardPassLosses) {
    const ModelConfig c = small_config(Activation::GeluTanh);
    Model m(c, cpu(), test::make_pe("learned", c), 7);
    const auto rows = copy_rows(8, 3);  // 24 tokens each
    const int n = 24, prefix = 5, R = 3;
    const DecodeScore d = score_by_decoding(m, rows, prefix);
    EXPECT_EQ(d.tokens, int64_t(R) * (n - prefix));
    EXPECT_EQ(d.decoded, int64_t(R) * (n - prefix - 1));
    BatchBuffers b;
    b.resize(R, n - 1);
    for (int r = 0; r < R; ++r)
        for (int t = 0; t < n - 1; ++t) {
            const size_t i = size_t(r) * (n - 1) + t;
            b.tokens[i] = rows[size_t(r)][size_t(t)];
            b.targets[i] = rows[size_t(r)][size_t(t) + 1];
            b.positions[i] = float(t);
            b.mask[i] = t + 1 >= prefix ? 1.0f : 0.0f;  // predicts token t + 1 >= prefix
        }
    const LossSums want = m.forward(b.batch());
    EXPECT_EQ(want.mask_sum, double(d.tokens));
    EXPECT_NEAR(d.nll_sum, want.loss_sum, 1e-4 * want.loss_sum);
    EXPECT_NEAR(d.perplexity(), std::exp(want.mean()), 1e-4 * std::exp(want.mean()));
    // per token, at gapped positions and from the first token on (prefix 1), with argmax ids
    for (int r = 0; r < R; ++r)
        for (int t = 0; t < n - 1; ++t) b.positions[size_t(r) * (n - 1) + t] = 1.25f * t;
    std::fill(b.mask.begin(), b.mask.end(), 1.0f);
    m.forward(b.batch());
    const std::vector<float> logits = m.logits(b.batch());
    std::vector<float> lp(size_t(R) * (n - 1));
    std::vector<int32_t> best(lp.size());
    decode_rows(m, DecodeRows{R, n - 1, b.tokens.data(), b.positions.data(), b.targets.data()}, 1,
                0, SparsityOptions{}, lp.data(), best.data());
    for (size_t i = 0; i < lp.size(); ++i) {
        EXPECT_NEAR(lp[i], -m.losses()[i], 1e-4) << "token " << i;
        const float* l = logits.data() + i * c.vocab_size;
        EXPECT_EQ(best[i], int32_t(std::max_element(l, l + c.vocab_size) - l)) << "token " << i;
    }
    EXPECT_THROW(score_by_decoding(m, rows, 0), Error);
    EXPECT_THROW(score_by_decoding(m, rows, n), Error);
    EXPECT_THROW(score_by_decoding(m, {rows[0], {1, 2, 3}}, 1), Error);
}

TEST(SparseDecode, BadOptionsAreRefused) {
    const ModelConfig c = small_config(Activation::GeluTanh);
    Model m(c, cpu(), test::make_pe("learned", c), 7);
    SparsityPredictors p(c, cpu(), PredictorShape{}, 9);
    KvGenerator gen(m, 1, 16);
    SparsityOptions so;
    so.predictors = &p;
    so.units = 1.0f;  // everything skipped
    EXPECT_THROW(gen.set_sparsity(so), Error);
    so.units = -0.1f;
    EXPECT_THROW(gen.set_sparsity(so), Error);
    so.units = 0.5f;
    so.heads = 1.5f;
    EXPECT_THROW(gen.set_sparsity(so), Error);
    ModelConfig other = c;
    other.ffn_hidden = 64;
    SparsityPredictors q(other, cpu(), PredictorShape{}, 9);
    so.heads = 0.0f;
    so.predictors = &q;
    try {
        gen.set_sparsity(so);
        FAIL() << "predictors of another shape were accepted";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("another model"), std::string::npos) << e.what();
    }
    PredictorShape bad;
    bad.unit_rank = 0;
    EXPECT_THROW(SparsityPredictors(c, cpu(), bad, 1), Error);
    EXPECT_THROW(collect_sparsity_data(m, {}), Error);
}

}  // namespace
}  // namespace ctx
