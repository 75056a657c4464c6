// Whole-model tests: gradients against central finite differences for each PE hook kind and each
// architecture knob, determinism, the learned-table guard and extend().
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "backend/profiling_backend.h"
#include "core/rng.h"
#include "model_fixtures.h"
#include "model/optimizer.h"

namespace ctx {
namespace {

using test::cpu;
using test::make_pe;
using test::tiny_batch;
using test::tiny_config;

using test::check_model_gradients;
using test::mean_loss;

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
        c.attention_bias = c.attention_out_bias = c.mlp_bias = c.norm_bias = false;
    } else if (style.rfind("llama", 0) == 0 || style == "qwen2" || style == "mistral") {
        test::use_llama_block(c);  // then per variant
        if (style == "llama_gqa" || style == "qwen2") c.n_head = 4, c.n_kv_head = 2;
        if (style == "llama_mqa") c.n_kv_head = 1;
        if (style == "qwen2") c.attention_bias = true;  // q, k, v biases only
        if (style == "mistral") c.n_head = 4, c.n_kv_head = 1, c.sliding_window = 3;
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
        GradCase{"no_biases_learned", "learned", {{"init_std", 0.3}}, "nobias"},
        GradCase{"llama_rmsnorm_swiglu_rope", "rope", {}, "llama"},
        GradCase{"llama_grouped_query_rope", "rope", {}, "llama_gqa"},
        GradCase{"llama_multi_query_alibi", "alibi", {}, "llama_mqa"},
        GradCase{"qwen2_qkv_bias_rope", "rope", {}, "qwen2"},
        GradCase{"mistral_sliding_window_rope", "rope", {}, "mistral"}),
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

// The ops a training step runs: each block's two output projections add the residual in the
// product (matmul_residual_forward; no separate add), the MLP's activation backward and its
// first product's backward are one op, and the optimizer updates every tensor in one
// adamw_update_segments call.
TEST(Model, StepFusesTheResidualAddsTheMlpBackwardAndTheUpdate) {
    const ModelConfig c = tiny_config();
    ProfilingBackend prof(cpu());
    Model m(c, prof, make_pe("rope", c), 3);
    Optimizer opt(m, OptimizerConfig{});
    const BatchBuffers buf = tiny_batch(c.vocab_size);
    prof.zero(m.grads().data(), m.grads().size());
    m.forward_backward(buf.batch(), 0.1f);
    opt.update();
    std::map<std::string, long> calls;
    for (const OpProfileRow& r : prof.rows()) calls[r.op] += r.calls;
    EXPECT_EQ(calls["matmul_residual_forward"], 2 * c.n_layer);
    EXPECT_EQ(calls["add"], 0);
    EXPECT_EQ(calls["activation_matmul_backward"], c.n_layer);  // activation + fc backward
    EXPECT_EQ(calls["activation_backward"], 0);
    EXPECT_EQ(calls["matmul_backward"], 3 * c.n_layer);  // qkv, attention and MLP projections
    EXPECT_EQ(calls["adamw_update_segments"], 1);
    EXPECT_EQ(calls["adamw_update"], 0);
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

TEST(Model, LlamaParameterCountMatchesTheArchitecture) {
    ModelConfig c = ModelConfig::from_style("llama");  // untied, no biases, RMSNorm, SwiGLU
    c.vocab_size = 13, c.d_model = 16, c.n_head = 4, c.n_kv_head = 2, c.n_layer = 2;
    c.ffn_hidden = 24;
    Model m(c, cpu(), make_pe("rope", c), 3);
    const size_t C = 16, V = 13, F = 24, L = 2, D = 4, Hkv = 2;
    // norms, q, k, v (2 key/value heads), o, gate + up, down
    const size_t per_layer = 2 * C + C * C + 2 * Hkv * D * C + C * C + 2 * F * C + C * F;
    EXPECT_EQ(m.num_params(), V * C + L * per_layer + C + V * C);
}

// Grouped-query attention is multi-head attention whose key/value heads are shared: a model with
// n_kv_head = 2 of 4 heads computes what the 4-head model computes when that model's k and v
// rows repeat the shared heads (query head h reads key/value head h / 2).
TEST(Model, GroupedQueryEqualsMultiHeadWithRepeatedKeyValueWeights) {
    ModelConfig g = ModelConfig::from_style("llama");
    g.vocab_size = 13, g.d_model = 16, g.n_head = 4, g.n_kv_head = 2, g.n_layer = 2;
    g.ffn_hidden = 24, g.context_length = 12, g.init_std = 0.3f;
    ModelConfig full = g;
    full.n_kv_head = 0;
    Model mg(g, cpu(), make_pe("rope", g), 5);
    Model mf(full, cpu(), make_pe("rope", full), 6);
    const int C = 16, D = 4, H = 4, G = 2;
    for (const ParamView& v : mf.layout().views()) {
        const ParamView& src = mg.layout().view(v.name);
        float* dst = mf.params().at(v);
        const float* from = mg.params().at(src);
        if (!v.name.ends_with("attn.qkv.weight")) {
            ASSERT_EQ(v.numel, src.numel) << v.name;
            std::copy(from, from + v.numel, dst);
            continue;
        }
        // grouped rows [q (4 heads) | k (2) | v (2)] -> full rows [q | k (4) | v (4)]
        for (int part = 0; part < 3; ++part)
            for (int h = 0; h < H; ++h) {
                const int src_head = part == 0 ? h : H + (part - 1) * (H / G) + h / G;
                std::copy(from + size_t(src_head) * D * C, from + size_t(src_head + 1) * D * C,
                          dst + (size_t(part) * H + h) * D * C);
            }
    }
    BatchBuffers buf = tiny_batch(g.vocab_size);
    const LossSums lg = mg.forward(buf.batch()), lf = mf.forward(buf.batch());
    EXPECT_NEAR(lg.loss_sum, lf.loss_sum, 1e-5 * std::fabs(lf.loss_sum));
    const std::vector<float> a = mg.logits(buf.batch()), b = mf.logits(buf.batch());
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 1e-5) << i;
}

// Mistral's sliding window is the model's own attention window: the same as the windowed
// control of a model without one, and the tighter of the two when both are set.
TEST(Model, SlidingWindowEqualsTheWindowedControl) {
    ModelConfig c = tiny_config();
    ModelConfig w = c;
    w.sliding_window = 3;
    Model mw(w, cpu(), make_pe("rope", w), 3);
    Model mc(c, cpu(), make_pe("rope", c), 3);
    BatchBuffers buf = tiny_batch(c.vocab_size);
    const double full = mc.forward(buf.batch()).loss_sum;
    mc.set_attention_window(3);
    const double control = mc.forward(buf.batch()).loss_sum;
    EXPECT_NE(full, control);  // the window matters for these rows of six
    EXPECT_EQ(mw.forward(buf.batch()).loss_sum, control);
    mw.set_attention_window(5);  // looser: the model's 3 still holds
    EXPECT_EQ(mw.forward(buf.batch()).loss_sum, control);
    mw.set_attention_window(2);  // tighter: 2
    mc.set_attention_window(2);
    EXPECT_EQ(mw.forward(buf.batch()).loss_sum, mc.forward(buf.batch()).loss_sum);
}

// The head fused with its loss (Backend::lm_head_loss), in one chunk and in two (a vocabulary of
// 40000 and CTX_LM_HEAD_CHUNK_MIB=1: 6 of the 12 rows per chunk): the pass's losses are the
// masked negative log-softmax of logits() at the targets, argmax() the first maximum of each
// row's logits, and logits() are those of the last pass whichever it was.
TEST(Model, FusedHeadLossesLogitsAndArgmaxAgree) {
    ModelConfig c = tiny_config();
    c.vocab_size = 40000;
    for (const char* mib : {static_cast<const char*>(nullptr), "1"}) {
        if (mib != nullptr) setenv("CTX_LM_HEAD_CHUNK_MIB", mib, 1);
        Model m(c, cpu(), make_pe("rope", c), 5);
        BatchBuffers buf = tiny_batch(c.vocab_size);
        const Batch b = buf.batch();
        const size_t N = 12, V = c.vocab_size;
        EXPECT_EQ(cpu().lm_head_chunk_rows(int(N), int(V)), mib ? 6 : 12);
        m.forward(b);
        const std::vector<float> lg = m.logits(b);
        const std::vector<int32_t> best = m.argmax(b);
        ASSERT_EQ(lg.size(), N * V);
        ASSERT_EQ(best.size(), N);
        for (size_t n = 0; n < N; ++n) {
            const float* row = lg.data() + n * V;
            double mx = -INFINITY, sum = 0.0;
            int32_t first = 0;
            for (size_t v = 0; v < V; ++v)
                if (row[v] > mx) {
                    mx = row[v];
                    first = int32_t(v);
                }
            for (size_t v = 0; v < V; ++v) sum += std::exp(double(row[v]) - mx);
            const double want = b.loss_mask[n] * (mx + std::log(sum) - row[b.targets[n]]);
            EXPECT_NEAR(m.losses()[n], want, 1e-5 * std::max(1.0, std::fabs(want))) << n;
            EXPECT_EQ(best[n], first) << n;
        }
        cpu().zero(m.grads().data(), m.grads().size());
        m.forward_backward(b, 0.1f);
        EXPECT_EQ(m.logits(b), lg);  // the same parameters: the same bits
        unsetenv("CTX_LM_HEAD_CHUNK_MIB");
    }
}

}  // namespace
}  // namespace ctx
