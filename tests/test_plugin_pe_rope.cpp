// pe/rope's scaling modes (METHODS.md 1.3: linear, NTK, dynamic NTK, YaRN, Giraffe power and
// truncated bases, xPos), driven through the C ABI with the fake host of
// fake_plugin_host.h. Every expected value is computed here, independently, in double
// precision from the formulas, or is a hand-derived literal.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <iterator>
#include <map>
#include <memory>
#include <string>
#include <variant>
#include <vector>

#include "fake_plugin_host.h"
#include "plugin/registry.h"

namespace {

using namespace ctx::test_host;  // FakeHost, Instance, model_info, ... (fake_plugin_host.h)

// Loads pe/rope once for the whole test program.
class RopeModes : public ::testing::Test {
protected:
    static void SetUpTestSuite() {
        registry_ = new ctx::PluginRegistry();
        registry_->load_file(std::string(CTX_TEST_BINARY_DIR) + "/plugins/pe/pe_rope.so");
    }
    static void TearDownTestSuite() {
        delete registry_;
        registry_ = nullptr;
    }
    static const ctx::LoadedPlugin& rope() { return registry_->get("pe/rope"); }
    static ctx::PluginRegistry* registry_;
};
ctx::PluginRegistry* RopeModes::registry_ = nullptr;

const double kPi = 3.14159265358979323846;

// theta_k = base^(-2k/dr) (0-indexed k), written as exp(-(2k/dr) ln base).
double theta(double base, int k, int dr) { return std::exp(-(2.0 * k / dr) * std::log(base)); }

std::vector<float> freqs(const ctx_rotary_spec& s) {
    return std::vector<float>(s.inv_freq, s.inv_freq + s.rotary_dims / 2);
}

std::vector<uint8_t> save(Instance& r) {
    size_t size = 0;
    ctx_err e{};
    EXPECT_EQ(r.vt->save_state(r.inst, nullptr, 0, &size, &e), CTX_OK) << e.message;
    std::vector<uint8_t> buf(size);
    EXPECT_EQ(r.vt->save_state(r.inst, buf.data(), buf.size(), &size, &e), CTX_OK) << e.message;
    EXPECT_EQ(size, buf.size());
    return buf;
}

ctx_status load(Instance& r, const std::vector<uint8_t>& buf, std::string* message = nullptr) {
    ctx_err e{};
    const ctx_status st = r.vt->load_state(r.inst, buf.data(), buf.size(), &e);
    if (message) *message = e.message;
    return st;
}

bool logged(const Instance& r, const std::string& part) {
    for (const auto& [level, msg] : r.host.logs)
        if (contains(msg, part)) return true;
    return false;
}

// Angles the engine forms, a = (p * position_scale) * inv_freq[k], in double as the CPU op does.
double engine_angle(const ctx_rotary_spec& s, double p, int k) {
    return p * static_cast<double>(s.position_scale) * static_cast<double>(s.inv_freq[k]);
}

const double kPositions[] = {0.0, 1.0, 2.5, 17.25, 100.0, 1234.75, 4095.5};

}  // namespace

// ================================================================ descriptor and plain RoPE

TEST_F(RopeModes, DescriptorDeclaresEveryScalingOption) {
    const ctx_plugin_descriptor* d = rope().descriptor;
    const auto* vt = static_cast<const ctx_pe_vtable*>(d->vtable);
    EXPECT_EQ(vt->hooks, static_cast<uint32_t>(CTX_PE_HOOK_ROTARY));
    EXPECT_NE(vt->save_state, nullptr);
    EXPECT_NE(vt->load_state, nullptr);
    struct Want {
        const char* name;
        int32_t type;
        const char* dflt;  // nullptr: depends on other values, not checked
    };
    const int32_t N = CTX_OPT_NUMBER;
    const Want want[] = {{"base", N, "10000"},       {"rotary_pct", N, "1.0"},
                         {"layout", CTX_OPT_STRING, "half"},
                         {"scaling", CTX_OPT_STRING, "none"},
                         {"factor", N, "1"},         {"original_length", CTX_OPT_INTEGER, nullptr},
                         {"power", N, "0.5"},        {"trunc_a", N, nullptr},
                         {"trunc_b", N, nullptr},    {"trunc_rho", N, nullptr},
                         {"yarn_alpha", N, "1"},     {"yarn_beta", N, "32"},
                         {"xpos_gamma", N, "0.4"},   {"xpos_scale_base", N, "512"},
                         {"yarn_beta_fast", N, "32"}, {"yarn_beta_slow", N, "1"},
                         {"mscale", N, nullptr},     {"mscale_all_dim", N, nullptr},
                         {"attention_factor", N, nullptr},
                         {"low_freq_factor", N, "1"}, {"high_freq_factor", N, "4"},
                         {"short_factor", CTX_OPT_NUMBER_LIST, nullptr},
                         {"long_factor", CTX_OPT_NUMBER_LIST, nullptr}};
    ASSERT_EQ(d->n_options, static_cast<int32_t>(std::size(want)));
    for (const Want& w : want) {
        const ctx_option_desc* o = nullptr;
        for (int32_t i = 0; i < d->n_options; ++i)
            if (std::strcmp(d->options[i].name, w.name) == 0) o = &d->options[i];
        ASSERT_NE(o, nullptr) << w.name;
        EXPECT_EQ(o->type, w.type) << w.name;
        if (w.dflt) {
            EXPECT_STREQ(o->default_value, w.dflt) << w.name;
        }
        EXPECT_NE(o->help, nullptr) << w.name;
    }
}

