// The real PE plugins (plugins/pe/*), loaded through the registry and driven through the C ABI with
// the fake host of fake_plugin_host.h, checked against METHODS.md 1.1 (learned + interpolation),
// 1.3 (RoPE) and 1.4 (ALiBi). Every expected value is computed here, independently, in double
// precision.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <variant>
#include <vector>

#include "fake_plugin_host.h"
#include "plugin/registry.h"

namespace {

using namespace ctx::test_host;  // FakeHost, Instance, model_info, ... (fake_plugin_host.h)

// Loads the three real PE plugins once for the whole test program.
class PePlugins : public ::testing::Test {
protected:
    static void SetUpTestSuite() {
        registry_ = new ctx::PluginRegistry();
        for (const char* name : {"learned", "rope", "alibi"})
            registry_->load_file(std::string(CTX_TEST_BINARY_DIR) + "/plugins/pe/pe_" + name + ".so");
    }
    static void TearDownTestSuite() {
        delete registry_;
        registry_ = nullptr;
    }
    static const ctx::LoadedPlugin& lib(const char* full_name) { return registry_->get(full_name); }
    static ctx::PluginRegistry* registry_;
};
ctx::PluginRegistry* PePlugins::registry_ = nullptr;

void check_descriptor(const ctx::LoadedPlugin& p, const char* name, uint32_t hooks) {
    const ctx_plugin_descriptor* d = p.descriptor;
    EXPECT_EQ(d->abi_major, static_cast<uint32_t>(CTX_PLUGIN_ABI_MAJOR));
    EXPECT_EQ(d->abi_minor, static_cast<uint32_t>(CTX_PLUGIN_ABI_MINOR));
    EXPECT_EQ(d->struct_size, sizeof(ctx_plugin_descriptor));
    EXPECT_EQ(d->kind, CTX_PLUGIN_PE);
    EXPECT_STREQ(d->name, name);
    EXPECT_STREQ(d->version, "1.0.0");
    ASSERT_NE(d->description, nullptr);
    EXPECT_GT(std::strlen(d->description), 10u);
    const auto* vt = static_cast<const ctx_pe_vtable*>(d->vtable);
    EXPECT_EQ(vt->struct_size, sizeof(ctx_pe_vtable));
    EXPECT_EQ(vt->hooks, hooks);
}

const ctx_option_desc* option(const ctx::LoadedPlugin& p, const char* name) {
    for (int32_t i = 0; i < p.descriptor->n_options; ++i)
        if (std::strcmp(p.descriptor->options[i].name, name) == 0) return &p.descriptor->options[i];
    return nullptr;
}

}  // namespace

// ================================================================ pe/rope (METHODS.md 1.3)

// theta_k = base^(-2k/dr), written as exp(-(2k/dr) ln base) so it is not the plugin's expression.
double rope_theta(double base, int k, int dr) {
    return std::exp(-(2.0 * k / dr) * std::log(base));
}

TEST_F(PePlugins, RopeDescriptor) {
    const auto& p = lib("pe/rope");
    check_descriptor(p, "rope", CTX_PE_HOOK_ROTARY);
    ASSERT_EQ(p.descriptor->n_options, 23);  // base, rotary_pct, layout + scaling options
    const ctx_option_desc* base = option(p, "base");
    const ctx_option_desc* pct = option(p, "rotary_pct");
    const ctx_option_desc* layout = option(p, "layout");
    ASSERT_TRUE(base && pct && layout);
    EXPECT_EQ(base->type, CTX_OPT_NUMBER);
    EXPECT_EQ(pct->type, CTX_OPT_NUMBER);
    EXPECT_EQ(layout->type, CTX_OPT_STRING);
    EXPECT_STREQ(base->default_value, "10000");
    EXPECT_STREQ(layout->default_value, "half");
}

