// eval/perplexity: its arithmetic against a mock host with known log-probabilities (model-free),
// and the real host path against the model's own forward pass on the same windows.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <lua.hpp>

#include "model_fixtures.h"
#include "eval/eval_plugin.h"
#include "lua/options.h"
#include "lua/runtime.h"

namespace ctx {
namespace {

using test::cpu;
using test::make_pe;
using test::plugins;

// ---- a mock ctx_eval_api: documents of given lengths, log p = -0.01 * (position + 1)
struct MockEval {
    std::vector<int64_t> doc_lengths;
    int32_t trained_length = 8;
    std::vector<std::map<std::string, double>> records;
    std::map<std::string, double> current;
    int64_t rows_scored = 0;
    std::vector<std::vector<float>> rows;  // positions of every scored row
};
MockEval* g_mock = nullptr;

ctx_status mock_logprobs(ctx_eval_host*, const int32_t*, const float* positions, const int32_t*,
                         int64_t n_rows, int64_t row_len, float* lp, ctx_err*) {
    for (int64_t i = 0; i < n_rows * row_len; ++i) lp[i] = -0.01f * (positions[i] + 1.0f);
    for (int64_t r = 0; r < n_rows; ++r)
        g_mock->rows.emplace_back(positions + r * row_len, positions + (r + 1) * row_len);
    g_mock->rows_scored += n_rows;
    return CTX_OK;
}
// Windowed control: the same log-probabilities where the window covers the whole prefix
// (t < window), and a penalty of 0.5 / window beyond it (a smaller window hurts more).
ctx_status mock_logprobs_windowed(ctx_eval_host* h, const int32_t* tok, const float* positions,
                                  const int32_t* tgt, int64_t n_rows, int64_t row_len,
                                  int32_t window, float* lp, ctx_err* err) {
    mock_logprobs(h, tok, positions, tgt, n_rows, row_len, lp, err);
    for (int64_t r = 0; r < n_rows; ++r)
        for (int64_t t = window; t < row_len; ++t) lp[r * row_len + t] -= 0.5f / window;
    return CTX_OK;
}
void mock_info(ctx_eval_host*, ctx_eval_model_info* info) {
    info->vocab_size = 50;
    info->context_length = g_mock->trained_length;
    info->trained_length = g_mock->trained_length;
}
int64_t mock_ndocs(ctx_eval_host*) { return static_cast<int64_t>(g_mock->doc_lengths.size()); }
int64_t mock_len(ctx_eval_host*, int64_t d) { return g_mock->doc_lengths[d]; }
ctx_status mock_copy(ctx_eval_host*, int64_t d, int64_t start, int64_t n, int32_t* out, ctx_err* err) {
    if (start < 0 || start + n > g_mock->doc_lengths[d]) {
        ctx_err_set(err, "out of range");
        return CTX_ERR_INVALID_ARGUMENT;
    }
    for (int64_t i = 0; i < n; ++i) out[i] = static_cast<int32_t>((start + i) % 50);
    return CTX_OK;
}
void mock_begin(ctx_eval_host*, const char* task) {
    g_mock->current.clear();
    g_mock->current["task:" + std::string(task)] = 1;
}
void mock_number(ctx_eval_host*, const char* k, double v) { g_mock->current[k] = v; }
void mock_string(ctx_eval_host*, const char*, const char*) {}
ctx_status mock_end(ctx_eval_host*, ctx_err*) {
    g_mock->records.push_back(g_mock->current);
    return CTX_OK;
}
void mock_log(ctx_eval_host*, int32_t, const char*) {}
void mock_metric(ctx_eval_host*, const char*, double) {}

std::vector<std::map<std::string, double>> run_mock(const std::vector<int64_t>& docs,
                                                    const std::string& options_lua,
                                                    std::vector<std::vector<float>>* rows = nullptr) {
    MockEval mock;
    mock.doc_lengths = docs;
    g_mock = &mock;
    ctx_eval_api api{};  // the 1.2 text and generation services stay NULL: this task needs none
    api.struct_size = sizeof(ctx_eval_api);
    api.row_logprobs = mock_logprobs;
    api.metric = mock_metric;
    api.model_info = mock_info;
    api.num_documents = mock_ndocs;
    api.document_length = mock_len;
    api.copy_tokens = mock_copy;
    api.record_begin = mock_begin;
    api.record_number = mock_number;
    api.record_string = mock_string;
    api.record_end = mock_end;
    api.log = mock_log;
    api.row_logprobs_windowed = mock_logprobs_windowed;
    const LoadedPlugin& lib = plugins().get("eval/perplexity");
    lua::Runtime rt;
    rt.run_string("opts = " + options_lua, "options");
    lua_getglobal(rt.state(), "opts");
    lua::Options o = lua::Options::parse(rt.state(), -1, plugin_option_schema(*lib.descriptor),
                                         "eval/perplexity options", "test:");
    auto* vt = static_cast<const ctx_eval_vtable*>(lib.descriptor->vtable);
    PluginHostContext host("eval/perplexity", 1);
    void* inst = nullptr;
    ctx_err err{};
    EXPECT_EQ(vt->create(&host.api, reinterpret_cast<const ctx_options*>(&o), &inst, &err), CTX_OK)
        << err.message;
    EXPECT_EQ(vt->run(inst, &api, nullptr, &err), CTX_OK) << err.message;
    vt->destroy(inst);
    g_mock = nullptr;
    if (rows) *rows = mock.rows;
    return mock.records;
}

// Expected values computed here from the definition: window NLL = 0.01 * sum_{t<L} (t + 1).
TEST(PerplexityPlugin, MeanAndTokenWeightedPerplexityFromTheDefinition) {
    const std::vector<int64_t> docs = {25, 8, 9, 40};  // Lt = 8
    const auto recs = run_mock(docs, "{ multiples = {1, 2, 4} }");
    ASSERT_EQ(recs.size(), 3u);
    for (const auto& r : recs) {
        const int64_t L = static_cast<int64_t>(r.at("length"));
        int64_t windows = 0;
        for (int64_t n : docs) windows += n > L ? (n - 1) / L : 0;
        const double nll = 0.01 * L * (L + 1) / 2.0;  // every window has the same NLL here
        EXPECT_EQ(r.at("windows"), windows) << "L=" << L;
        EXPECT_EQ(r.at("tokens"), windows * L);
        EXPECT_NEAR(r.at("mean_ppl"), std::exp(nll / L), 1e-6);
        EXPECT_NEAR(r.at("token_ppl"), std::exp(nll / L), 1e-6);
        EXPECT_NEAR(r.at("mean_nll"), nll / L, 1e-7);
        EXPECT_DOUBLE_EQ(r.at("multiple"), L / 8.0);
    }
    EXPECT_EQ(recs[0].at("length"), 8);  // 25 -> 3, 8 -> 0 (needs a target after), 9 -> 1, 40 -> 4
    EXPECT_EQ(recs[0].at("windows"), 3 + 0 + 1 + 4);
    EXPECT_EQ(recs[2].at("windows"), 1);  // only the 40-token doc holds a 32-window (+1 target)
}

TEST(PerplexityPlugin, AbsoluteLengthsAndWindowCap) {
    const auto recs = run_mock({100}, "{ lengths = {10, 33}, max_windows = 4, batch_size = 3 }");
    ASSERT_EQ(recs.size(), 2u);
    EXPECT_EQ(recs[0].at("length"), 10);
    EXPECT_EQ(recs[0].at("windows"), 4);   // capped from 9
    EXPECT_EQ(recs[1].at("windows"), 3);   // (100 - 1) / 33
}

TEST(PerplexityPlugin, NoLongEnoughDocumentGivesAnEmptyRecordNotACrash) {
    const auto recs = run_mock({5, 6}, "{ lengths = {16} }");
    ASSERT_EQ(recs.size(), 1u);
    EXPECT_EQ(recs[0].at("windows"), 0);
    EXPECT_TRUE(std::isnan(recs[0].at("mean_ppl")));
}

// Eval position policies (METHODS.md 2.4): gap 1, or gaps U[eps, 1] seeded per window.
TEST(PerplexityPlugin, PositionPolicies) {
    std::vector<std::vector<float>> rows;
    run_mock({200}, "{ lengths = {16} }", &rows);
    ASSERT_EQ(rows.size(), 12u);
    for (const auto& r : rows)
        for (size_t t = 0; t < r.size(); ++t) EXPECT_EQ(r[t], static_cast<float>(t));

    const double eps = 0.25;
    std::vector<std::vector<float>> u1, u3, other_seed;
    const auto rec = run_mock({4000}, "{ lengths = {64}, positions = 'uniform', position_eps = 0.25 }", &u1);
    run_mock({4000}, "{ lengths = {64}, positions = 'uniform', position_eps = 0.25, batch_size = 3 }", &u3);
    run_mock({4000}, "{ lengths = {64}, positions = 'uniform', position_eps = 0.25, position_seed = 7 }",
             &other_seed);
    ASSERT_EQ(u1.size(), 62u);
    EXPECT_EQ(u1, u3) << "positions depend on the window, not on the batching";
    EXPECT_NE(u1, other_seed);
    double gap_sum = 0, gap_sq = 0, pos_sum = 0;
    int64_t gaps = 0;
    for (const auto& r : u1) {
        EXPECT_EQ(r[0], 0.0f);
        for (size_t t = 1; t < r.size(); ++t) {
            const double g = r[t] - r[t - 1];
            ASSERT_GE(g, eps - 1e-5);
            ASSERT_LE(g, 1.0 + 1e-5);
            gap_sum += g;
            gap_sq += g * g;
            ++gaps;
        }
        for (float p : r) pos_sum += p;
    }
    EXPECT_NE(u1[0], u1[1]);
    const double mean = gap_sum / gaps, var = gap_sq / gaps - mean * mean;
    EXPECT_NEAR(mean, (1 + eps) / 2, 0.01);                          // U[a, b]: (a + b) / 2
    EXPECT_NEAR(var, (1 - eps) * (1 - eps) / 12, 0.005);             // (b - a)^2 / 12
    // The mock's log p is -0.01 (p + 1): the record's mean NLL is 0.01 (mean position + 1).
    EXPECT_NEAR(rec[0].at("mean_nll"), 0.01 * (pos_sum / (62.0 * 64) + 1), 1e-6);
}

std::vector<std::map<std::string, double>> of_task(const std::vector<std::map<std::string, double>>& recs,
                                                   const std::string& task) {
    std::vector<std::map<std::string, double>> out;
    for (const auto& r : recs)
        if (r.count("task:" + task)) out.push_back(r);
    return out;
}

// METHODS 3.3: the binned position-wise NLL curve with its windowed control, from the mock's
// known log-probabilities: full -0.01 (t + 1); windowed the same minus 0.5 / w for t >= w.
TEST(PerplexityPlugin, PositionWiseCurveWithWindowedControl) {
    const auto recs = run_mock({100, 70}, "{ lengths = {32}, curve_bins = 4, windowed = true }");
    const auto ppl = of_task(recs, "perplexity");
    const auto curve = of_task(recs, "perplexity_curve");
    ASSERT_EQ(ppl.size(), 1u);
    ASSERT_EQ(curve.size(), 4u);
    const int L = 32, w = 8, windows = 3 + 2;  // Lt = 8 is the default window
    EXPECT_EQ(ppl[0].at("window"), w);
    double full = 0, windowed = 0;
    for (int t = 0; t < L; ++t) {
        full += 0.01 * (t + 1);
        windowed += 0.01 * (t + 1) + (t >= w ? 0.5 / w : 0.0);
    }
    EXPECT_NEAR(ppl[0].at("mean_nll"), full / L, 1e-6);
    EXPECT_NEAR(ppl[0].at("windowed_mean_nll"), windowed / L, 1e-6);
    EXPECT_NEAR(ppl[0].at("windowed_mean_ppl"), std::exp(windowed / L), 1e-5);
    for (int b = 0; b < 4; ++b) {
        const auto& r = curve[b];
        EXPECT_EQ(r.at("pos_start"), b * 8);
        EXPECT_EQ(r.at("pos_end"), (b + 1) * 8);
        EXPECT_EQ(r.at("tokens"), 8 * windows);
        double f = 0, fw = 0;
        for (int t = b * 8; t < (b + 1) * 8; ++t) {
            f += 0.01 * (t + 1);
            fw += 0.01 * (t + 1) + (t >= w ? 0.5 / w : 0.0);
        }
        EXPECT_NEAR(r.at("mean_nll"), f / 8, 1e-6) << "bin " << b;
        EXPECT_NEAR(r.at("windowed_mean_nll"), fw / 8, 1e-6) << "bin " << b;
    }
}

// The extrapolation criterion on the longest windows (64): for k = 16 and 32 (> Lt = 8, < 64),
// log-likelihood of predictions t >= k with context k vs context Lt.
TEST(PerplexityPlugin, ExtrapolationCriterion) {
    const auto recs = run_mock({200}, "{ lengths = {8, 16, 32, 64}, extrapolation = true }");
    const auto ex = of_task(recs, "perplexity_extrapolation");
    ASSERT_EQ(ex.size(), 2u);
    const int lmax = 64, lt = 8, windows = 3;  // (200 - 1) / 64
    for (size_t i = 0; i < ex.size(); ++i) {
        const int k = i == 0 ? 16 : 32;
        double ll_k = 0, ll_lt = 0;
        for (int t = k; t < lmax; ++t) {
            ll_k -= windows * (0.01 * (t + 1) + 0.5 / k);
            ll_lt -= windows * (0.01 * (t + 1) + 0.5 / lt);
        }
        EXPECT_EQ(ex[i].at("context"), k);
        EXPECT_EQ(ex[i].at("length"), lmax);
        EXPECT_EQ(ex[i].at("tokens"), (lmax - k) * windows);
        EXPECT_NEAR(ex[i].at("loglik_context"), ll_k, 1e-3);
        EXPECT_NEAR(ex[i].at("loglik_trained"), ll_lt, 1e-3);
        EXPECT_EQ(ex[i].at("extrapolates"), 1.0);
    }
}

TEST(PerplexityPlugin, BadPositionPolicyIsReportedAtCreate) {
    const LoadedPlugin& lib = plugins().get("eval/perplexity");
    auto* vt = static_cast<const ctx_eval_vtable*>(lib.descriptor->vtable);
    for (const auto& [opts, want] :
         std::vector<std::pair<std::string, std::string>>{
             {"{ positions = 'random' }", "option 'positions' must be \"gap1\" or \"uniform\", got \"random\""},
             {"{ positions = 'uniform', position_eps = 0 }", "option 'position_eps' must be in (0, 1], got 0"},
             {"{ position_eps = 1.5 }", "option 'position_eps' must be in (0, 1], got 1.5"}}) {
        lua::Runtime rt;
        rt.run_string("opts = " + opts, "options");
        lua_getglobal(rt.state(), "opts");
        lua::Options o = lua::Options::parse(rt.state(), -1, plugin_option_schema(*lib.descriptor),
                                             "eval/perplexity options", "test:");
        PluginHostContext host("eval/perplexity", 1);
        void* inst = nullptr;
        ctx_err err{};
        EXPECT_NE(vt->create(&host.api, reinterpret_cast<const ctx_options*>(&o), &inst, &err), CTX_OK);
        EXPECT_EQ(std::string(err.message), want);
    }
}

// ---- the real host: records equal exp(mean NLL) computed with Model::forward directly.
TEST(PerplexityPlugin, RealHostMatchesTheModelsOwnLosses) {
    ModelConfig c = test::tiny_config();
    c.vocab_size = 40;
    c.context_length = 6;
    Model m(c, cpu(), make_pe("rope", c), 4);
    std::vector<std::vector<int32_t>> docs = {{}, {}};
    for (int i = 0; i < 31; ++i) docs[0].push_back((i * 7) % 40);
    for (int i = 0; i < 14; ++i) docs[1].push_back((i * 3 + 1) % 40);
    MemoryDocs set(docs, 40);
    auto comm = make_single_comm();
    std::vector<Record> records;
    EvalContext ctx;
    ctx.model = &m;
    ctx.documents = &set;
    ctx.comm = comm.get();
    ctx.trained_length = 6;
    ctx.collected = &records;
    ctx.tags["method"] = "test";
    lua::Runtime rt;
    rt.run_string("opts = { multiples = {1, 2} }", "options");
    lua_getglobal(rt.state(), "opts");
    const LoadedPlugin& lib = plugins().get("eval/perplexity");
    lua::Options o = lua::Options::parse(rt.state(), -1, plugin_option_schema(*lib.descriptor),
                                         "opts", "test:");
    EvalPlugin plugin(lib, o, 1);
    plugin.run(ctx);
    ASSERT_EQ(records.size(), 2u);
    for (const Record& r : records) {
        EXPECT_EQ(r["method"], "test");
        const int L = r["length"].get<int>();
        double sum_ppl = 0, sum_nll = 0;
        int windows = 0;
        for (const auto& d : docs) {
            for (size_t k = 0; k + L + 1 <= d.size(); k += L) {
                BatchBuffers b;
                b.resize(1, L);
                for (int t = 0; t < L; ++t) {
                    b.tokens[t] = d[k + t];
                    b.targets[t] = d[k + t + 1];
                    b.positions[t] = static_cast<float>(t);
                    b.mask[t] = 1;
                }
                const double nll = m.forward(b.batch()).loss_sum;
                sum_nll += nll;
                sum_ppl += std::exp(nll / L);
                ++windows;
            }
        }
        EXPECT_EQ(r["windows"].get<int>(), windows);
        EXPECT_NEAR(r["mean_ppl"].get<double>(), sum_ppl / windows, 1e-4 * sum_ppl / windows);
        EXPECT_NEAR(r["token_ppl"].get<double>(), std::exp(sum_nll / (windows * L)), 1e-3);
    }
}

}  // namespace
}  // namespace ctx
