// pe/rope's scaling modes as the engine applies them (METHODS.md 1.3): the RotarySpec a real
// PePlugin hands the engine, for every mode and both pair layouts, checked against
//   (a) a naive double-precision rotation written here from the spec's fields,
//   (b) central finite differences through rotary_forward + attention_forward,
//   (c) central finite differences through the whole model (a few modes, plus the input-hook
//       sinusoidal encoding and the pe/none plugin),
//   (d) relative-position invariance: a common shift of all positions leaves rotary attention
//       unchanged (xPos included, the amplitude ratio depends on p_i - p_j only), while absolute
//       encodings (sinusoidal, learned) change the model's output.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <lua.hpp>

#include "core/rng.h"
#include "model_fixtures.h"
#include "lua/options.h"
#include "lua/runtime.h"

namespace ctx {
namespace {

using test::cpu;
using test::make_pe;
using test::OptionValue;
using Opts = std::map<std::string, OptionValue>;

struct Mode {
    const char* label;
    Opts opts;
};

// Every scaling mode, with parameters that make it do something at head_dim 16 and T <= 9:
// dynamic NTK with L = 4 < T, a YaRN L whose ramp covers the pairs, Giraffe cutoffs that keep,
// replace and zero pairs, an xPos scale base small enough that the amplitudes matter.
std::vector<Mode> all_modes() {
    const std::string s = "scaling";
    return {
        {"none", {}},
        {"linear", {{s, std::string("linear")}, {"factor", 2.5}}},
        {"ntk", {{s, std::string("ntk")}, {"factor", 4.0}}},
        {"dynamic_ntk", {{s, std::string("dynamic_ntk")}, {"factor", 2.0}, {"original_length", 4.0}}},
        {"yarn", {{s, std::string("yarn")}, {"factor", 4.0}, {"original_length", 512.0}}},
        {"giraffe_power", {{s, std::string("giraffe_power")}}},
        {"giraffe_truncated", {{s, std::string("giraffe_truncated")}, {"original_length", 64.0}}},
        {"xpos", {{s, std::string("xpos")}, {"xpos_scale_base", 16.0}}},
    };
}

ModelConfig op_config(int H, int D) {
    ModelConfig c = test::tiny_config();
    c.n_head = H;
    c.d_model = H * D;
    c.context_length = 16;
    return c;
}

std::vector<float> random_vec(size_t n, unsigned seed, float lo = -1.0f, float hi = 1.0f) {
    std::mt19937 gen(seed);
    std::uniform_real_distribution<float> d(lo, hi);
    std::vector<float> v(n);
    for (auto& x : v) x = d(gen);
    return v;
}

// Non-negative positions, multiples of 0.25 (so shifts by 37.5 are exact), not sorted.
std::vector<float> random_positions(size_t n, unsigned seed, float hi) {
    std::mt19937 gen(seed);
    std::uniform_int_distribution<int> d(0, static_cast<int>(hi * 4));
    std::vector<float> v(n);
    for (auto& x : v) x = static_cast<float>(d(gen)) * 0.25f;
    return v;
}

// The rotation written from ctx_rotary_spec's documentation, in double.
std::vector<double> naive_rotary(const std::vector<float>& qkv, const std::vector<float>& pos,
                                 int B, int T, int C, int H, const RotarySpec& s) {
    std::vector<double> out(qkv.begin(), qkv.end());
    const int D = C / H, dr = s.rotary_dims, half = dr / 2;
    for (int bt = 0; bt < B * T; ++bt) {
        const double p = pos[bt];
        for (int k = 0; k < half; ++k) {
            const int i0 = s.layout == RotaryLayout::Half ? k : 2 * k;
            const int i1 = s.layout == RotaryLayout::Half ? k + half : 2 * k + 1;
            const double a = p * s.position_scale * s.inv_freq[k];
            double qs = s.attention_factor, ks = s.attention_factor;
            if (s.amp_base) {
                qs *= std::exp((p / s.amp_scale_base) * std::log(double(s.amp_base[k])));
                ks *= std::exp((-p / s.amp_scale_base) * std::log(double(s.amp_base[k])));
            }
            for (int h = 0; h < H; ++h) {
                for (int part = 0; part < 2; ++part) {  // q, then k
                    const size_t o = size_t(bt) * 3 * C + size_t(part) * C + size_t(h) * D;
                    const double x0 = qkv[o + i0], x1 = qkv[o + i1], sc = part == 0 ? qs : ks;
                    out[o + i0] = sc * (std::cos(a) * x0 - std::sin(a) * x1);
                    out[o + i1] = sc * (std::sin(a) * x0 + std::cos(a) * x1);
                }
            }
        }
    }
    return out;
}

// Rotary + attention forward on a copy of qkv: the attention output (B, T, C).
std::vector<float> rotary_attention(std::vector<float> qkv, const std::vector<float>& pos, int B,
                                    int T, int C, int H, const RotarySpec& s,
                                    std::vector<float>* att_out = nullptr,
                                    std::vector<float>* qkv_rot = nullptr) {
    Backend& be = cpu();
    std::vector<float> out(size_t(B) * T * C), att(size_t(B) * H * T * T);
    be.rotary_forward(qkv.data(), pos.data(), B, T, C, H, s);
    be.attention_forward(out.data(), att.data(), qkv.data(), pos.data(), B, T, C, H,
                         AttentionOptions{});
    if (att_out) *att_out = att;
    if (qkv_rot) *qkv_rot = qkv;
    return out;
}

double weighted_sum(const std::vector<float>& w, const std::vector<float>& x) {
    double s = 0;
    for (size_t i = 0; i < x.size(); ++i) s += double(w[i]) * x[i];
    return s;
}

struct Layouts {
    const char* layout;
    double pct;
};
const Layouts kLayouts[] = {{"half", 1.0}, {"interleaved", 1.0}, {"half", 0.5}, {"interleaved", 0.5}};

Opts with_layout(Opts o, const Layouts& l) {
    o["layout"] = std::string(l.layout);
    o["rotary_pct"] = l.pct;
    return o;
}

// ================================================================ (a) the engine's rotation

TEST(RotaryModes, CpuRotaryMatchesNaiveRotationFromTheSpec) {
    const int B = 2, T = 7, H = 2, D = 16, C = H * D;
    const ModelConfig c = op_config(H, D);
    for (const Mode& m : all_modes()) {
        for (const Layouts& l : kLayouts) {
            SCOPED_TRACE(std::string(m.label) + " " + l.layout + " pct " + std::to_string(l.pct));
            auto pe = make_pe("rope", c, with_layout(m.opts, l));
            const RotarySpec s = pe->rotary_spec(T);
            ASSERT_EQ(s.rotary_dims, static_cast<int>(D * l.pct));
            EXPECT_EQ(s.layout == RotaryLayout::Half, std::string(l.layout) == "half");
            EXPECT_EQ(s.amp_base != nullptr, std::string(m.label) == "xpos");
            const auto qkv = random_vec(size_t(B) * T * 3 * C, 11);
            const auto pos = random_positions(size_t(B) * T, 12, 40.0f);
            std::vector<float> got = qkv;
            cpu().rotary_forward(got.data(), pos.data(), B, T, C, H, s);
            const auto want = naive_rotary(qkv, pos, B, T, C, H, s);
            double max_err = 0;
            for (size_t i = 0; i < got.size(); ++i)
                max_err = std::max(max_err, std::fabs(got[i] - want[i]) / (1 + std::fabs(want[i])));
            EXPECT_LT(max_err, 2e-6);
            // v and the pass-through dims are untouched.
            for (int bt = 0; bt < B * T; ++bt)
                for (int j = 0; j < C; ++j) EXPECT_EQ(got[size_t(bt) * 3 * C + 2 * C + j], qkv[size_t(bt) * 3 * C + 2 * C + j]);
        }
    }
}

// ================================================================ (b) op-level gradients

// loss(qkv) = sum(R * attention(rotary(qkv))): analytic gradient through attention_backward and
// rotary_backward against central differences on every entry of qkv.
void check_rotary_attention_gradients(const RotarySpec& s, int B, int T, int H, int D,
                                      unsigned seed) {
    const int C = H * D;
    Backend& be = cpu();
    const auto qkv = random_vec(size_t(B) * T * 3 * C, seed);
    const auto pos = random_positions(size_t(B) * T, seed + 1, 30.0f);
    const auto R = random_vec(size_t(B) * T * C, seed + 2);
    std::vector<float> att, qkv_rot;
    rotary_attention(qkv, pos, B, T, C, H, s, &att, &qkv_rot);
    std::vector<float> dqkv(qkv.size(), 0.0f);
    std::vector<float> scratch(be.attention_scratch_floats(B, T, C, H, ctx::AttentionMode::Materialised));
    be.attention_backward(dqkv.data(), scratch.data(), R.data(), qkv_rot.data(), att.data(), nullptr,
                          pos.data(), B, T, C, H, AttentionOptions{});
    be.rotary_backward(dqkv.data(), pos.data(), B, T, C, H, s);

    const double eps = 1e-2;
    double diff_sq = 0, num_sq = 0;
    std::vector<float> x = qkv;
    for (size_t i = 0; i < x.size(); ++i) {
        const float orig = x[i];
        x[i] = orig + static_cast<float>(eps);
        const double lp = weighted_sum(R, rotary_attention(x, pos, B, T, C, H, s));
        x[i] = orig - static_cast<float>(eps);
        const double lm = weighted_sum(R, rotary_attention(x, pos, B, T, C, H, s));
        x[i] = orig;
        const double numeric = (lp - lm) / (2 * eps);
        EXPECT_NEAR(dqkv[i], numeric, 2e-3 + 2e-2 * std::fabs(numeric)) << "qkv[" << i << "]";
        diff_sq += (dqkv[i] - numeric) * (dqkv[i] - numeric);
        num_sq += numeric * numeric;
    }
    EXPECT_LT(std::sqrt(diff_sq / num_sq), 1e-2);
}

TEST(RotaryModes, RotaryAttentionGradientsMatchFiniteDifferences) {
    for (const Mode& m : all_modes()) {
        for (const Layouts& l : kLayouts) {
            SCOPED_TRACE(std::string(m.label) + " " + l.layout + " pct " + std::to_string(l.pct));
            const bool small = l.pct < 1.0;  // vary the shapes a little
            const int B = small ? 1 : 2, T = small ? 9 : 5, H = 2, D = small ? 16 : 8;
            auto pe = make_pe("rope", op_config(H, D), with_layout(m.opts, l));
            check_rotary_attention_gradients(pe->rotary_spec(T), B, T, H, D, 100 + T);
        }
    }
}

// ================================================================ (c) whole-model gradients

using test::mean_loss;

void check_model_gradients(Model& m, const BatchBuffers& buf, const std::string& label) {
    test::GradCheckOptions opt;  // 5 random entries of every view
    opt.samples_per_view = 5;
    opt.all_small_views = false;
    opt.seed = 7;
    test::check_model_gradients(m, buf, label, opt);
}

// make_pe maps "none" to "no plugin"; this builds the real pe/none plugin instead.
std::unique_ptr<PePlugin> make_plugin(const std::string& name, const ModelConfig& c) {
    if (name != "none") return make_pe(name, c);
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

TEST(RotaryModes, WholeModelGradientsMatchFiniteDifferences) {
    const std::string s = "scaling";
    const std::vector<Mode> modes = {
        {"yarn_half", {{s, std::string("yarn")}, {"factor", 4.0}, {"original_length", 64.0}}},
        {"xpos_interleaved",
         {{s, std::string("xpos")}, {"xpos_scale_base", 8.0}, {"layout", std::string("interleaved")}}},
        {"truncated_partial",
         {{s, std::string("giraffe_truncated")}, {"original_length", 16.0}, {"rotary_pct", 0.5}}},
        {"dynamic_ntk_interleaved",
         {{s, std::string("dynamic_ntk")}, {"factor", 3.0}, {"original_length", 4.0},
          {"layout", std::string("interleaved")}}},
    };
    const ModelConfig c = test::tiny_config();
    for (const Mode& m : modes) {
        SCOPED_TRACE(m.label);
        Model model(c, cpu(), make_pe("rope", c, m.opts), 3);
        check_model_gradients(model, test::tiny_batch(c.vocab_size), m.label);
    }
    for (const char* name : {"sinusoidal", "none"}) {  // the input hook without parameters; NoPE
        SCOPED_TRACE(name);
        Model model(c, cpu(), make_plugin(name, c), 3);
        check_model_gradients(model, test::tiny_batch(c.vocab_size), name);
    }
}

// ================================================================ (d) relative positions

TEST(RotaryModes, CommonShiftLeavesRotaryAttentionUnchanged) {
    const int B = 2, T = 8, H = 2, D = 16, C = H * D;
    const ModelConfig c = op_config(H, D);
    for (const Mode& m : all_modes()) {
        for (const Layouts& l : kLayouts) {
            SCOPED_TRACE(std::string(m.label) + " " + l.layout + " pct " + std::to_string(l.pct));
            auto pe = make_pe("rope", c, with_layout(m.opts, l));
            const RotarySpec s = pe->rotary_spec(T);
            const bool xpos = s.amp_base != nullptr;
            const auto qkv = random_vec(size_t(B) * T * 3 * C, 21);
            const auto pos = random_positions(size_t(B) * T, 22, 30.0f);
            auto shifted = pos;
            const float shift = xpos ? 4.5f : 37.5f;  // xPos: amplitudes grow with p
            for (float& p : shifted) p += shift;
            const auto a = rotary_attention(qkv, pos, B, T, C, H, s);
            const auto b = rotary_attention(qkv, shifted, B, T, C, H, s);
            double max_diff = 0, max_abs = 0;
            for (size_t i = 0; i < a.size(); ++i) {
                max_diff = std::max(max_diff, double(std::fabs(a[i] - b[i])));
                max_abs = std::max(max_abs, double(std::fabs(a[i])));
            }
            EXPECT_LT(max_diff, 1e-4 * max_abs);
            // The rotation itself is not invariant (otherwise this test would prove nothing).
            std::vector<float> ra = qkv, rb = qkv;
            cpu().rotary_forward(ra.data(), pos.data(), B, T, C, H, s);
            cpu().rotary_forward(rb.data(), shifted.data(), B, T, C, H, s);
            EXPECT_NE(ra, rb);
        }
    }
}

BatchBuffers shifted_batch(const BatchBuffers& b, float shift) {
    BatchBuffers s = b;
    for (float& p : s.positions) p += shift;
    return s;
}

TEST(RotaryModes, CommonShiftLeavesRotaryModelsUnchangedButNotAbsoluteOnes) {
    ModelConfig c = test::tiny_config();
    c.context_length = 64;  // room for the learned table to take shifted positions
    const BatchBuffers buf = test::tiny_batch(c.vocab_size);
    for (const Mode& m : all_modes()) {
        SCOPED_TRACE(m.label);
        Model model(c, cpu(), make_pe("rope", c, m.opts), 5);
        const bool xpos = std::string(m.label) == "xpos";
        const double a = mean_loss(model, buf.batch());
        const double b = mean_loss(model, shifted_batch(buf, xpos ? 4.5f : 37.5f).batch());
        EXPECT_NEAR(a, b, 1e-5 * std::fabs(a));
    }
    for (const char* name : {"sinusoidal", "learned"}) {
        SCOPED_TRACE(name);
        Model model(c, cpu(), make_pe(name, c, name == std::string("learned")
                                                   ? Opts{{"init_std", 0.3}}
                                                   : Opts{}),
                    5);
        const double a = mean_loss(model, buf.batch());
        const double b = mean_loss(model, shifted_batch(buf, 37.5f).batch());
        EXPECT_GT(std::fabs(a - b), 1e-4) << "an absolute encoding must see the shift";
    }
}

}  // namespace
}  // namespace ctx