TEST_F(PePlugins, RopeDefaults) {
    Instance r(lib("pe/rope"), model_info(12, 64), {});
    ASSERT_EQ(r.status, CTX_OK) << r.message();
    EXPECT_TRUE(r.host.params.empty()) << "plain RoPE has no parameters";
    const ctx_rotary_spec s = r.rotary(1024);
    EXPECT_EQ(s.rotary_dims, 64);  // rotary_pct 1.0
    EXPECT_EQ(s.layout, CTX_ROTARY_HALF);
    ASSERT_NE(s.inv_freq, nullptr);
    for (int k = 0; k < 32; ++k)
        expect_rel_near(s.inv_freq[k], rope_theta(10000.0, k, 64), 1e-7, "theta_" + std::to_string(k));
    // Literal values: theta_0 = 1, theta_1 = 10000^(-1/32), theta_31 = 10000^(-62/64).
    EXPECT_EQ(s.inv_freq[0], 1.0f);
    EXPECT_NEAR(s.inv_freq[1], 0.7498942093324559, 1e-7);
    EXPECT_NEAR(s.inv_freq[31], 1.333521432163324e-4, 1e-11);
    EXPECT_EQ(s.position_scale, 1.0f);
    EXPECT_EQ(s.attention_factor, 1.0f);
    EXPECT_EQ(s.amp_base, nullptr);
}

TEST_F(PePlugins, RopeNonDefaultBaseAndQuarterRotary) {
    // GPT-NeoX/Pythia style: rotary_pct 0.25 of head_dim 64 -> 16 rotary dims.
    Instance r(lib("pe/rope"), model_info(8, 64),
               {{"base", 500000.0}, {"rotary_pct", 0.25}, {"layout", std::string("half")}});
    ASSERT_EQ(r.status, CTX_OK) << r.message();
    const ctx_rotary_spec s = r.rotary(2048);
    EXPECT_EQ(s.rotary_dims, 16);
    for (int k = 0; k < 8; ++k)
        expect_rel_near(s.inv_freq[k], rope_theta(500000.0, k, 16), 1e-7, "theta_" + std::to_string(k));
    // theta_4 = 500000^(-1/2)
    expect_rel_near(s.inv_freq[4], 1.0 / std::sqrt(500000.0), 1e-7, "theta_4");
}

TEST_F(PePlugins, RopeIntegerBaseOption) {
    // A Lua integer for a number option is accepted by the host and read through opt_number.
    Instance r(lib("pe/rope"), model_info(4, 32), {{"base", int64_t{1000}}});
    ASSERT_EQ(r.status, CTX_OK) << r.message();
    const ctx_rotary_spec s = r.rotary(16);
    EXPECT_EQ(s.rotary_dims, 32);
    for (int k = 0; k < 16; ++k) expect_rel_near(s.inv_freq[k], rope_theta(1000.0, k, 32), 1e-7, "theta");
}

TEST_F(PePlugins, RopeRotaryDimsRoundDownToEven) {
    struct Case {
        double pct;
        int head_dim, dims;
    };
    // floor(pct * dh), then down to even: 0.3 * 64 = 19.2 -> 19 -> 18; 0.5 * 6 = 3 -> 2.
    for (const Case& c : {Case{1.0, 64, 64}, Case{0.25, 64, 16}, Case{0.3, 64, 18},
                          Case{0.5, 6, 2}, Case{0.5, 64, 32}, Case{1.0, 10, 10}}) {
        SCOPED_TRACE(c.pct);
        Instance r(lib("pe/rope"), model_info(2, c.head_dim), {{"rotary_pct", c.pct}});
        ASSERT_EQ(r.status, CTX_OK) << r.message();
        const ctx_rotary_spec s = r.rotary(8);
        EXPECT_EQ(s.rotary_dims, c.dims);
        for (int k = 0; k < c.dims / 2; ++k)
            expect_rel_near(s.inv_freq[k], rope_theta(10000.0, k, c.dims), 1e-7, "theta");
    }
}