TEST_F(RopeModes, ExplicitNoneIsPlainRope) {
    for (double pct : {1.0, 0.25}) {
        SCOPED_TRACE(pct);
        const int dr = static_cast<int>(64 * pct);
        Instance r(rope(), model_info(4, 64, 1024), {{"scaling", std::string("none")}, {"rotary_pct", pct}});
        ASSERT_EQ(r.status, CTX_OK) << r.message();
        const ctx_rotary_spec s = r.rotary(4096);
        EXPECT_EQ(s.rotary_dims, dr);
        for (int k = 0; k < dr / 2; ++k) expect_rel_near(s.inv_freq[k], theta(1e4, k, dr), 1e-7, "theta");
        EXPECT_EQ(s.position_scale, 1.0f);
        EXPECT_EQ(s.attention_factor, 1.0f);
        EXPECT_EQ(s.amp_base, nullptr);
        EXPECT_EQ(r.extend(1024, 4096), CTX_OK);
        EXPECT_TRUE(logged(r, "unchanged"));
        EXPECT_EQ(r.host.registered, 0);
    }
}

// ================================================================ linear (position interpolation)

TEST_F(RopeModes, LinearScalesPositionsByOneOverS) {
    for (double pct : {1.0, 0.25}) {
        for (double s : {2.0, 3.0, 4.0}) {
            SCOPED_TRACE(std::to_string(pct) + " s=" + std::to_string(s));
            const int dr = static_cast<int>(64 * pct);
            Instance r(rope(), model_info(4, 64, 2048),
                       {{"scaling", std::string("linear")}, {"factor", s}, {"rotary_pct", pct}});
            ASSERT_EQ(r.status, CTX_OK) << r.message();
            const ctx_rotary_spec sp = r.rotary(2048);
            EXPECT_EQ(sp.rotary_dims, dr);
            expect_rel_near(sp.position_scale, 1.0 / s, 1e-7, "position_scale");
            EXPECT_EQ(sp.attention_factor, 1.0f);
            EXPECT_EQ(sp.amp_base, nullptr);
            for (int k = 0; k < dr / 2; ++k) {
                expect_rel_near(sp.inv_freq[k], theta(1e4, k, dr), 1e-7, "theta");
                for (double p : kPositions)  // a_{i,k} = (p / s) theta_k
                    EXPECT_NEAR(engine_angle(sp, p, k), (p / s) * theta(1e4, k, dr),
                                1e-6 * (1 + (p / s) * theta(1e4, k, dr)))
                        << "p=" << p << " k=" << k;
            }
        }
    }
    // Literal: s = 4, p = 2.5, k = 0 -> angle 0.625; k = 1 -> 0.625 * 10000^(-1/32).
    Instance r(rope(), model_info(4, 64), {{"scaling", std::string("linear")}, {"factor", 4.0}});
    const ctx_rotary_spec sp = r.rotary(8);
    EXPECT_DOUBLE_EQ(engine_angle(sp, 2.5, 0), 0.625);
    EXPECT_NEAR(engine_angle(sp, 2.5, 1), 0.625 * 0.7498942093324559, 1e-7);
}

// ================================================================ NTK-aware

TEST_F(RopeModes, NtkRaisesTheBase) {
    for (double pct : {1.0, 0.25}) {
        SCOPED_TRACE(pct);
        const int dr = static_cast<int>(64 * pct);
        Instance r(rope(), model_info(4, 64, 2048),
                   {{"scaling", std::string("ntk")}, {"factor", 4.0}, {"rotary_pct", pct}});
        ASSERT_EQ(r.status, CTX_OK) << r.message();
        const ctx_rotary_spec sp = r.rotary(2048);
        const double base2 = 1e4 * std::exp((dr / (dr - 2.0)) * std::log(4.0));
        for (int k = 0; k < dr / 2; ++k)
            expect_rel_near(sp.inv_freq[k], theta(base2, k, dr), 1e-6, "ntk theta " + std::to_string(k));
        EXPECT_EQ(sp.position_scale, 1.0f);
        EXPECT_EQ(sp.attention_factor, 1.0f);
        for (double p : kPositions)
            EXPECT_NEAR(engine_angle(sp, p, 3), p * theta(base2, 3, dr), 1e-6 * (1 + p));
    }
    // Literals: base' = 10000 * 4^(64/62) = 41829.3659...; 10000 * 4^(16/14) = 48760.546...
    Instance a(rope(), model_info(4, 64), {{"scaling", std::string("ntk")}, {"factor", 4.0}});
    expect_rel_near(a.rotary(8).inv_freq[16], 1.0 / std::sqrt(41829.36592889948), 1e-6, "64 dims");
    Instance b(rope(), model_info(4, 64),
               {{"scaling", std::string("ntk")}, {"factor", 4.0}, {"rotary_pct", 0.25}});
    expect_rel_near(b.rotary(8).inv_freq[4], 1.0 / std::sqrt(48760.54616817902), 1e-6, "16 dims");
}

