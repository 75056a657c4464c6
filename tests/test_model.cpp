// Whole-model tests: gradients against central finite differences for each PE hook kind and each
// architecture knob, determinism, the learned-table guard and extend().
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "core/rng.h"
#include "model_fixtures.h"
#include "model/optimizer.h"

namespace ctx {
namespace {

using test::cpu;
using test::make_pe;
using test::tiny_batch;
using test::tiny_config;

double mean_loss(Model& m, const Batch& b) { return m.forward(b).mean(); }

// Compares the analytic gradient of the mean masked loss with central differences on a sample
// of every parameter view (all entries of small views).
void check_model_gradients(Model& m, const BatchBuffers& buf, const char* label) {
    const Batch b = buf.batch();
    double mask_sum = 0;
    for (float x : buf.mask) mask_sum += x;
    cpu().zero(m.grads().data(), m.grads().size());
    m.forward_backward(b, static_cast<float>(1.0 / mask_sum));
    float* p = m.params().data();
    const float* g = m.grads().data();
    Rng rng(42);
    const double eps = 1e-2;
    int checked = 0;
    for (const ParamView& v : m.layout().views()) {
        std::vector<size_t> idx;
        if (v.numel <= 8) {
            for (size_t i = 0; i < v.numel; ++i) idx.push_back(i);
        } else {
            for (int k = 0; k < 6; ++k) idx.push_back(static_cast<size_t>(rng.below(v.numel)));
        }
        double num_sq = 0, diff_sq = 0, ana_sq = 0;
        for (size_t i : idx) {
            float& x = p[v.offset + i];
            const float orig = x;
            x = static_cast<float>(orig + eps);
            const double lp = mean_loss(m, b);
            x = static_cast<float>(orig - eps);
            const double lm = mean_loss(m, b);
            x = orig;
            const double numeric = (lp - lm) / (2 * eps);
            const double analytic = g[v.offset + i];
            num_sq += numeric * numeric;
            ana_sq += analytic * analytic;
            diff_sq += (numeric - analytic) * (numeric - analytic);
            ++checked;
            EXPECT_NEAR(analytic, numeric, 2e-3 + 3e-2 * std::fabs(numeric))
                << label << ": " << v.name << "[" << i << "]";
        }
        // Per view: the sampled gradient vectors agree as a whole too.
        const double scale = std::max(std::sqrt(num_sq), std::sqrt(ana_sq));
        if (scale > 1e-4) {
            EXPECT_LT(std::sqrt(diff_sq) / scale, 2e-2) << label << ": " << v.name;
        }
    }
    EXPECT_GT(checked, 40);
}

struct GradCase {
    const char* label;
    const char* pe;
    std::map<std::string, test::OptionValue> pe_options;
    const char* style;  // config knobs
};

void PrintTo(const GradCase& c, std::ostream* os) { *os << c.label; }

class ModelGradient : public ::testing::TestWithParam<GradCase> {};

TEST_P(ModelGradient, MatchesFiniteDifferences) {
    const GradCase& gc = GetParam();
    ModelConfig c = tiny_config();
    const std::string style = gc.style;
    if (style == "neox") {
        c.parallel_residual = true;
        c.tied_embeddings = false;
        c.activation = Activation::GeluErf;
    } else if (style == "bloom") {
        c.embedding_layernorm = true;
    } else if (style == "nobias") {
        c.attention_bias = c.mlp_bias = c.norm_bias = false;
    }
    Model m(c, cpu(), make_pe(gc.pe, c, gc.pe_options), 3);
    check_model_gradients(m, tiny_batch(c.vocab_size), gc.label);
}

INSTANTIATE_TEST_SUITE_P(
    PeHooksAndKnobs, ModelGradient,
    ::testing::Values(
        GradCase{"nope", "none", {}, "gpt2"},
        GradCase{"learned_input_table", "learned", {{"init_std", 0.3}}, "gpt2"},
        GradCase{"rope_half_full", "rope", {}, "gpt2"},
        GradCase{"rope_interleaved_partial", "rope",
                 {{"layout", std::string("interleaved")}, {"rotary_pct", 0.5}}, "gpt2"},
        GradCase{"alibi_bias", "alibi", {}, "gpt2"},
        GradCase{"neox_parallel_untied_erf_rope", "rope", {{"rotary_pct", 0.25}}, "neox"},
        GradCase{"bloom_embedding_layernorm_alibi", "alibi", {}, "bloom"},
        GradCase{"no_biases_learned", "learned", {{"init_std", 0.3}}, "nobias"}),
    [](const auto& info) { return std::string(info.param.label); });

TEST(Model, MaskedTokensDoNotContributeToTheLoss) {
    ModelConfig c = tiny_config();
    Model m(c, cpu(), make_pe("rope", c), 3);
    BatchBuffers buf = tiny_batch(c.vocab_size);
    const LossSums before = m.forward(buf.batch());
    // Changing a masked target changes nothing; changing a trained one does.
    buf.targets[4] = (buf.targets[4] + 1) % c.vocab_size;
    const LossSums masked = m.forward(buf.batch());
    EXPECT_EQ(before.loss_sum, masked.loss_sum);
    EXPECT_EQ(before.mask_sum, 10.0);
    buf.targets[5] = (buf.targets[5] + 1) % c.vocab_size;
    EXPECT_NE(before.loss_sum, m.forward(buf.batch()).loss_sum);
}

TEST(Model, InitialLossIsNearUniform) {
    // With GPT-2's small init the logits are near zero, so the loss starts near ln(V).
    ModelConfig c = tiny_config();
    c.init_std = 0.02f;
    c.vocab_size = 64;
    c.d_model = 32;
    Model m(c, cpu(), make_pe("learned", c), 5);
    const LossSums s = m.forward(tiny_batch(c.vocab_size).batch());
    EXPECT_NEAR(s.mean(), std::log(64.0), 0.05);
}

TEST(Model, LearnedTableRefusesPositionsPastItsEndUntilExtended) {
    ModelConfig c = tiny_config();
    c.context_length = 8;
    Model m(c, cpu(), make_pe("learned", c), 3);
    BatchBuffers buf = tiny_batch(c.vocab_size);  // positions up to 11
    try {
        m.forward(buf.batch());
        FAIL() << "expected an error";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("exceeds the learned position table of 8 rows"),
                  std::string::npos)
            << e.what();
    }
    m.extend(16, nullptr, nullptr);
    EXPECT_EQ(m.config().context_length, 16);
    EXPECT_EQ(m.layout().view("pe.wpe").shape, (std::vector<int64_t>{16, c.d_model}));
    EXPECT_TRUE(std::isfinite(m.forward(buf.batch()).mean()));
}

TEST(Model, ExtendInterpolatesTheTableAndKeepsEverythingElse) {
    ModelConfig c = tiny_config();
    c.context_length = 6;
    Model m(c, cpu(), make_pe("learned", c, {{"init_std", 0.5}}), 9);
    Optimizer opt(m, OptimizerConfig{});
    // Give the moments recognisable values.
    for (size_t i = 0; i < opt.m().size(); ++i) {
        opt.m().data()[i] = 0.25f;
        opt.v().data()[i] = 0.5f;
    }
    const ParamView old_wpe = m.layout().view("pe.wpe");
    std::vector<float> old_table(m.params().at(old_wpe), m.params().at(old_wpe) + old_wpe.numel);
    const ParamView old_wte = m.layout().view("wte");
    std::vector<float> old_wte_vals(m.params().at(old_wte), m.params().at(old_wte) + old_wte.numel);

    m.extend(12, &opt.m(), &opt.v());  // beta = 2
    const ParamView& wpe = m.layout().view("pe.wpe");
    const ParamView& wte = m.layout().view("wte");
    const int C = c.d_model;
    // METHODS.md 1.1: e'_i = ((b - i%b)/b) e_{i/b} + ((i%b)/b) e_{i/b+1}, e_Lt := e_{Lt-1}.
    for (int i = 0; i < 12; ++i) {
        const int j = i / 2, r = i % 2;
        const int j1 = std::min(j + 1, 5);
        for (int d = 0; d < C; ++d) {
            const double expect = (2.0 - r) / 2.0 * old_table[j * C + d] +
                                  r / 2.0 * old_table[j1 * C + d];
            EXPECT_NEAR(m.params().at(wpe)[i * C + d], expect, 1e-6) << i << "," << d;
        }
    }
    EXPECT_EQ(0, std::memcmp(m.params().at(wte), old_wte_vals.data(), wte.numel * sizeof(float)));
    EXPECT_EQ(opt.m().at(wte)[0], 0.25f);   // unchanged shape: moments kept
    EXPECT_EQ(opt.v().at(wte)[wte.numel - 1], 0.5f);
    EXPECT_EQ(opt.m().at(wpe)[0], 0.0f);    // resized: moments reset
    EXPECT_EQ(opt.v().at(wpe)[wpe.numel - 1], 0.0f);
}

TEST(Model, FlopsPerTokenFollowsLlmcConvention) {
    ModelConfig c = tiny_config();
    Model m(c, cpu(), make_pe("learned", c), 3);
    EXPECT_DOUBLE_EQ(m.flops_per_token(6),
                     6.0 * m.num_params() + 6.0 * c.n_layer * c.d_model * 6);
}

TEST(Model, ParameterCountMatchesTheArchitecture) {
    ModelConfig c = tiny_config();  // V=13 C=16 F=24 L=2, tied, biases, Lt=12
    Model m(c, cpu(), make_pe("learned", c), 3);
    const size_t C = 16, V = 13, F = 24, L = 2, P = 12;
    const size_t per_layer = 2 * C + 3 * C * C + 3 * C + C * C + C + 2 * C + F * C + F + C * F + C;
    EXPECT_EQ(m.num_params(), V * C + L * per_layer + 2 * C + P * C);
}

}  // namespace
}  // namespace ctx
