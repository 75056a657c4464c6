// pe/rope's HF transformers rope types (METHODS.md 5.1): hf_yarn, llama3, longrope, through the C
// ABI with the fake host of fake_plugin_host.h. Two independent references: the formulas of
// METHODS 5.1 evaluated here in double, and the values transformers 4.49.0's rope init functions
// (ROPE_INIT_FUNCTIONS in modeling_rope_utils.py, float32) printed for the same configs, quoted
// below with the config that produced them.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "fake_plugin_host.h"
#include "plugin/registry.h"

namespace {

using namespace ctx::test_host;

class RopeHf : public ::testing::Test {
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
ctx::PluginRegistry* RopeHf::registry_ = nullptr;

const double kPi = 3.14159265358979323846;

double theta(double base, int k, int dr) { return std::pow(base, -2.0 * k / dr); }

void expect_freqs(const ctx_rotary_spec& s, const std::vector<double>& want, double rel,
                  const std::string& what) {
    ASSERT_EQ(s.rotary_dims / 2, static_cast<int>(want.size())) << what;
    for (size_t k = 0; k < want.size(); ++k)
        expect_rel_near(s.inv_freq[k], want[k], rel, what + " k=" + std::to_string(k));
}

// METHODS 5.1 hf_yarn: correction dims from beta_fast / beta_slow, floor / ceil, clamped; a
// linear ramp over the pair index from extrapolation (theta) to interpolation (theta / s).
std::vector<double> yarn_reference(double base, int dr, double s, double L0, double fast,
                                   double slow) {
    auto dim = [&](double rot) { return dr * std::log(L0 / (rot * 2 * kPi)) / (2 * std::log(base)); };
    double lo = std::max(std::floor(dim(fast)), 0.0), hi = std::min(std::ceil(dim(slow)), dr - 1.0);
    if (lo == hi) hi += 0.001;
    std::vector<double> out;
    for (int k = 0; k < dr / 2; ++k) {
        const double ramp = std::clamp((k - lo) / (hi - lo), 0.0, 1.0), th = theta(base, k, dr);
        out.push_back(th / s * ramp + th * (1 - ramp));
    }
    return out;
}

}  // namespace

// transformers 4.49.0, LlamaConfig(hidden_size=256, num_attention_heads=4, rope_theta=1e4,
// max_position_embeddings=2048, rope_scaling={"rope_type": "yarn", "factor": 4.0}):
// attention factor 1.1386294361119891 and these 32 frequencies.
TEST_F(RopeHf, YarnMatchesTransformers) {
    Instance r(rope(), model_info(4, 64, 2048),
               {{"scaling", std::string("hf_yarn")}, {"factor", 4.0},
                {"original_length", int64_t{2048}}});
    ASSERT_EQ(r.status, CTX_OK) << r.message();
    const ctx_rotary_spec s = r.rotary(4096);
    EXPECT_NEAR(s.attention_factor, 1.1386294361119891, 1e-7);
    EXPECT_EQ(s.position_scale, 1.0f);
    expect_freqs(s, {1, 0.749894202, 0.562341332, 0.421696514, 0.316227764, 0.237137362,
                     0.177827939, 0.133352146, 0.100000001, 0.070663102, 0.0497455746,
                     0.0348710567, 0.0243252143, 0.0168732349, 0.0116272122, 0.00794983935,
                     0.00538461516, 0.00360526075, 0.00237913639, 0.00154081406, 0.000973008573,
                     0.000592843455, 0.000444569858, 0.000333380362, 0.000250000012,
                     0.000187473546, 0.000140585325, 0.000105424122, 7.90569466e-05,
                     5.92843462e-05, 4.44569851e-05, 3.33380376e-05},
                 2e-6, "transformers");
    expect_freqs(s, yarn_reference(1e4, 64, 4, 2048, 32, 1), 1e-6, "formula");

    // ... rope_scaling with "beta_fast": 16, "beta_slow": 2, "attention_factor": 1.25: k 9 .. 18
    // of the ramp move (the rest as above).
    Instance c(rope(), model_info(4, 64, 2048),
               {{"scaling", std::string("hf_yarn")}, {"factor", 4.0}, {"yarn_beta_fast", 16.0},
                {"yarn_beta_slow", 2.0}, {"attention_factor", 1.25}});
    ASSERT_EQ(c.status, CTX_OK) << c.message();
    const ctx_rotary_spec cs = c.rotary(100);
    EXPECT_EQ(cs.attention_factor, 1.25f);
    const double hf[] = {0.0749894157, 0.0562341288, 0.0382162444, 0.025693506, 0.0170442481,
                         0.0111142462, 0.00708433334, 0.00437500002, 0.00257776142, 0.00140585331};
    for (int k = 9; k <= 18; ++k) expect_rel_near(cs.inv_freq[k], hf[k - 9], 2e-6, "custom");
    expect_freqs(cs, yarn_reference(1e4, 64, 4, 2048, 16, 2), 1e-6, "custom formula");
}

// The paper's yarn (ramp over the frequency ratio) and transformers' (over the index) are
// different functions on the same options: pe/rope keeps both, by name.
TEST_F(RopeHf, YarnFormsDifferAndPartialRotaryUsesTheRotaryDims) {
    Instance paper(rope(), model_info(4, 64, 2048), {{"scaling", std::string("yarn")}, {"factor", 4.0}});
    Instance hf(rope(), model_info(4, 64, 2048), {{"scaling", std::string("hf_yarn")}, {"factor", 4.0}});
    const ctx_rotary_spec a = paper.rotary(10), b = hf.rotary(10);
    double most = 0;
    for (int k = 0; k < 32; ++k)
        most = std::max(most, std::fabs(double(a.inv_freq[k]) - b.inv_freq[k]) / b.inv_freq[k]);
    EXPECT_GT(most, 0.05);
    // rotary_pct 0.25 (GPT-NeoX): dr = 16 in the correction dims, as transformers'
    // partial_rotary_factor; mscale / mscale_all_dim give the attention factor.
    Instance p(rope(), model_info(4, 64, 512),
               {{"scaling", std::string("hf_yarn")}, {"factor", 8.0}, {"rotary_pct", 0.25},
                {"mscale", 0.707}, {"mscale_all_dim", 1.0}, {"base", 500.0}});
    ASSERT_EQ(p.status, CTX_OK) << p.message();
    const ctx_rotary_spec s = p.rotary(10);
    expect_freqs(s, yarn_reference(500, 16, 8, 512, 32, 1), 1e-6, "partial");
    EXPECT_NEAR(s.attention_factor, (0.1 * 0.707 * std::log(8.0) + 1) / (0.1 * std::log(8.0) + 1),
                1e-7);
}

// transformers 4.49.0, LlamaConfig(hidden_size=256, num_attention_heads=4, rope_theta=5e5,
// rope_scaling={"rope_type": "llama3", "factor": 8, "low_freq_factor": 1, "high_freq_factor": 4,
// "original_max_position_embeddings": 8192}) (Llama 3.1's values).
TEST_F(RopeHf, Llama3MatchesTransformersAndItsBands) {
    Instance r(rope(), model_info(4, 64, 131072),
               {{"scaling", std::string("llama3")}, {"factor", 8.0}, {"base", 500000.0},
                {"original_length", int64_t{8192}}, {"low_freq_factor", 1.0},
                {"high_freq_factor", 4.0}});
    ASSERT_EQ(r.status, CTX_OK) << r.message();
    const ctx_rotary_spec s = r.rotary(1);
    EXPECT_EQ(s.attention_factor, 1.0f);
    expect_freqs(s, {1, 0.663601279, 0.440366626, 0.292227834, 0.193922758, 0.128687382,
                     0.0853971019, 0.0566696189, 0.0376060307, 0.0249554086, 0.0165604409,
                     0.0109895291, 0.00729266508, 0.00483942125, 0.00321144611, 0.00137189368,
                     0.000524846022, 0.000178507791, 7.78465546e-05, 5.16590699e-05,
                     3.42810235e-05, 2.2748929e-05, 1.50962178e-05, 1.00178686e-05,
                     6.64786967e-06, 4.41153452e-06, 2.92749974e-06, 1.94269251e-06,
                     1.28917316e-06, 8.55496921e-07, 5.6770881e-07, 3.7673226e-07},
                 2e-6, "transformers");
    int kept = 0, mixed = 0, scaled = 0;
    for (int k = 0; k < 32; ++k) {
        const double th = theta(5e5, k, 64), wl = 2 * kPi / th;
        double want;
        if (wl < 8192.0 / 4) {
            want = th, ++kept;
        } else if (wl > 8192.0 / 1) {
            want = th / 8, ++scaled;
        } else {
            const double sm = (8192 / wl - 1) / (4 - 1);
            want = (1 - sm) * th / 8 + sm * th, ++mixed;
        }
        expect_rel_near(s.inv_freq[k], want, 1e-7, "band formula");
    }
    EXPECT_EQ(kept, 15);
    EXPECT_EQ(mixed, 3);
    EXPECT_EQ(scaled, 14);
}

// transformers 4.49.0, LlamaConfig(hidden_size=32, num_attention_heads=4, rope_theta=1e4,
// max_position_embeddings=4096, rope_scaling={"rope_type": "longrope", "short_factor":
// [1, 1.1, 1.3, 1.6], "long_factor": [1, 2, 4, 8]}) with original_max_position_embeddings = 1024:
// seq_len 512 -> short, 2048 -> long; attention factor sqrt(1 + ln 4 / ln 1024) = 1.0954451150.
TEST_F(RopeHf, LongropeSwitchesFactorsByRowLength) {
    const std::vector<double> shortf{1, 1.1, 1.3, 1.6}, longf{1, 2, 4, 8};
    Instance r(rope(), model_info(4, 8, 4096),
               {{"scaling", std::string("longrope")}, {"factor", 4.0},
                {"original_length", int64_t{1024}}, {"short_factor", shortf},
                {"long_factor", longf}});
    ASSERT_EQ(r.status, CTX_OK) << r.message();
    const ctx_rotary_spec a = r.rotary(512);
    EXPECT_NEAR(a.attention_factor, 1.0954451150103321, 1e-7);
    expect_freqs(a, {1, 0.0909090936, 0.0076923077, 0.000624999986}, 2e-7, "short");
    const ctx_rotary_spec b = r.rotary(2048);
    expect_freqs(b, {1, 0.0500000007, 0.00249999994, 0.000125000006}, 2e-7, "long");
    expect_freqs(r.rotary(1024), {1, 0.1 / 1.1, 0.01 / 1.3, 0.001 / 1.6}, 1e-7, "<= L0: short");
    // extend() has no factor lists to invent: the frequencies stay, and it says so.
    ASSERT_EQ(r.extend(4096, 8192), CTX_OK) << r.message();
    expect_freqs(r.rotary(2048), {1, 0.05, 0.0025, 0.000125}, 1e-7, "after extend");
    // factor 1 (no top-level original length in the config): attention factor 1.
    Instance one(rope(), model_info(4, 8, 1024),
                 {{"scaling", std::string("longrope")}, {"short_factor", shortf},
                  {"long_factor", longf}});
    ASSERT_EQ(one.status, CTX_OK) << one.message();
    EXPECT_EQ(one.rotary(10).attention_factor, 1.0f);
}

TEST_F(RopeHf, ExtendPicksTheFactorForHfYarnAndLlama3) {
    for (const char* mode : {"hf_yarn", "llama3"}) {
        SCOPED_TRACE(mode);
        Instance r(rope(), model_info(4, 64, 2048), {{"scaling", std::string(mode)}});
        ASSERT_EQ(r.status, CTX_OK) << r.message();
        ASSERT_EQ(r.extend(2048, 8192), CTX_OK) << r.message();
        Instance want(rope(), model_info(4, 64, 2048),
                      {{"scaling", std::string(mode)}, {"factor", 4.0}});
        const ctx_rotary_spec a = r.rotary(10), b = want.rotary(10);
        for (int k = 0; k < 32; ++k) EXPECT_EQ(a.inv_freq[k], b.inv_freq[k]) << k;
        EXPECT_EQ(a.attention_factor, b.attention_factor);
    }
}

TEST_F(RopeHf, BadOptionsAreRefusedNamingThem) {
    struct Case {
        OptMap options;
        std::string says;
    };
    const std::vector<Case> cases = {
        {{{"scaling", std::string("longrope")}, {"long_factor", std::vector<double>{1, 2}}},
         "scaling = longrope needs option 'short_factor' (a list of 32 factors"},
        {{{"scaling", std::string("longrope")}, {"short_factor", std::vector<double>(32, 1.0)},
          {"long_factor", std::vector<double>{1, 2}}},
         "option 'long_factor' has 2 factors; the rotary dims give 32 pairs"},
        {{{"scaling", std::string("longrope")}, {"short_factor", std::vector<double>(32, 1.0)},
          {"long_factor", std::vector<double>(32, -1.0)}},
         "option 'long_factor': factor 1 must be a finite number > 0, got -1"},
        {{{"scaling", std::string("llama3")}, {"low_freq_factor", 4.0}, {"high_freq_factor", 1.0}},
         "requires low_freq_factor < high_freq_factor, got 4 and 1"},
        {{{"scaling", std::string("hf_yarn")}, {"yarn_beta_fast", 0.0}},
         "option 'yarn_beta_fast' must be a finite number > 0, got 0"},
        {{{"scaling", std::string("hf_yarn")}, {"attention_factor", -1.0}},
         "option 'attention_factor' must be a finite number > 0, got -1"},
        {{{"scaling", std::string("hf_yarn")}, {"factor", 0.5}},
         "'factor' must be a finite number >= 1, got 0.5"},
    };
    for (const Case& c : cases) {
        Instance r(rope(), model_info(4, 64, 2048), c.options);
        EXPECT_EQ(r.status, CTX_ERR_INVALID_ARGUMENT) << c.says;
        EXPECT_TRUE(contains(r.message(), c.says)) << r.message();
    }
}