// ================================================================ dynamic NTK

TEST_F(RopeModes, DynamicNtkDependsOnTheRowLength) {
    for (double pct : {1.0, 0.25}) {
        SCOPED_TRACE(pct);
        const int dr = static_cast<int>(64 * pct);
        const double L = 1024, s = 2;
        Instance r(rope(), model_info(4, 64, 1024),
                   {{"scaling", std::string("dynamic_ntk")}, {"factor", s}, {"rotary_pct", pct}});
        ASSERT_EQ(r.status, CTX_OK) << r.message();
        for (int64_t len : {int64_t{1}, int64_t{512}, int64_t{1024}}) {  // l <= L: plain base
            const ctx_rotary_spec sp = r.rotary(len);
            for (int k = 0; k < dr / 2; ++k)
                expect_rel_near(sp.inv_freq[k], theta(1e4, k, dr), 1e-7, "len " + std::to_string(len));
        }
        for (int64_t len : {int64_t{1025}, int64_t{3000}, int64_t{4096}}) {
            const double base2 = 1e4 * std::pow(s * len / L - (s - 1), dr / (dr - 2.0));
            const ctx_rotary_spec sp = r.rotary(len);
            EXPECT_EQ(sp.position_scale, 1.0f);
            for (int k = 0; k < dr / 2; ++k)
                expect_rel_near(sp.inv_freq[k], theta(base2, k, dr), 1e-6, "len " + std::to_string(len));
        }
        // And back to a short row: the plain frequencies again.
        const ctx_rotary_spec sp = r.rotary(100);
        for (int k = 0; k < dr / 2; ++k) expect_rel_near(sp.inv_freq[k], theta(1e4, k, dr), 1e-7, "back");
    }
    // Literal: s = 2, l = 4096 = 4L: base' = 10000 * 7^(64/62); theta_16 = base'^(-1/2).
    Instance r(rope(), model_info(4, 64, 1024), {{"scaling", std::string("dynamic_ntk")}, {"factor", 2.0}});
    expect_rel_near(r.rotary(4096).inv_freq[16], 1.0 / std::sqrt(1e4 * std::pow(7.0, 64.0 / 62.0)), 1e-6,
                    "literal");
}

// ================================================================ YaRN

// gamma_k of METHODS.md 1.3 for r = L / lambda_k.
double yarn_gamma(double r, double alpha, double beta) {
    if (r < alpha) return 0;
    if (r > beta) return 1;
    return (r - alpha) / (beta - alpha);
}