TEST_F(PePlugins, RopeLayouts) {
    Instance half(lib("pe/rope"), model_info(2, 64), {{"layout", std::string("half")}});
    Instance inter(lib("pe/rope"), model_info(2, 64), {{"layout", std::string("interleaved")}});
    ASSERT_EQ(half.status, CTX_OK) << half.message();
    ASSERT_EQ(inter.status, CTX_OK) << inter.message();
    EXPECT_EQ(half.rotary(8).layout, CTX_ROTARY_HALF);
    const ctx_rotary_spec s = inter.rotary(8);
    EXPECT_EQ(s.layout, CTX_ROTARY_INTERLEAVED);
    // The layout only changes the pairing, not the frequencies.
    for (int k = 0; k < 32; ++k) EXPECT_EQ(s.inv_freq[k], half.rotary(8).inv_freq[k]);
}

TEST_F(PePlugins, RopeRejectsBadOptionsNamingThem) {
    struct Case {
        OptMap opts;
        std::vector<std::string> expect;
    };
    const std::vector<Case> cases = {
        {{{"base", 0.0}}, {"'base'", "got 0"}},
        {{{"base", -5.0}}, {"'base'", "-5"}},
        {{{"base", std::nan("")}}, {"'base'", "nan"}},
        {{{"rotary_pct", 0.0}}, {"'rotary_pct'", "got 0"}},
        {{{"rotary_pct", 1.5}}, {"'rotary_pct'", "1.5"}},
        {{{"rotary_pct", -0.25}}, {"'rotary_pct'", "-0.25"}},
        {{{"rotary_pct", 0.01}}, {"'rotary_pct'", "0.01", "0 rotary dims"}},  // 0.64 -> 0
        {{{"layout", std::string("neox")}}, {"'layout'", "\"neox\"", "half", "interleaved"}},
        {{{"layout", std::string("")}}, {"'layout'", "\"\""}},
    };
    for (const auto& c : cases) {
        Instance r(lib("pe/rope"), model_info(2, 64), c.opts);
        EXPECT_EQ(r.status, CTX_ERR_INVALID_ARGUMENT);
        for (const auto& e : c.expect) EXPECT_TRUE(contains(r.message(), e)) << r.message();
    }
}

TEST_F(PePlugins, RopeSpecDoesNotDependOnLengthAndExtendChangesNothing) {
    Instance r(lib("pe/rope"), model_info(4, 64, 1024), {{"rotary_pct", 0.5}});
    ASSERT_EQ(r.status, CTX_OK) << r.message();
    const std::vector<float> before(r.rotary(1).inv_freq, r.rotary(1).inv_freq + 16);
    for (int64_t len : {int64_t{1}, int64_t{1024}, int64_t{1} << 20}) {
        const ctx_rotary_spec s = r.rotary(len);
        EXPECT_EQ(s.rotary_dims, 32);
        for (int k = 0; k < 16; ++k) EXPECT_EQ(s.inv_freq[k], before[k]);
    }
    EXPECT_EQ(r.extend(1024, 4096), CTX_OK) << r.message();
    EXPECT_TRUE(r.host.params.empty());
    bool logged = false;
    for (const auto& [level, msg] : r.host.logs)
        if (level == CTX_LOG_INFO && contains(msg, "unchanged")) logged = true;
    EXPECT_TRUE(logged) << "extend should say at info level that plain RoPE is unchanged";
    const ctx_rotary_spec s = r.rotary(4096);
    EXPECT_EQ(s.position_scale, 1.0f);
    EXPECT_EQ(s.attention_factor, 1.0f);
    for (int k = 0; k < 16; ++k) EXPECT_EQ(s.inv_freq[k], before[k]);
}

// ================================================================ pe/alibi (METHODS.md 1.4)

