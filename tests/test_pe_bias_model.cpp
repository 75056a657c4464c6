// The attention-bias PEs through the engine: the plugins' specs evaluated by the CPU attention op
// against METHODS.md 1.5-1.6 formulas at distances 0..300, whole-model finite-difference gradient
// checks (KERPLE log / power, T5, and FIRE through the generic bias path) on rows with fractional,
// non-contiguous positions, invariance of every relative bias under a shift of all positions, and
// the host's refusal of CTX_BIAS_GENERIC from a plugin whose vtable predates ABI 1.1.
#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <cstring>
#include <limits>
#include <lua.hpp>

#include "core/rng.h"
#include "model_fixtures.h"
#include "lua/options.h"
#include "lua/runtime.h"

namespace ctx {
namespace {

using test::cpu;
using test::make_pe;
using test::tiny_batch;
using test::tiny_config;

bool contains(const std::string& s, const std::string& part) {
    return s.find(part) != std::string::npos;
}

// ---------------------------------------------------------------- formulas (double precision)

// METHODS.md 1.6, causal: n = max(0, floor(d)); exact below num_buckets / 2, log-spaced above.
int t5_bucket(double d, int num_buckets, int max_distance) {
    const double n = std::floor(d) > 0.0 ? std::floor(d) : 0.0;
    const double exact = num_buckets / 2;
    if (n < exact) return static_cast<int>(n);
    const double b = exact + std::floor(std::log(n / exact) / std::log(max_distance / exact) *
                                        (num_buckets - exact));
    return static_cast<int>(b < num_buckets - 1 ? b : num_buckets - 1);
}

double kerple_log(double r1, double r2, double d) { return -r1 * std::log(1.0 + r2 * std::fabs(d)); }
double kerple_power(double r1, double r2, double d) {
    return d == 0.0 ? 0.0 : -r1 * std::pow(std::fabs(d), r2);
}

// ---------------------------------------------------------------- plugin -> op

// A PE plugin's parameters on the host, initialised by their declarations.
struct PeParams {
    std::vector<std::vector<float>> data;
    std::vector<ctx_tensor> views;
    explicit PeParams(PePlugin& pe, uint64_t seed = 5) {
        for (const PeParamDecl& d : pe.params()) {
            size_t n = 1;
            for (int64_t s : d.shape) n *= static_cast<size_t>(s);
            data.emplace_back(n, 0.0f);
        }
        for (size_t i = 0; i < data.size(); ++i) {
            ctx_tensor t{};
            t.data = data[i].data();
            t.ndim = static_cast<int32_t>(pe.params()[i].shape.size());
            for (int k = 0; k < 4; ++k) t.shape[k] = k < t.ndim ? pe.params()[i].shape[k] : 1;
            views.push_back(t);
        }
        Rng rng(seed);
        pe.init_params(views, rng);
    }
};

// One head-row of attention with q = k = v = 0: the logits are the bias alone, so the
// probabilities of the last query over keys j recover b(d_j) - b(d_0) as log(P_j / P_0).
// positions: (T) of one row. Returns, per head, b(p_last - p_j) - b(p_last - p_0).
std::vector<std::vector<double>> bias_through_op(const BiasSpec& spec, const std::vector<float>& pos,
                                                 int H) {
    const int T = static_cast<int>(pos.size()), C = 2 * H;
    std::vector<float> qkv(size_t(T) * 3 * C, 0.0f), out(size_t(T) * C), att(size_t(H) * T * T);
    AttentionOptions opt;
    opt.bias = spec;
    cpu().attention_forward(out.data(), att.data(), qkv.data(), pos.data(), 1, T, C, H, opt);
    std::vector<std::vector<double>> rel(H, std::vector<double>(T));
    for (int h = 0; h < H; ++h) {
        const float* row = att.data() + (size_t(h) * T + (T - 1)) * T;  // last query
        for (int j = 0; j < T; ++j) rel[h][j] = std::log(double(row[j])) - std::log(double(row[0]));
    }
    return rel;
}

// Keys at distances 300, 299, ..., 0 from the last query (integers) or 299.75, ..., 0.25, 0
// (fractional: every distance but the last is k + 0.75 ... shifted by a quarter).
std::vector<float> distance_row(bool fractional) {
    std::vector<float> pos;
    for (int k = 0; k <= 300; ++k) pos.push_back(fractional && k < 300 ? k + 0.25f : float(k));
    return pos;
}

TEST(PeBiasThroughOp, KerpleFamiliesMatchMethodsAtDistances0To300) {
    ModelConfig c = tiny_config();
    c.n_head = 3;
    c.d_model = 12;
    for (const char* name : {"kerple_log", "kerple_power"}) {
        SCOPED_TRACE(name);
        const bool power = std::string(name) == "kerple_power";
        auto pe = make_pe(name, c);
        PeParams p(*pe);
        const ctx_bias_spec s = pe->bias_spec(301);
        ASSERT_EQ(s.kind, power ? CTX_BIAS_KERPLE_POWER : CTX_BIAS_KERPLE_LOG);
        // Parameters spanning the clamped ranges (small enough that exp(bias) stays normal).
        std::vector<float>& r1 = p.data[size_t(s.param_a)];
        std::vector<float>& r2 = p.data[size_t(s.param_b)];
        r1 = power ? std::vector<float>{0.05f, 0.01f, 0.002f} : std::vector<float>{2.0f, 0.5f, 0.01f};
        r2 = power ? std::vector<float>{0.7f, 1.0f, 1.6f} : std::vector<float>{0.01f, 1.0f, 3.0f};
        BiasSpec spec;
        spec.kind = static_cast<BiasKind>(s.kind);
        spec.a = r1.data();
        spec.b = r2.data();
        for (bool fractional : {false, true}) {
            const std::vector<float> pos = distance_row(fractional);
            const auto rel = bias_through_op(spec, pos, 3);
            for (int h = 0; h < 3; ++h) {
                auto f = [&](double d) {
                    return power ? kerple_power(r1[h], r2[h], d) : kerple_log(r1[h], r2[h], d);
                };
                const double d0 = double(pos.back()) - pos[0];
                for (size_t j = 0; j < pos.size(); ++j) {
                    const double d = double(pos.back()) - pos[j];
                    const double want = f(d) - f(d0);
                    ASSERT_NEAR(rel[h][j], want, 2e-4 * (1.0 + std::fabs(want)))
                        << "head " << h << " distance " << d;
                }
            }
        }
    }
}

TEST(PeBiasThroughOp, T5BucketsMatchMethodsAtDistances0To300) {
    ModelConfig c = tiny_config();
    c.n_head = 2;
    c.d_model = 8;
    struct Opt {
        int nb, md;
    };
    for (const Opt o : {Opt{32, 128}, Opt{16, 40}, Opt{7, 11}}) {
        SCOPED_TRACE(o.nb);
        std::map<std::string, test::OptionValue> opts;
        if (o.nb != 32) opts = {{"num_buckets", double(o.nb)}, {"max_distance", double(o.md)}};
        auto pe = make_pe("t5_bias", c, opts);
        PeParams p(*pe);
        const ctx_bias_spec s = pe->bias_spec(301);
        ASSERT_EQ(s.kind, CTX_BIAS_T5);
        ASSERT_EQ(s.num_buckets, o.nb);
        ASSERT_EQ(s.max_distance, o.md);
        std::vector<float>& table = p.data[size_t(s.param_a)];
        ASSERT_EQ(table.size(), size_t(2) * o.nb);
        for (size_t k = 0; k < table.size(); ++k) table[k] = -0.05f * float((k * 7) % table.size());
        BiasSpec spec;
        spec.kind = BiasKind::T5;
        spec.a = table.data();
        spec.num_buckets = s.num_buckets;
        spec.max_distance = s.max_distance;
        for (bool fractional : {false, true}) {
            const std::vector<float> pos = distance_row(fractional);
            const auto rel = bias_through_op(spec, pos, 2);
            for (int h = 0; h < 2; ++h) {
                const double d0 = double(pos.back()) - pos[0];
                const double b0 = table[size_t(h) * o.nb + t5_bucket(d0, o.nb, o.md)];
                for (size_t j = 0; j < pos.size(); ++j) {
                    const double d = double(pos.back()) - pos[j];
                    const double want = table[size_t(h) * o.nb + t5_bucket(d, o.nb, o.md)] - b0;
                    ASSERT_NEAR(rel[h][j], want, 1e-4) << "head " << h << " distance " << d;
                }
            }
        }
    }
    // Hand-derived buckets (32, 128): exact below 16; 16 + floor(log(n/16)/log(8) * 16) above.
    EXPECT_EQ(t5_bucket(0.0, 32, 128), 0);
    EXPECT_EQ(t5_bucket(15.75, 32, 128), 15);
    EXPECT_EQ(t5_bucket(16.0, 32, 128), 16);
    EXPECT_EQ(t5_bucket(23.0, 32, 128), 18);   // log(23/16)/log(8)*16 = 2.79
    EXPECT_EQ(t5_bucket(64.0, 32, 128), 26);   // 2/3 * 16 = 10.67
    EXPECT_EQ(t5_bucket(127.0, 32, 128), 31);  // 15.94
    EXPECT_EQ(t5_bucket(300.0, 32, 128), 31);
}

// ---------------------------------------------------------------- whole-model gradients

using test::mean_loss;

// Every PE entry is checked and must get a gradient.
void check_model_gradients(Model& m, const BatchBuffers& buf, const std::string& label) {
    test::GradCheckOptions opt;
    opt.all_pe_entries = true;
    opt.require_pe_gradient = true;
    test::check_model_gradients(m, buf, label, opt);
}

struct GradCase {
    const char* label;
    const char* pe;
    std::map<std::string, test::OptionValue> pe_options;
    const char* style;
};

void PrintTo(const GradCase& c, std::ostream* os) { *os << c.label; }

class PeBiasModelGradient : public ::testing::TestWithParam<GradCase> {};

TEST_P(PeBiasModelGradient, MatchesFiniteDifferences) {
    const GradCase& gc = GetParam();
    ModelConfig c = tiny_config();
    if (std::string(gc.style) == "neox") {
        c.parallel_residual = true;
        c.tied_embeddings = false;
        c.activation = Activation::GeluErf;
    }
    Model m(c, cpu(), make_pe(gc.pe, c, gc.pe_options), 3);
    m.reserve(3, 9);  // tables sized for more than the batch: the layout follows the batch's T
    check_model_gradients(m, tiny_batch(c.vocab_size), gc.label);
}

INSTANTIATE_TEST_SUITE_P(
    BiasPes, PeBiasModelGradient,
    ::testing::Values(
        GradCase{"kerple_log", "kerple_log", {}, "gpt2"},
        GradCase{"kerple_power", "kerple_power", {}, "gpt2"},
        GradCase{"kerple_power_alibi_like_neox", "kerple_power",
                 {{"init", std::string("alibi_like")}, {"min_value", 0.001}}, "neox"},
        // Small buckets so that the distances of the batch (up to 11) reach the log-spaced range.
        GradCase{"t5_bias_small_buckets", "t5_bias",
                 {{"num_buckets", 8.0}, {"max_distance", 12.0}, {"init_std", 0.5}}, "gpt2"},
        GradCase{"t5_bias_default", "t5_bias", {{"init_std", 0.5}}, "neox"},
        // Queries on both sides of the threshold L = 6.5 (positions reach 11; L on a position would
        // put the kink of max(p_i, L) inside the finite-difference step).
        GradCase{"fire_normalized", "fire",
                 {{"activation", std::string("gelu")}, {"threshold", 6.5}, {"init_c", 0.5},
                  {"hidden", 8.0}},
                 "gpt2"},
        GradCase{"fire_relative_neox", "fire",
                 {{"activation", std::string("gelu")}, {"normalize", false}, {"hidden", 6.0}},
                 "neox"}),
    [](const auto& info) { return std::string(info.param.label); });

// ---------------------------------------------------------------- relative-position invariance

struct ShiftCase {
    const char* label;
    const char* pe;
    std::map<std::string, test::OptionValue> pe_options;
    bool relative;  // true: per-token losses unchanged by a shift of every position
};

void PrintTo(const ShiftCase& c, std::ostream* os) { *os << c.label; }

class PeBiasShift : public ::testing::TestWithParam<ShiftCase> {};

TEST_P(PeBiasShift, ShiftingAllPositions) {
    const ShiftCase& sc = GetParam();
    ModelConfig c = tiny_config();
    c.context_length = 64;  // the learned table covers the shifted positions too
    Model m(c, cpu(), make_pe(sc.pe, c, sc.pe_options), 7);
    BatchBuffers buf = tiny_batch(c.vocab_size);
    m.forward(buf.batch());
    const std::vector<float> base(m.losses(), m.losses() + buf.positions.size());
    // T5 floors distances, so its shifts are integral; the others also take a fractional one.
    const bool t5 = std::string(sc.pe) == "t5_bias";
    for (float shift : {37.0f, 13.25f}) {
        if (t5 && shift != std::floor(shift)) continue;
        BatchBuffers moved = buf;
        for (float& p : moved.positions) p += shift;
        m.forward(moved.batch());
        double max_rel = 0;
        for (size_t i = 0; i < base.size(); ++i) {
            const double a = base[i], bb = m.losses()[i];
            max_rel = std::max(max_rel, std::fabs(a - bb) / std::max(1e-12, std::fabs(a)));
        }
        if (sc.relative) {
            EXPECT_LT(max_rel, 1e-5) << sc.label << " shift " << shift;
        } else {
            EXPECT_GT(max_rel, 1e-3) << sc.label << " shift " << shift;
        }
    }
}

INSTANTIATE_TEST_SUITE_P(
    Pes, PeBiasShift,
    ::testing::Values(
        ShiftCase{"alibi", "alibi", {}, true},
        ShiftCase{"kerple_log", "kerple_log", {}, true},
        ShiftCase{"kerple_power", "kerple_power", {}, true},
        ShiftCase{"t5_bias", "t5_bias", {{"num_buckets", 8.0}, {"max_distance", 12.0}}, true},
        ShiftCase{"fire_relative", "fire", {{"normalize", false}}, true},
        // The paper's normalisation by psi(max(p_i, L)) is relative while every query stays
        // below L (here 1000), and not once queries pass it (L = 4).
        ShiftCase{"fire_below_threshold", "fire", {{"threshold", 1000.0}}, true},
        ShiftCase{"fire_past_threshold", "fire", {{"threshold", 4.0}}, false},
        ShiftCase{"learned_is_absolute", "learned", {{"init_std", 0.3}}, false}),
    [](const auto& info) { return std::string(info.param.label); });

// ---------------------------------------------------------------- plugin state in the model

TEST(PeBiasModel, KerpleInitRangesAndClampingThroughTheModel) {
    ModelConfig c = tiny_config();
    c.n_head = 8;
    c.d_model = 32;
    Model m(c, cpu(), make_pe("kerple_power", c), 11);
    const ParamView& r1 = m.layout().view("pe.r1");
    const ParamView& r2 = m.layout().view("pe.r2");
    ASSERT_EQ(r1.shape, std::vector<int64_t>{8});
    float* a = m.params().at(r1);
    float* b = m.params().at(r2);
    for (int h = 0; h < 8; ++h) {
        EXPECT_GE(a[h], 0.0f);
        EXPECT_LT(a[h], 2.0f);
        EXPECT_GE(b[h], 0.0f);
        EXPECT_LT(b[h], 1.0f);
    }
    a[0] = -3.0f;
    b[1] = 7.0f;
    b[2] = 0.0f;
    m.after_update();
    EXPECT_EQ(a[0], 0.01f);
    EXPECT_EQ(b[1], 2.0f);
    EXPECT_EQ(b[2], 0.01f);
}

// FIRE trains through the generic path: a few AdamW-free SGD steps on one batch lower the loss
// and move the plugin's parameters.
TEST(PeBiasModel, FireParametersTrainThroughTheGenericPath) {
    ModelConfig c = tiny_config();
    Model m(c, cpu(), make_pe("fire", c, {{"hidden", 8.0}}), 4);
    const BatchBuffers buf = tiny_batch(c.vocab_size);
    const ParamView& w2 = m.layout().view("pe.w2");
    const std::vector<float> w2_before(m.params().at(w2), m.params().at(w2) + w2.numel);
    double first = 0, last = 0;
    for (int step = 0; step < 5; ++step) {
        cpu().zero(m.grads().data(), m.grads().size());
        const double loss = m.forward_backward(buf.batch(), 0.1f).mean();
        if (step == 0) first = loss;
        last = loss;
        for (size_t i = 0; i < m.params().size(); ++i) m.params().data()[i] -= 0.5f * m.grads().data()[i];
    }
    EXPECT_LT(last, first);
    EXPECT_NE(std::vector<float>(m.params().at(w2), m.params().at(w2) + w2.numel), w2_before);
}

// ---------------------------------------------------------------- ABI: old vtables

// PE options the way a recipe passes them: an empty Lua table checked against the schema.
lua::Options empty_options(const LoadedPlugin& lib) {
    static lua::Runtime runtime;
    lua_State* L = runtime.state();
    lua_newtable(L);
    lua::Options o = lua::Options::parse(L, -1, plugin_option_schema(*lib.descriptor),
                                         "pe options", "test:");
    lua_pop(L, 1);
    return o;
}

// pe/fire with its vtable cut to what an ABI 1.0 plugin has (struct_size ends at load_state), or
// with the slots present but NULL: the host must refuse CTX_BIAS_GENERIC, not read past the end.
TEST(PeBiasAbi, GenericBiasNeedsTheAbi11Slots) {
    const LoadedPlugin& fire = test::plugins().get("pe/fire");
    const auto* vt = static_cast<const ctx_pe_vtable*>(fire.descriptor->vtable);
    ModelConfig c = tiny_config();
    const ctx_model_info info{sizeof(ctx_model_info), c.d_model, c.n_head, c.head_dim(),
                              c.n_layer, c.vocab_size, c.context_length};
    {  // the real plugin
        PePlugin pe(fire, info, empty_options(fire), 1);
        EXPECT_TRUE(pe.has_generic_bias());
        EXPECT_EQ(pe.bias_spec(12).kind, CTX_BIAS_GENERIC);
    }
    for (int variant = 0; variant < 2; ++variant) {
        SCOPED_TRACE(variant == 0 ? "1.0-sized vtable" : "NULL slots");
        ctx_pe_vtable old_vt = *vt;
        if (variant == 0) {
            old_vt.struct_size = static_cast<uint32_t>(offsetof(ctx_pe_vtable, bias_forward));
            // What lies past struct_size must not be read: poison it.
            std::memset(reinterpret_cast<char*>(&old_vt) + old_vt.struct_size, 0xA5,
                        sizeof old_vt - old_vt.struct_size);
        } else {
            old_vt.bias_forward = nullptr;
            old_vt.bias_backward = nullptr;
        }
        ctx_plugin_descriptor old_desc = *fire.descriptor;
        old_desc.abi_minor = variant == 0 ? 0 : 1;
        old_desc.vtable = &old_vt;
        LoadedPlugin old_lib;
        old_lib.full_name = fire.full_name;
        old_lib.path = fire.path;
        old_lib.descriptor = &old_desc;
        PePlugin pe(old_lib, info, empty_options(fire), 1);
        EXPECT_FALSE(pe.has_generic_bias());
        try {
            pe.bias_spec(12);
            FAIL() << "expected an error";
        } catch (const Error& e) {
            const std::string msg = e.what();
            EXPECT_TRUE(contains(msg, "pe/fire")) << msg;
            EXPECT_TRUE(contains(msg, "CTX_BIAS_GENERIC")) << msg;
            EXPECT_TRUE(contains(msg, "bias_forward and bias_backward")) << msg;
            EXPECT_TRUE(contains(msg, "ABI 1.1")) << msg;
            if (variant == 0) {
                EXPECT_TRUE(contains(msg, "built for 1.0")) << msg;
            }
        }
        // A model refuses it when it is built, before any step.
        auto owned = std::make_unique<PePlugin>(old_lib, info, empty_options(fire), 1);
        EXPECT_THROW(Model(c, cpu(), std::move(owned), 3), Error);
    }
}

// In-kernel families get their parameter shapes checked against n_head by the host: pe/kerple_log
// behind a create() that tells it the model has 4 heads while the host's model has 2.
const ctx_pe_vtable* g_real_kerple = nullptr;
ctx_status create_with_four_heads(const ctx_host_api* host, const ctx_model_info* model,
                                  const ctx_options* options, void** instance, ctx_err* err) {
    ctx_model_info m = *model;
    m.n_head = 4;
    return g_real_kerple->create(host, &m, options, instance, err);
}

TEST(PeBiasAbi, HostChecksBiasParameterShapes) {
    ModelConfig c = tiny_config();  // 2 heads
    const LoadedPlugin& lib = test::plugins().get("pe/kerple_log");
    g_real_kerple = static_cast<const ctx_pe_vtable*>(lib.descriptor->vtable);
    const ctx_model_info info{sizeof(ctx_model_info), c.d_model, c.n_head, c.head_dim(),
                              c.n_layer, c.vocab_size, c.context_length};
    PePlugin good(lib, info, empty_options(lib), 1);
    EXPECT_EQ(good.bias_spec(12).kind, CTX_BIAS_KERPLE_LOG);

    ctx_pe_vtable vt = *g_real_kerple;
    vt.create = create_with_four_heads;
    ctx_plugin_descriptor desc = *lib.descriptor;
    desc.vtable = &vt;
    LoadedPlugin wrong = lib;
    wrong.descriptor = &desc;
    wrong.handle = nullptr;
    PePlugin pe(wrong, info, empty_options(lib), 1);
    try {
        pe.bias_spec(12);
        FAIL() << "expected an error";
    } catch (const Error& e) {
        EXPECT_TRUE(contains(e.what(), "must have n_head = 2 entries, it has 4")) << e.what();
    }
}

}  // namespace
}  // namespace ctx