TEST_F(RopeModes, YarnBlendsPerPairAndScalesAttention) {
    for (double pct : {1.0, 0.25}) {
        SCOPED_TRACE(pct);
        const int dr = static_cast<int>(64 * pct);
        const double s = 4, L = 2048;
        Instance r(rope(), model_info(4, 64, 1024),
                   {{"scaling", std::string("yarn")}, {"factor", s}, {"rotary_pct", pct},
                    {"original_length", int64_t{2048}}});
        ASSERT_EQ(r.status, CTX_OK) << r.message();
        const ctx_rotary_spec sp = r.rotary(8192);
        EXPECT_NEAR(sp.attention_factor, 1.1386294361119891, 1e-7);  // 0.1 ln 4 + 1
        EXPECT_EQ(sp.position_scale, 1.0f);
        EXPECT_EQ(sp.amp_base, nullptr);
        int below = 0, ramp = 0, above = 0;
        for (int k = 0; k < dr / 2; ++k) {
            const double th = theta(1e4, k, dr);
            const double rk = L / (2 * kPi / th);
            const double g = yarn_gamma(rk, 1, 32);
            (rk < 1 ? below : rk > 32 ? above : ramp)++;
            expect_rel_near(sp.inv_freq[k], (1 - g) * th / s + g * th, 1e-6, "yarn " + std::to_string(k));
        }
        EXPECT_GT(below, 0);
        EXPECT_GT(ramp, 0);
        EXPECT_GT(above, 0);
    }
    // Hand values for dr = 64, L = 2048, s = 4: k = 0 (r = 325.9 > 32) keeps theta = 1; k = 12
    // (r = 10.3074, gamma = 0.300239) -> 0.0150264977; k = 21 (r = 0.773 < 1) -> theta / 4.
    Instance r(rope(), model_info(4, 64, 2048), {{"scaling", std::string("yarn")}, {"factor", 4.0}});
    const ctx_rotary_spec sp = r.rotary(2048);
    EXPECT_EQ(sp.inv_freq[0], 1.0f);
    expect_rel_near(sp.inv_freq[12], 0.015026497703256057, 1e-6, "k=12");
    expect_rel_near(sp.inv_freq[21], 0.0005928434264154138, 1e-6, "k=21");
    for (int k : {1, 8}) expect_rel_near(sp.inv_freq[k], theta(1e4, k, 64), 1e-7, "above beta");

    // Other ramp bounds and s: alpha = 2, beta = 16, s = 8 -> m = 0.1 ln 8 + 1 = 1.2079441542.
    Instance c(rope(), model_info(4, 64, 2048),
               {{"scaling", std::string("yarn")}, {"factor", 8.0}, {"yarn_alpha", 2.0}, {"yarn_beta", 16.0}});
    ASSERT_EQ(c.status, CTX_OK) << c.message();
    const ctx_rotary_spec cs = c.rotary(2048);
    EXPECT_NEAR(cs.attention_factor, 1.2079441541679836, 1e-7);
    for (int k = 0; k < 32; ++k) {
        const double th = theta(1e4, k, 64), g = yarn_gamma(2048 * th / (2 * kPi), 2, 16);
        expect_rel_near(cs.inv_freq[k], (1 - g) * th / 8 + g * th, 1e-6, "custom " + std::to_string(k));
    }
    // s = 1 is the identity: theta and m = 1.
    Instance one(rope(), model_info(4, 64, 2048), {{"scaling", std::string("yarn")}});
    const ctx_rotary_spec os = one.rotary(2048);
    EXPECT_EQ(os.attention_factor, 1.0f);
    for (int k = 0; k < 32; ++k) expect_rel_near(os.inv_freq[k], theta(1e4, k, 64), 1e-7, "s=1");
}

// ================================================================ Giraffe power basis

TEST_F(RopeModes, GiraffePowerBasisIsOneIndexed) {
    for (double pct : {1.0, 0.25}) {
        for (double kp : {0.5, 0.25, 2.0}) {
            SCOPED_TRACE(std::to_string(pct) + " kp=" + std::to_string(kp));
            const int dr = static_cast<int>(64 * pct);
            OptMap o = {{"scaling", std::string("giraffe_power")}, {"rotary_pct", pct}};
            if (kp != 0.5) o["power"] = kp;
            Instance r(rope(), model_info(4, 64), o);
            ASSERT_EQ(r.status, CTX_OK) << r.message();
            const ctx_rotary_spec sp = r.rotary(64);
            for (int i = 1; i <= dr / 2; ++i) {  // the paper's 1-indexed i
                const double th = std::exp(-(2.0 * (i - 1) / dr) * std::log(1e4));
                const double want = th * std::pow(1.0 - 2.0 * i / dr, kp);
                EXPECT_NEAR(sp.inv_freq[i - 1], want, 1e-7 * th) << "i=" << i;
            }
            EXPECT_EQ(sp.inv_freq[dr / 2 - 1], 0.0f) << "the last pair gets frequency 0";
            EXPECT_EQ(sp.position_scale, 1.0f);
            EXPECT_EQ(sp.attention_factor, 1.0f);
        }
    }
    // Literals, dr = 64, kp = 0.5: i = 1 -> sqrt(31/32); i = 17 -> 10000^(-1/2) * sqrt(30/64).
    Instance r(rope(), model_info(4, 64), {{"scaling", std::string("giraffe_power")}});
    const ctx_rotary_spec sp = r.rotary(64);
    EXPECT_NEAR(sp.inv_freq[0], 0.9842509842514764, 1e-7);
    EXPECT_NEAR(sp.inv_freq[16], 0.01 * std::sqrt(30.0 / 64.0), 1e-9);
    EXPECT_EQ(r.extend(64, 256), CTX_OK);
    EXPECT_TRUE(logged(r, "unchanged"));
    EXPECT_EQ(sp.inv_freq[31], 0.0f);
}

// ================================================================ Giraffe truncated basis