// BLOOM's build_alibi_tensor / the ALiBi reference get_slopes, transcribed: base
// 2^(-(2^-(log2(c) - 3))) raised to 1..c, then extra_base (for 2c) raised to 1, 3, 5, ...
std::vector<double> alibi_reference(int n) {
    const int c = 1 << static_cast<int>(std::floor(std::log2(n)));
    std::vector<double> out;
    const double base = std::pow(2.0, -std::pow(2.0, -(std::log2(c) - 3)));
    double m = 1.0;
    for (int h = 1; h <= c; ++h) out.push_back(m *= base);
    if (c != n) {
        const double extra = std::pow(2.0, -std::pow(2.0, -(std::log2(2 * c) - 3)));
        for (int p = 1; p < 2 * (n - c); p += 2) out.push_back(std::pow(extra, p));
    }
    return out;
}

std::vector<float> alibi_slopes(const ctx::LoadedPlugin& lib, int n_head) {
    Instance a(lib, model_info(n_head, 16), {});
    EXPECT_EQ(a.status, CTX_OK) << a.message();
    if (a.status != CTX_OK) return {};
    const ctx_bias_spec s = a.bias(128);
    EXPECT_EQ(s.kind, CTX_BIAS_LINEAR);
    EXPECT_NE(s.slopes, nullptr);
    return std::vector<float>(s.slopes, s.slopes + n_head);
}

TEST_F(PePlugins, AlibiDescriptor) {
    check_descriptor(lib("pe/alibi"), "alibi", CTX_PE_HOOK_BIAS);
}

TEST_F(PePlugins, AlibiSlopesMatchTheReference) {
    for (int n : {1, 2, 3, 5, 6, 8, 12, 16, 20, 24, 32, 40, 64, 96}) {
        SCOPED_TRACE(n);
        const auto got = alibi_slopes(lib("pe/alibi"), n);
        const auto want = alibi_reference(n);
        ASSERT_EQ(got.size(), want.size());
        for (int h = 0; h < n; ++h) expect_rel_near(got[h], want[h], 1e-7, "slope " + std::to_string(h));
    }
}

TEST_F(PePlugins, AlibiSlopesLiteral) {
    // 8 heads: 1/2, 1/4, ..., 1/256 (exact in float).
    const auto s8 = alibi_slopes(lib("pe/alibi"), 8);
    ASSERT_EQ(s8.size(), 8u);
    for (int h = 0; h < 8; ++h) EXPECT_EQ(s8[h], std::ldexp(1.0f, -(h + 1))) << h;

    // 12 heads: the 8-head slopes, then the 16-head slopes (2^(-h/2), h = 1..16) at even
    // indices 0, 2, 4, 6, i.e. h = 1, 3, 5, 7: 2^-0.5, 2^-1.5, 2^-2.5, 2^-3.5.
    const auto s12 = alibi_slopes(lib("pe/alibi"), 12);
    ASSERT_EQ(s12.size(), 12u);
    for (int h = 0; h < 8; ++h) EXPECT_EQ(s12[h], s8[h]) << h;
    const double r = 0.7071067811865476;  // 2^-0.5
    const double tail12[4] = {r, r / 2, r / 4, r / 8};
    for (int i = 0; i < 4; ++i) EXPECT_FLOAT_EQ(s12[8 + i], static_cast<float>(tail12[i])) << i;

    // 16 heads: 2^(-h/2), h = 1..16.
    const auto s16 = alibi_slopes(lib("pe/alibi"), 16);
    ASSERT_EQ(s16.size(), 16u);
    for (int h = 1; h <= 16; ++h) {
        const double want = (h % 2 == 0) ? std::ldexp(1.0, -h / 2) : r * std::ldexp(1.0, -(h - 1) / 2);
        EXPECT_FLOAT_EQ(s16[h - 1], static_cast<float>(want)) << h;
    }

    // 24 heads: the 16-head slopes, then the 32-head slopes (2^(-h/4)) at h = 1, 3, ..., 15.
    const auto s24 = alibi_slopes(lib("pe/alibi"), 24);
    ASSERT_EQ(s24.size(), 24u);
    for (int h = 0; h < 16; ++h) EXPECT_EQ(s24[h], s16[h]) << h;
    const double q = 0.8408964152537145;  // 2^-0.25
    for (int i = 0; i < 8; ++i) {
        // 2^(-(2i+1)/4) = 2^-0.25 * 2^(-i/2)
        const double want = q * ((i % 2 == 0) ? std::ldexp(1.0, -i / 2) : r * std::ldexp(1.0, -(i - 1) / 2));
        EXPECT_FLOAT_EQ(s24[16 + i], static_cast<float>(want)) << i;
    }

    // 3 heads: 2-head slopes 2^-4, 2^-8, then the 4-head slopes (2^-2, ...) at index 0.
    const auto s3 = alibi_slopes(lib("pe/alibi"), 3);
    ASSERT_EQ(s3.size(), 3u);
    EXPECT_EQ(s3[0], 1.0f / 16);
    EXPECT_EQ(s3[1], 1.0f / 256);
    EXPECT_EQ(s3[2], 1.0f / 4);
    // 1 head: 2^-8.
    EXPECT_EQ(alibi_slopes(lib("pe/alibi"), 1)[0], 1.0f / 256);
}

