// pe/sinusoidal (METHODS.md 1.2) and pe/none (1.7) through the real host (PePlugin) and the model:
// the sinusoidal vectors against the formula at integral and fractional positions, the model's
// input being exactly wte + PE (compared with a learned table holding the same vectors), and NoPE
// models that ignore positions entirely.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <lua.hpp>

#include "core/error.h"
#include "model_fixtures.h"
#include "lua/options.h"
#include "lua/runtime.h"

namespace ctx {
namespace {

using test::cpu;
using test::make_pe;
using Opts = std::map<std::string, test::OptionValue>;

// make_pe with the real pe/none plugin for "pe/none" (make_pe maps "none" to no plugin).
std::unique_ptr<PePlugin> make_plugin(const std::string& name, const ModelConfig& c,
                                      const Opts& opts = {}) {
    if (name != "pe/none") return make_pe(name, c, opts);
    static lua::Runtime runtime;
    lua_State* L = runtime.state();
    lua_newtable(L);
    const LoadedPlugin& lib = test::plugins().get("pe/none");
    lua::Options o = lua::Options::parse(L, -1, plugin_option_schema(*lib.descriptor),
                                         "pe/none options", "test:");
    lua_pop(L, 1);
    ctx_model_info info{sizeof(ctx_model_info), c.d_model,    c.n_head,        c.head_dim(),
                        c.n_layer,              c.vocab_size, c.context_length};
    return std::make_unique<PePlugin>(lib, info, o, 1);
}

// PE(p, 2k) = sin(p / base^(2k/d)), PE(p, 2k+1) = cos(p / base^(2k/d)), written with a division
// as in the paper (the plugin multiplies by base^(-2k/d)).
double sinusoid(double p, int i, int d, double base = 10000.0) {
    const int k = i / 2;
    const double a = p / std::pow(base, 2.0 * k / d);
    return i % 2 == 0 ? std::sin(a) : std::cos(a);
}

ModelConfig config(int d_model, int n_head) {
    ModelConfig c = test::tiny_config();
    c.d_model = d_model;
    c.n_head = n_head;
    return c;
}

// ================================================================ pe/sinusoidal values

TEST(Sinusoidal, DescriptorAndInputSpec) {
    const LoadedPlugin& lib = test::plugins().get("pe/sinusoidal");
    const auto* vt = static_cast<const ctx_pe_vtable*>(lib.descriptor->vtable);
    EXPECT_EQ(vt->hooks, static_cast<uint32_t>(CTX_PE_HOOK_INPUT));
    EXPECT_NE(vt->input_forward, nullptr);
    EXPECT_EQ(vt->input_backward, nullptr) << "no parameters, nothing to differentiate";
    ASSERT_EQ(lib.descriptor->n_options, 1);
    EXPECT_STREQ(lib.descriptor->options[0].name, "base");
    EXPECT_STREQ(lib.descriptor->options[0].default_value, "10000");
    auto pe = make_pe("sinusoidal", config(16, 2));
    EXPECT_TRUE(pe->params().empty());
    EXPECT_EQ(pe->input_spec().kind, CTX_INPUT_GENERIC);
}

TEST(Sinusoidal, AddsTheFormulaAtIntegralAndFractionalPositions) {
    for (const auto& [d, heads] : {std::pair{16, 2}, std::pair{64, 4}, std::pair{15, 3}}) {
        SCOPED_TRACE(d);
        auto pe = make_pe("sinusoidal", config(d, heads));
        const std::vector<float> pos = {0.0f, 1.0f, 2.5f, 100.0f};
        std::mt19937 gen(3);
        std::uniform_real_distribution<float> u(-1, 1);
        std::vector<float> x(pos.size() * d);
        for (auto& v : x) v = u(gen);
        const std::vector<float> x0 = x;
        pe->input_forward({}, pos.data(), static_cast<int64_t>(pos.size()), x.data());
        for (size_t n = 0; n < pos.size(); ++n)
            for (int i = 0; i < d; ++i)
                EXPECT_NEAR(x[n * d + i] - x0[n * d + i], sinusoid(pos[n], i, d), 2e-6)
                    << "p=" << pos[n] << " dim " << i;
    }
    // Hand values, d = 16: p = 0 -> (0, 1, 0, 1, ...); p = 1 -> sin 1, cos 1 in dims 0, 1;
    // p = 2.5, dims 2, 3: 2.5 / 10000^(1/8) = 2.5 / 3.16227766 = 0.790569415.
    auto pe = make_pe("sinusoidal", config(16, 2));
    std::vector<float> x(3 * 16, 0.0f);
    const float pos[3] = {0.0f, 1.0f, 2.5f};
    pe->input_forward({}, pos, 3, x.data());
    for (int i = 0; i < 16; ++i) EXPECT_EQ(x[i], i % 2 == 0 ? 0.0f : 1.0f) << i;
    EXPECT_NEAR(x[16 + 0], 0.8414709848078965, 1e-7);
    EXPECT_NEAR(x[16 + 1], 0.5403023058681398, 1e-7);
    EXPECT_NEAR(x[32 + 2], std::sin(0.7905694150420949), 1e-7);
    EXPECT_NEAR(x[32 + 3], std::cos(0.7905694150420949), 1e-7);
}

TEST(Sinusoidal, OddWidthGivesTheLastDimensionItsSineOnly) {
    auto pe = make_pe("sinusoidal", config(15, 3));
    std::vector<float> x(15, 0.0f);
    const float p = 37.0f;
    pe->input_forward({}, &p, 1, x.data());
    EXPECT_NEAR(x[14], std::sin(37.0 / std::pow(10000.0, 14.0 / 15.0)), 1e-7);
}

TEST(Sinusoidal, BaseOption) {
    auto pe = make_pe("sinusoidal", config(16, 2), {{"base", 100.0}});
    std::vector<float> x(16, 0.0f);
    const float p = 7.5f;
    pe->input_forward({}, &p, 1, x.data());
    for (int i = 0; i < 16; ++i) EXPECT_NEAR(x[i], sinusoid(7.5, i, 16, 100.0), 1e-6) << i;
    for (double bad : {0.0, -3.0}) {
        try {
            make_pe("sinusoidal", config(16, 2), {{"base", bad}});
            ADD_FAILURE() << "expected an error for base " << bad;
        } catch (const Error& e) {
            EXPECT_NE(std::string(e.what()).find("option 'base'"), std::string::npos) << e.what();
        }
    }
}

// ================================================================ through the model

// The sinusoidal model's input is wte + PE: a learned-table model with the same weights and
// wpe[r] = PE(r) gives the same loss at integral positions.
TEST(Sinusoidal, ModelInputIsTokenEmbeddingPlusTheEncoding) {
    const ModelConfig c = test::tiny_config();
    Model sin_model(c, cpu(), make_pe("sinusoidal", c), 3);
    Model table_model(c, cpu(), make_pe("learned", c), 4);
    for (const ParamView& v : table_model.layout().views()) {
        float* dst = table_model.params().at(v);
        if (v.name == "pe.wpe") {
            for (int64_t r = 0; r < v.shape[0]; ++r)
                for (int64_t i = 0; i < v.shape[1]; ++i)
                    dst[r * v.shape[1] + i] = static_cast<float>(sinusoid(double(r), int(i), c.d_model));
        } else {
            const ParamView& s = sin_model.layout().view(v.name);
            ASSERT_EQ(s.numel, v.numel) << v.name;
            std::memcpy(dst, sin_model.params().at(s), v.numel * sizeof(float));
        }
    }
    BatchBuffers buf = test::tiny_batch(c.vocab_size);
    for (size_t i = 0; i < buf.positions.size(); ++i) buf.positions[i] = std::floor(buf.positions[i]);
    const LossSums a = sin_model.forward(buf.batch());
    const std::vector<float> la(sin_model.losses(), sin_model.losses() + buf.positions.size());
    table_model.forward(buf.batch());
    for (size_t i = 0; i < la.size(); ++i)
        EXPECT_NEAR(table_model.losses()[i], la[i], 2e-5 * (1 + la[i])) << i;

    // And the encoding matters: a NoPE model with the same weights differs.
    Model nope(c, cpu(), nullptr, 3);
    EXPECT_GT(std::fabs(nope.forward(buf.batch()).loss_sum - a.loss_sum), 1e-3);
}

// ================================================================ pe/none

TEST(NoPE, PluginDeclaresOnlyAnEmptyBias) {
    const LoadedPlugin& lib = test::plugins().get("pe/none");
    const auto* vt = static_cast<const ctx_pe_vtable*>(lib.descriptor->vtable);
    EXPECT_EQ(vt->hooks, static_cast<uint32_t>(CTX_PE_HOOK_BIAS));
    EXPECT_EQ(lib.descriptor->n_options, 0);
    auto pe = make_plugin("pe/none", test::tiny_config());
    EXPECT_TRUE(pe->params().empty());
    const ctx_bias_spec s = pe->bias_spec(128);
    EXPECT_EQ(s.kind, CTX_BIAS_NONE);
    EXPECT_EQ(s.param_a, -1);
    EXPECT_EQ(s.param_b, -1);
    pe->extend(12, 48);  // nothing to change, no error
    EXPECT_TRUE(pe->params().empty());
}

TEST(NoPE, PositionsDoNotMatter) {
    const ModelConfig c = test::tiny_config();
    Model m(c, cpu(), make_plugin("pe/none", c), 3);
    Model null_pe(c, cpu(), nullptr, 3);  // the engine's own NoPE (no plugin), same weights
    BatchBuffers buf = test::tiny_batch(c.vocab_size);
    const LossSums base = m.forward(buf.batch());
    const std::vector<float> per_token(m.losses(), m.losses() + buf.positions.size());
    EXPECT_EQ(null_pe.forward(buf.batch()).loss_sum, base.loss_sum);

    BatchBuffers shifted = buf;  // a common shift
    for (float& p : shifted.positions) p += 1000.25f;
    BatchBuffers shuffled = buf;  // arbitrary, unordered positions
    std::mt19937 gen(9);
    std::shuffle(shuffled.positions.begin(), shuffled.positions.end(), gen);
    for (size_t i = 0; i < shuffled.positions.size(); i += 3) shuffled.positions[i] *= 7.5f;
    for (const BatchBuffers* b : {&shifted, &shuffled}) {
        EXPECT_EQ(m.forward(b->batch()).loss_sum, base.loss_sum);
        for (size_t i = 0; i < per_token.size(); ++i) EXPECT_EQ(m.losses()[i], per_token[i]) << i;
    }
}

}  // namespace
}  // namespace ctx