TEST_F(RopeModes, GiraffeTruncatedBasisDefaultsFromL) {
    // L = 2048: b = 2 pi / 2048 = 0.0030679616, a = b/8, rho = b/16 (Giraffe's Table 1 values).
    const double b = 0.0030679615757712823, a = b / 8, rho = b / 16;
    for (double pct : {1.0, 0.25}) {
        SCOPED_TRACE(pct);
        const int dr = static_cast<int>(64 * pct);
        Instance r(rope(), model_info(4, 64, 2048),
                   {{"scaling", std::string("giraffe_truncated")}, {"rotary_pct", pct}});
        ASSERT_EQ(r.status, CTX_OK) << r.message();
        const ctx_rotary_spec sp = r.rotary(2048);
        for (int k = 0; k < dr / 2; ++k) {
            const double th = theta(1e4, k, dr);
            const double want = th >= b ? th : (th > a ? rho : 0.0);
            expect_rel_near(sp.inv_freq[k], want, 1e-7, "k=" + std::to_string(k));
        }
    }
    // dr = 64 by hand: theta_20 = 0.0031623 >= b is kept, theta_21 = 0.0023714 and theta_27 =
    // 0.00042170 lie in (a, b) -> rho, theta_28 = 0.00031623 <= a = 0.00038350 -> 0.
    Instance r(rope(), model_info(4, 64, 2048), {{"scaling", std::string("giraffe_truncated")}});
    const ctx_rotary_spec sp = r.rotary(2048);
    expect_rel_near(sp.inv_freq[20], 0.0031622776601683794, 1e-7, "kept");
    expect_rel_near(sp.inv_freq[21], 0.0030679615757712823 / 16, 1e-7, "rho");
    expect_rel_near(sp.inv_freq[27], 0.0030679615757712823 / 16, 1e-7, "rho");
    for (int k = 28; k < 32; ++k) EXPECT_EQ(sp.inv_freq[k], 0.0f) << k;

    // original_length instead of the model's context; explicit cutoffs.
    Instance l(rope(), model_info(4, 64, 128),
               {{"scaling", std::string("giraffe_truncated")}, {"original_length", int64_t{2048}}});
    EXPECT_EQ(freqs(l.rotary(8)), freqs(sp));
    Instance c(rope(), model_info(4, 64, 2048),
               {{"scaling", std::string("giraffe_truncated")}, {"trunc_a", 0.001}, {"trunc_b", 0.05},
                {"trunc_rho", 0.002}});
    ASSERT_EQ(c.status, CTX_OK) << c.message();
    const ctx_rotary_spec cs = c.rotary(8);
    for (int k = 0; k < 32; ++k) {
        const double th = theta(1e4, k, 64);
        expect_rel_near(cs.inv_freq[k], th >= 0.05 ? th : (th > 0.001 ? 0.002 : 0.0), 1e-7, "custom");
    }
    // Only b given: a and rho keep Giraffe's ratios to it.
    Instance onlyb(rope(), model_info(4, 64, 2048),
                   {{"scaling", std::string("giraffe_truncated")}, {"trunc_b", 0.016}});
    const ctx_rotary_spec ob = onlyb.rotary(8);
    for (int k = 0; k < 32; ++k) {
        const double th = theta(1e4, k, 64);
        expect_rel_near(ob.inv_freq[k], th >= 0.016 ? th : (th > 0.002 ? 0.001 : 0.0), 1e-7, "only b");
    }
}

// ================================================================ xPos

TEST_F(RopeModes, XposAmplitudes) {
    for (double pct : {1.0, 0.25}) {
        for (const char* layout : {"half", "interleaved"}) {
            SCOPED_TRACE(std::to_string(pct) + layout);
            const int dr = static_cast<int>(64 * pct);
            Instance r(rope(), model_info(4, 64),
                       {{"scaling", std::string("xpos")}, {"rotary_pct", pct}, {"layout", std::string(layout)}});
            ASSERT_EQ(r.status, CTX_OK) << r.message();
            const ctx_rotary_spec sp = r.rotary(64);
            ASSERT_NE(sp.amp_base, nullptr);
            EXPECT_EQ(sp.amp_scale_base, 512.0f);
            EXPECT_EQ(sp.position_scale, 1.0f);
            EXPECT_EQ(sp.attention_factor, 1.0f);
            for (int k = 0; k < dr / 2; ++k) {  // 0-indexed: zeta_k = (2k/dr + 0.4) / 1.4
                expect_rel_near(sp.amp_base[k], (2.0 * k / dr + 0.4) / 1.4, 1e-7, "zeta");
                expect_rel_near(sp.inv_freq[k], theta(1e4, k, dr), 1e-7, "theta");
            }
        }
    }
    Instance r(rope(), model_info(4, 64), {{"scaling", std::string("xpos")}});
    const ctx_rotary_spec sp = r.rotary(64);
    EXPECT_NEAR(sp.amp_base[0], 0.2857142857142857, 1e-7);   // 0.4 / 1.4
    EXPECT_NEAR(sp.amp_base[31], 0.9776785714285714, 1e-7);  // (62/64 + 0.4) / 1.4
    EXPECT_TRUE(logged(r, "exceeds float range"));
    Instance c(rope(), model_info(4, 16), {{"scaling", std::string("xpos")}, {"xpos_gamma", 1.0},
                                           {"xpos_scale_base", 128.0}});
    ASSERT_EQ(c.status, CTX_OK) << c.message();
    const ctx_rotary_spec cs = c.rotary(64);
    EXPECT_EQ(cs.amp_scale_base, 128.0f);
    for (int k = 0; k < 8; ++k) expect_rel_near(cs.amp_base[k], (2.0 * k / 16 + 1.0) / 2.0, 1e-7, "g=1");
    EXPECT_EQ(c.extend(64, 512), CTX_OK);
    EXPECT_EQ(c.rotary(512).amp_base[3], cs.amp_base[3]);
}