TEST_F(PePlugins, AlibiSpecIsFixedAndExtendChangesNothing) {
    Instance a(lib("pe/alibi"), model_info(12, 64, 512), {});
    ASSERT_EQ(a.status, CTX_OK) << a.message();
    EXPECT_TRUE(a.host.params.empty());
    const ctx_bias_spec s = a.bias(512);
    EXPECT_EQ(s.kind, CTX_BIAS_LINEAR);
    EXPECT_EQ(s.param_a, -1);
    EXPECT_EQ(s.param_b, -1);
    const std::vector<float> before(s.slopes, s.slopes + 12);
    EXPECT_EQ(a.extend(512, 8192), CTX_OK) << a.message();
    EXPECT_TRUE(a.host.params.empty());
    const ctx_bias_spec t = a.bias(8192);
    EXPECT_EQ(t.kind, CTX_BIAS_LINEAR);
    for (int h = 0; h < 12; ++h) EXPECT_EQ(t.slopes[h], before[h]);
}

TEST_F(PePlugins, AlibiRejectsZeroHeads) {
    Instance a(lib("pe/alibi"), model_info(0, 64), {});
    EXPECT_EQ(a.status, CTX_ERR_INVALID_ARGUMENT);
    EXPECT_TRUE(contains(a.message(), "n_head")) << a.message();
}

// ================================================================ pe/learned (METHODS.md 1.1)

namespace {

ctx_tensor table(std::vector<float>& data, int64_t rows, int64_t cols) {
    ctx_tensor t{};
    t.data = data.data();
    t.dtype = CTX_F32;
    t.ndim = 2;
    t.shape[0] = rows;
    t.shape[1] = cols;
    t.shape[2] = t.shape[3] = 1;
    return t;
}

std::vector<float> random_table(int64_t rows, int64_t cols, unsigned seed) {
    std::mt19937 gen(seed);
    std::normal_distribution<float> dist(0.0f, 1.0f);
    std::vector<float> v(static_cast<size_t>(rows * cols));
    for (auto& x : v) x = dist(gen);
    return v;
}

// Extends a learned instance from lt to le rows through extend + extend_params and returns the
// new table.
std::vector<float> extend_table(Instance& l, const std::vector<float>& old, int64_t lt, int64_t le,
                                int64_t d) {
    EXPECT_EQ(l.extend(lt, le), CTX_OK) << l.message();
    const RecordedParam* p = l.host.param("wpe");
    EXPECT_NE(p, nullptr);
    EXPECT_EQ(l.host.params.size(), 1u) << "extend re-declares wpe, it adds nothing";
    if (!p) return {};
    EXPECT_EQ(p->desc.ndim, 2);
    EXPECT_EQ(p->desc.shape[0], le);
    EXPECT_EQ(p->desc.shape[1], d);
    std::vector<float> old_copy = old, out(static_cast<size_t>(le * d), std::nanf(""));
    ctx_tensor o = table(old_copy, lt, d), n = table(out, le, d);
    ctx_err err{};
    EXPECT_EQ(l.vt->extend_params(l.inst, &o, &n, 1, &err), CTX_OK) << err.message;
    EXPECT_EQ(old_copy, old) << "extend_params must not modify the old table";
    return out;
}

}  // namespace