// ================================================================ extend and state

TEST_F(RopeModes, ExtendPicksTheFactorFromTheLengths) {
    // linear: s = Le / Lt, then again from original_length on a second extension.
    Instance lin(rope(), model_info(4, 64, 1024), {{"scaling", std::string("linear")}});
    ASSERT_EQ(lin.status, CTX_OK) << lin.message();
    EXPECT_EQ(lin.rotary(1024).position_scale, 1.0f);
    ASSERT_EQ(lin.extend(1024, 4096), CTX_OK) << lin.message();
    EXPECT_EQ(lin.rotary(4096).position_scale, 0.25f);
    ASSERT_EQ(lin.extend(4096, 8192), CTX_OK) << lin.message();
    EXPECT_EQ(lin.rotary(8192).position_scale, 0.125f);
    ASSERT_EQ(lin.extend(8192, 3072), CTX_OK) << lin.message();  // 3072 / 1024
    expect_rel_near(lin.rotary(3072).position_scale, 1.0 / 3.0, 1e-7, "s=3");
    EXPECT_EQ(lin.extend(3072, 512), CTX_ERR_INVALID_ARGUMENT);  // s < 1
    EXPECT_TRUE(contains(lin.message(), "512")) << lin.message();
    EXPECT_TRUE(contains(lin.message(), "original_length 1024")) << lin.message();

    // An explicit factor is kept.
    Instance fixed(rope(), model_info(4, 64, 1024), {{"scaling", std::string("linear")}, {"factor", 2.0}});
    ASSERT_EQ(fixed.extend(1024, 8192), CTX_OK);
    EXPECT_EQ(fixed.rotary(8192).position_scale, 0.5f);
    EXPECT_TRUE(logged(fixed, "explicit factor"));

    // ntk and yarn follow s = Le / L; YaRN's ramp keeps L = original_length.
    Instance ntk(rope(), model_info(4, 64, 1024), {{"scaling", std::string("ntk")}});
    ASSERT_EQ(ntk.extend(1024, 4096), CTX_OK);
    const double base2 = 1e4 * std::pow(4.0, 64.0 / 62.0);
    for (int k = 0; k < 32; ++k) expect_rel_near(ntk.rotary(4096).inv_freq[k], theta(base2, k, 64), 1e-6, "ntk");

    Instance yarn(rope(), model_info(4, 64, 2048), {{"scaling", std::string("yarn")}});
    EXPECT_EQ(yarn.rotary(2048).attention_factor, 1.0f);
    ASSERT_EQ(yarn.extend(2048, 8192), CTX_OK);
    const ctx_rotary_spec ys = yarn.rotary(8192);
    EXPECT_NEAR(ys.attention_factor, 1.1386294361119891, 1e-7);
    expect_rel_near(ys.inv_freq[12], 0.015026497703256057, 1e-6, "ramp uses L = 2048");

    // dynamic NTK: s = 2 after extend; rows of 4096 > L = 1024.
    Instance dyn(rope(), model_info(4, 64, 1024), {{"scaling", std::string("dynamic_ntk")}});
    ASSERT_EQ(dyn.extend(1024, 2048), CTX_OK);
    const double db = 1e4 * std::pow(2.0 * 4096 / 1024 - 1, 64.0 / 62.0);
    for (int k = 0; k < 32; ++k) expect_rel_near(dyn.rotary(4096).inv_freq[k], theta(db, k, 64), 1e-6, "dyn");
}

TEST_F(RopeModes, StateRoundTripRestoresFactorAndOriginalLength) {
    Instance lin(rope(), model_info(4, 64, 1024), {{"scaling", std::string("linear")}});
    ASSERT_EQ(lin.extend(1024, 4096), CTX_OK);
    const std::vector<uint8_t> state = save(lin);
    EXPECT_EQ(state.size(), 32u);
    // A checkpoint re-creates the plugin at the extended context (4096) and then loads the state.
    Instance back(rope(), model_info(4, 64, 4096), {{"scaling", std::string("linear")}});
    EXPECT_EQ(back.rotary(4096).position_scale, 1.0f);
    std::string msg;
    ASSERT_EQ(load(back, state, &msg), CTX_OK) << msg;
    EXPECT_EQ(back.rotary(4096).position_scale, 0.25f);
    EXPECT_EQ(save(back), state);
    ASSERT_EQ(back.extend(4096, 8192), CTX_OK);  // L is still 1024
    EXPECT_EQ(back.rotary(8192).position_scale, 0.125f);

    // YaRN: the frequencies after load equal the saved instance's.
    Instance y(rope(), model_info(4, 64, 2048), {{"scaling", std::string("yarn")}, {"rotary_pct", 0.25}});
    ASSERT_EQ(y.extend(2048, 16384), CTX_OK);
    Instance y2(rope(), model_info(4, 64, 16384), {{"scaling", std::string("yarn")}, {"rotary_pct", 0.25}});
    ASSERT_EQ(load(y2, save(y)), CTX_OK);
    EXPECT_EQ(freqs(y2.rotary(16384)), freqs(y.rotary(16384)));
    EXPECT_EQ(y2.rotary(1).attention_factor, y.rotary(1).attention_factor);

    // Truncated: default cutoffs follow the restored L.
    Instance t(rope(), model_info(4, 64, 2048), {{"scaling", std::string("giraffe_truncated")}});
    Instance t2(rope(), model_info(4, 64, 8192), {{"scaling", std::string("giraffe_truncated")}});
    EXPECT_NE(freqs(t2.rotary(8)), freqs(t.rotary(8)));
    ASSERT_EQ(load(t2, save(t)), CTX_OK);
    EXPECT_EQ(freqs(t2.rotary(8)), freqs(t.rotary(8)));

    // An empty state (rope 1.0 checkpoints) changes nothing.
    Instance e(rope(), model_info(4, 64, 1024), {{"scaling", std::string("linear")}, {"factor", 2.0}});
    ctx_err err{};
    EXPECT_EQ(e.vt->load_state(e.inst, nullptr, 0, &err), CTX_OK) << err.message;
    EXPECT_EQ(e.rotary(8).position_scale, 0.5f);
}

TEST_F(RopeModes, LoadStateRejectsBadStates) {
    Instance lin(rope(), model_info(4, 64, 1024), {{"scaling", std::string("linear")}, {"factor", 2.0}});
    const std::vector<uint8_t> good = save(lin);
    std::string msg;
    auto expect_bad = [&](std::vector<uint8_t> s, const std::vector<std::string>& parts) {
        EXPECT_EQ(load(lin, s, &msg), CTX_ERR_INVALID_ARGUMENT);
        for (const auto& p : parts) EXPECT_TRUE(contains(msg, p)) << msg;
        EXPECT_EQ(lin.rotary(8).position_scale, 0.5f) << "a rejected state changes nothing";
    };
    expect_bad(std::vector<uint8_t>(good.begin(), good.begin() + 20), {"32 bytes"});
    std::vector<uint8_t> s = good;
    s[0] ^= 0xff;
    expect_bad(s, {"magic"});
    s = good;
    s[4] = 9;  // version 9
    expect_bad(s, {"version 9"});
    Instance ntk(rope(), model_info(4, 64, 1024), {{"scaling", std::string("ntk")}});
    expect_bad(save(ntk), {"scaling = ntk", "scaling = linear"});
    s = good;
    const double half = 0.5;
    std::memcpy(s.data() + 16, &half, 8);
    expect_bad(s, {"'factor'", "0.5"});
    s = good;
    const int64_t zero = 0;
    std::memcpy(s.data() + 24, &zero, 8);
    expect_bad(s, {"'original_length'", "0"});
}

// ================================================================ option errors