TEST_F(PePlugins, LearnedDescriptor) {
    const auto& p = lib("pe/learned");
    check_descriptor(p, "learned", CTX_PE_HOOK_INPUT);
    ASSERT_EQ(p.descriptor->n_options, 1);
    const ctx_option_desc* std_opt = option(p, "init_std");
    ASSERT_NE(std_opt, nullptr);
    EXPECT_EQ(std_opt->type, CTX_OPT_NUMBER);
    EXPECT_STREQ(std_opt->default_value, "0.02");
    const auto* vt = static_cast<const ctx_pe_vtable*>(p.descriptor->vtable);
    EXPECT_NE(vt->extend, nullptr);
    EXPECT_NE(vt->extend_params, nullptr);
    EXPECT_NE(vt->save_state, nullptr);
    EXPECT_NE(vt->load_state, nullptr);
}

TEST_F(PePlugins, LearnedDeclaresTheTable) {
    Instance l(lib("pe/learned"), model_info(4, 2, 96, 8), {});
    ASSERT_EQ(l.status, CTX_OK) << l.message();
    ASSERT_EQ(l.host.params.size(), 1u);
    const ctx_param_desc& d = l.host.params[0].desc;
    EXPECT_STREQ(d.name, "wpe");
    EXPECT_EQ(d.ndim, 2);
    EXPECT_EQ(d.shape[0], 96);  // (context_length, d_model)
    EXPECT_EQ(d.shape[1], 8);
    EXPECT_EQ(d.init, CTX_INIT_NORMAL);
    EXPECT_FLOAT_EQ(d.init_scale, 0.02f);
    EXPECT_EQ(d.weight_decay, 1);  // as llm.c, which decays every 2-D parameter

    ctx_input_spec spec{};
    spec.struct_size = sizeof spec;
    spec.table_param = -1;
    ctx_err err{};
    ASSERT_EQ(l.vt->input_spec(l.inst, &spec, &err), CTX_OK) << err.message;
    EXPECT_EQ(spec.kind, CTX_INPUT_TABLE);
    EXPECT_EQ(spec.table_param, 0);

    Instance custom(lib("pe/learned"), model_info(4, 2, 96, 8), {{"init_std", 0.05}});
    ASSERT_EQ(custom.status, CTX_OK) << custom.message();
    EXPECT_FLOAT_EQ(custom.host.params[0].desc.init_scale, 0.05f);

    Instance bad(lib("pe/learned"), model_info(4, 2, 96, 8), {{"init_std", -1.0}});
    EXPECT_EQ(bad.status, CTX_ERR_INVALID_ARGUMENT);
    EXPECT_TRUE(contains(bad.message(), "'init_std'")) << bad.message();
    EXPECT_TRUE(contains(bad.message(), "-1")) << bad.message();
}

// The paper's formula for integral beta (METHODS.md 1.1), with e_{Lt} := e_{Lt-1}.
TEST_F(PePlugins, LearnedExtendIntegralBetaMatchesThePaper) {
    const int64_t lt = 32, d = 6;
    for (int64_t beta : {int64_t{2}, int64_t{4}}) {
        SCOPED_TRACE(beta);
        const int64_t le = lt * beta;
        Instance l(lib("pe/learned"), model_info(3, 2, static_cast<int32_t>(lt), static_cast<int32_t>(d)), {});
        ASSERT_EQ(l.status, CTX_OK) << l.message();
        const auto e = random_table(lt, d, 1234 + static_cast<unsigned>(beta));
        const auto out = extend_table(l, e, lt, le, d);
        ASSERT_EQ(out.size(), static_cast<size_t>(le * d));
        auto row = [&](int64_t j) { return &e[static_cast<size_t>(std::min(j, lt - 1) * d)]; };
        for (int64_t i = 0; i < le; ++i) {
            const double w0 = static_cast<double>(beta - i % beta) / beta;
            const double w1 = static_cast<double>(i % beta) / beta;
            for (int64_t c = 0; c < d; ++c) {
                const double want = w0 * row(i / beta)[c] + w1 * row(i / beta + 1)[c];
                EXPECT_NEAR(out[i * d + c], want, 1e-6) << "row " << i << " col " << c;
            }
            if (i % beta == 0) {  // on the original grid the row is copied exactly
                for (int64_t c = 0; c < d; ++c) EXPECT_EQ(out[i * d + c], row(i / beta)[c]);
            }
        }
        // The last beta rows interpolate between e_{Lt-1} and e_{Lt} := e_{Lt-1}: all equal it.
        for (int64_t i = le - beta; i < le; ++i)
            for (int64_t c = 0; c < d; ++c) EXPECT_FLOAT_EQ(out[i * d + c], row(lt - 1)[c]);
    }
}

// General beta (ours): x = i / beta, j = floor(x), f = x - j, e'_i = (1-f) e_j + f e_{min(j+1, Lt-1)}.
TEST_F(PePlugins, LearnedExtendNonIntegralBeta) {
    const int64_t lt = 96, le = 160, d = 5;  // beta = 5/3
    Instance l(lib("pe/learned"), model_info(5, 1, static_cast<int32_t>(lt), static_cast<int32_t>(d)), {});
    ASSERT_EQ(l.status, CTX_OK) << l.message();
    const auto e = random_table(lt, d, 99);
    const auto out = extend_table(l, e, lt, le, d);
    ASSERT_EQ(out.size(), static_cast<size_t>(le * d));
    const double beta = static_cast<double>(le) / lt;
    for (int64_t i = 0; i < le; ++i) {
        const double x = i / beta;
        double j = std::floor(x);
        double f = x - j;
        if (f > 1 - 1e-9) {  // i / beta landed a hair below an integer in floating point
            j += 1;
            f = 0;
        }
        const int64_t j0 = static_cast<int64_t>(j), j1 = std::min<int64_t>(j0 + 1, lt - 1);
        for (int64_t c = 0; c < d; ++c) {
            const double want = (1 - f) * e[j0 * d + c] + f * e[j1 * d + c];
            EXPECT_NEAR(out[i * d + c], want, 1e-6) << "row " << i << " col " << c;
        }
    }
    // Spot checks by hand: i = 5 -> x = 3 exactly (row 3); i = 1 -> x = 0.6; i = 159 -> x = 95.4,
    // j = 95 = Lt-1 so both neighbours are row 95.
    for (int64_t c = 0; c < d; ++c) {
        EXPECT_EQ(out[5 * d + c], e[3 * d + c]);
        EXPECT_NEAR(out[1 * d + c], 0.4 * e[0 * d + c] + 0.6 * e[1 * d + c], 1e-6);
        EXPECT_FLOAT_EQ(out[159 * d + c], e[95 * d + c]);
    }

    // State follows the table: save_state reports 160 rows; a further extension starts from 160.
    size_t size = 0;
    ctx_err err{};
    ASSERT_EQ(l.vt->save_state(l.inst, nullptr, 0, &size, &err), CTX_OK) << err.message;
    ASSERT_EQ(size, sizeof(int64_t));
    int64_t rows = 0;
    ASSERT_EQ(l.vt->save_state(l.inst, &rows, sizeof rows, &size, &err), CTX_OK) << err.message;
    EXPECT_EQ(rows, le);
    EXPECT_EQ(l.extend(lt, 320), CTX_ERR_INVALID_ARGUMENT) << "the table now has 160 rows";
    const auto out2 = extend_table(l, out, le, 320, d);  // beta = 2 again
    for (int64_t c = 0; c < d; ++c) EXPECT_EQ(out2[2 * 7 * d + c], out[7 * d + c]);
}