TEST_F(RopeModes, RejectsBadValuesNamingTheOption) {
    struct Case {
        OptMap opts;
        std::vector<std::string> expect;
        int head_dim = 64;
    };
    const std::string lin = "linear", yarn = "yarn", trunc = "giraffe_truncated", xpos = "xpos";
    const std::vector<Case> cases = {
        {{{"scaling", std::string("cubic")}}, {"'scaling'", "\"cubic\"", "giraffe_truncated"}},
        {{{"scaling", std::string("")}}, {"'scaling'", "\"\""}},
        {{{"scaling", lin}, {"factor", 0.5}}, {"'factor'", ">= 1", "0.5"}},
        {{{"scaling", std::string("ntk")}, {"factor", -2.0}}, {"'factor'", "-2"}},
        {{{"scaling", yarn}, {"factor", std::nan("")}}, {"'factor'", "nan"}},
        {{{"scaling", std::string("dynamic_ntk")}, {"factor", HUGE_VAL}}, {"'factor'", "inf"}},
        {{{"scaling", lin}, {"original_length", int64_t{0}}}, {"'original_length'", "got 0"}},
        {{{"scaling", trunc}, {"original_length", int64_t{-5}}}, {"'original_length'", "-5"}},
        {{{"scaling", std::string("giraffe_power")}, {"power", 0.0}}, {"'power'", "got 0"}},
        {{{"scaling", std::string("giraffe_power")}, {"power", -1.0}}, {"'power'", "-1"}},
        {{{"scaling", trunc}, {"trunc_a", -0.001}}, {"'trunc_a'", "-0.001"}},
        {{{"scaling", trunc}, {"trunc_b", 0.0}}, {"'trunc_b'", "got 0"}},
        {{{"scaling", trunc}, {"trunc_rho", -1.0}}, {"'trunc_rho'", "-1"}},
        {{{"scaling", trunc}, {"trunc_a", 0.01}, {"trunc_b", 0.001}},
         {"a < b", "'trunc_a' = 0.01", "'trunc_b' = 0.001"}},
        {{{"scaling", trunc}, {"trunc_a", 0.5}}, {"a < b", "'trunc_a' = 0.5"}},  // default b 0.0031
        {{{"scaling", yarn}, {"yarn_alpha", -1.0}}, {"'yarn_alpha'", "-1"}},
        {{{"scaling", yarn}, {"yarn_beta", 0.0}}, {"'yarn_beta'", "got 0"}},
        {{{"scaling", yarn}, {"yarn_alpha", 40.0}}, {"yarn_alpha < yarn_beta", "40", "32"}},
        {{{"scaling", xpos}, {"xpos_gamma", 0.0}}, {"'xpos_gamma'", "got 0"}},
        {{{"scaling", xpos}, {"xpos_gamma", -0.4}}, {"'xpos_gamma'", "-0.4"}},
        {{{"scaling", xpos}, {"xpos_scale_base", 0.0}}, {"'xpos_scale_base'", "got 0"}},
        {{{"scaling", xpos}, {"xpos_scale_base", std::nan("")}}, {"'xpos_scale_base'", "nan"}},
        {{{"scaling", std::string("ntk")}, {"rotary_pct", 0.04}}, {"ntk", "at least 4 rotary dims", "got 2"}},
        {{{"scaling", std::string("dynamic_ntk")}}, {"dynamic_ntk", "at least 4 rotary dims"}, 2},
        {{{"scaling", xpos}, {"layout", std::string("neox")}}, {"'layout'", "\"neox\""}},
    };
    for (const auto& c : cases) {
        Instance r(rope(), model_info(2, c.head_dim, 2048), c.opts);
        EXPECT_EQ(r.status, CTX_ERR_INVALID_ARGUMENT) << c.expect[0];
        for (const auto& e : c.expect) EXPECT_TRUE(contains(r.message(), e)) << r.message();
    }
}

TEST_F(RopeModes, RejectsOptionsOfAnotherScaling) {
    struct Case {
        std::string scaling;
        std::string option;
        OptValue value;
        std::string modes;
    };
    const std::string factor_modes = "linear, ntk, dynamic_ntk, yarn, hf_yarn, llama3 or longrope";
    const std::string length_modes =
        "linear, ntk, dynamic_ntk, yarn, giraffe_truncated, hf_yarn, llama3 or longrope";
    const std::vector<Case> cases = {
        {"none", "factor", 2.0, factor_modes},
        {"giraffe_power", "factor", 2.0, factor_modes},
        {"xpos", "original_length", int64_t{512}, length_modes},
        {"none", "original_length", int64_t{512}, length_modes},
        {"linear", "power", 0.5, "giraffe_power"},
        {"yarn", "trunc_a", 0.1, "giraffe_truncated"},
        {"none", "trunc_b", 0.1, "giraffe_truncated"},
        {"giraffe_power", "trunc_rho", 0.1, "giraffe_truncated"},
        {"linear", "yarn_alpha", 1.0, "yarn"},
        {"ntk", "yarn_beta", 32.0, "yarn"},
        {"none", "xpos_gamma", 0.4, "xpos"},
        {"giraffe_truncated", "xpos_scale_base", 512.0, "xpos"},
        {"yarn", "yarn_beta_fast", 32.0, "hf_yarn"},
        {"llama3", "mscale", 1.0, "hf_yarn"},
        {"none", "attention_factor", 1.2, "hf_yarn or longrope"},
        {"hf_yarn", "low_freq_factor", 1.0, "llama3"},
        {"linear", "short_factor", std::vector<double>{1.0}, "longrope"},
    };
    for (const auto& c : cases) {
        SCOPED_TRACE(c.scaling + " " + c.option);
        Instance r(rope(), model_info(2, 64, 2048), {{"scaling", c.scaling}, {c.option, c.value}});
        EXPECT_EQ(r.status, CTX_ERR_INVALID_ARGUMENT);
        EXPECT_TRUE(contains(r.message(), "option '" + c.option + "' applies only to scaling = " + c.modes))
            << r.message();
        EXPECT_TRUE(contains(r.message(), "not scaling = " + c.scaling)) << r.message();
    }
    // Not set: the default "none" with no scaling option at all is fine, so is every mode alone.
    for (const char* m : {"none", "linear", "ntk", "dynamic_ntk", "yarn", "giraffe_power",
                          "giraffe_truncated", "xpos", "hf_yarn", "llama3"}) {
        Instance r(rope(), model_info(2, 64, 2048), {{"scaling", std::string(m)}});
        EXPECT_EQ(r.status, CTX_OK) << m << ": " << r.message();
    }
}