TEST_F(PePlugins, LearnedExtendToSameLengthCopies) {
    Instance l(lib("pe/learned"), model_info(2, 2, 16, 4), {});
    ASSERT_EQ(l.status, CTX_OK) << l.message();
    const auto e = random_table(16, 4, 7);
    EXPECT_EQ(extend_table(l, e, 16, 16, 4), e);
}

TEST_F(PePlugins, LearnedRefusesToShrink) {
    Instance l(lib("pe/learned"), model_info(2, 4, 96, 8), {});
    ASSERT_EQ(l.status, CTX_OK) << l.message();
    EXPECT_EQ(l.extend(96, 64), CTX_ERR_INVALID_ARGUMENT);
    EXPECT_TRUE(contains(l.message(), "96")) << l.message();
    EXPECT_TRUE(contains(l.message(), "64")) << l.message();
    EXPECT_TRUE(contains(l.message(), "shrink")) << l.message();
    // Nothing was re-declared, and extend_params has nothing to do.
    ASSERT_EQ(l.host.params.size(), 1u);
    EXPECT_EQ(l.host.params[0].desc.shape[0], 96);
    std::vector<float> a(96 * 8), b(64 * 8);
    ctx_tensor o = table(a, 96, 8), n = table(b, 64, 8);
    ctx_err err{};
    EXPECT_EQ(l.vt->extend_params(l.inst, &o, &n, 1, &err), CTX_ERR_INVALID_ARGUMENT);
    EXPECT_TRUE(contains(err.message, "without a preceding extend")) << err.message;
}

TEST_F(PePlugins, LearnedExtendChecksLengthsAndShapes) {
    Instance l(lib("pe/learned"), model_info(2, 4, 32, 8), {});
    ASSERT_EQ(l.status, CTX_OK) << l.message();
    EXPECT_EQ(l.extend(64, 128), CTX_ERR_INVALID_ARGUMENT);  // the table has 32 rows, not 64
    EXPECT_TRUE(contains(l.message(), "32")) << l.message();

    ASSERT_EQ(l.extend(32, 64), CTX_OK) << l.message();
    std::vector<float> a(32 * 8), b(63 * 8);
    ctx_tensor o = table(a, 32, 8), n = table(b, 63, 8);  // wrong number of new rows
    ctx_err err{};
    EXPECT_EQ(l.vt->extend_params(l.inst, &o, &n, 1, &err), CTX_ERR_INVALID_ARGUMENT);
    EXPECT_TRUE(contains(err.message, "(64, 8)")) << err.message;
    EXPECT_EQ(l.vt->extend_params(l.inst, &o, &n, 0, &err), CTX_ERR_INVALID_ARGUMENT);
}

TEST_F(PePlugins, LearnedStateRoundTrip) {
    Instance l(lib("pe/learned"), model_info(2, 4, 32, 8), {});
    ASSERT_EQ(l.status, CTX_OK) << l.message();
    ctx_err err{};
    const int64_t rows = 256;
    ASSERT_EQ(l.vt->load_state(l.inst, &rows, sizeof rows, &err), CTX_OK) << err.message;
    int64_t got = 0;
    size_t size = 0;
    ASSERT_EQ(l.vt->save_state(l.inst, &got, sizeof got, &size, &err), CTX_OK) << err.message;
    EXPECT_EQ(got, 256);
    EXPECT_EQ(l.extend(256, 512), CTX_OK) << l.message();  // extension continues from the state

    const int32_t short_state = 5;
    EXPECT_EQ(l.vt->load_state(l.inst, &short_state, sizeof short_state, &err),
              CTX_ERR_INVALID_ARGUMENT);
    const int64_t negative = -3;
    EXPECT_EQ(l.vt->load_state(l.inst, &negative, sizeof negative, &err), CTX_ERR_INVALID_ARGUMENT);
}
