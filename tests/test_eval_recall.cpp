// eval/perplexity's recall accuracy by distance (recall_by_distance.h): counts, bins, the
// windowed control and the question breakdown against the corpus generator's own record of its
// recalls (a mock host with a known "model"), then the real host against Model::logits.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <lua.hpp>

#include "data/corpus.h"
#include "data/tokenizer.h"
#include "model_fixtures.h"
#include "eval/eval_plugin.h"
#include "lua/options.h"
#include "lua/runtime.h"

namespace ctx {
namespace {

using test::cpu;
using test::make_pe;
using test::plugins;

using Rec = std::map<std::string, double>;

// Generated documents as byte tokens (token = byte, so generator offsets are token indices).
struct Docs {
    std::vector<CorpusDoc> docs;
    std::vector<std::vector<int32_t>> tokens;
};
Docs make_docs(int64_t n, int64_t min_distance, int64_t max_distance) {
    CorpusOptions o;
    o.n_docs = n;
    o.min_len = 1500;
    o.max_len = 3000;
    o.facts_per_doc = 3;
    o.min_distance = min_distance;
    o.max_distance = max_distance;
    o.seed = 5;
    Docs d;
    d.docs = generate_corpus(o);
    for (const auto& doc : d.docs) {
        std::vector<int32_t> t;
        for (unsigned char c : doc.text) t.push_back(c);
        d.tokens.push_back(t);
    }
    return d;
}

// ---- the mock: a "model" whose greedy prediction is the true next token, except (a) with a
// window W, at every row position t >= W, and (b) always right after ": " (so the first token of
// a question's answer is wrong and a reminder's never is). log p = -0.25 everywhere.
struct Mock {
    const Docs* docs = nullptr;
    int32_t lt = 64;
    std::vector<Rec> records;
    Rec current;
};
Mock* g = nullptr;

ctx_status m_score(ctx_eval_host*, const ctx_score_request* q, ctx_err*) {
    for (int64_t r = 0; r < q->n_rows; ++r)
        for (int64_t t = 0; t < q->row_len; ++t) {
            const int64_t i = r * q->row_len + t;
            if (q->logprobs) q->logprobs[i] = -0.25f;
            if (!q->argmax) continue;
            const bool after_colon = t >= 1 && q->tokens[i] == ' ' && q->tokens[i - 1] == ':';
            const bool outside = q->window > 0 && t >= q->window;
            q->argmax[i] = (after_colon || outside) ? q->targets[i] + 1 : q->targets[i];
        }
    return CTX_OK;
}
ctx_status m_logprobs(ctx_eval_host*, const int32_t*, const float*, const int32_t*, int64_t n,
                      int64_t len, float* lp, ctx_err*) {
    for (int64_t i = 0; i < n * len; ++i) lp[i] = -0.25f;
    return CTX_OK;
}
ctx_status m_logprobs_w(ctx_eval_host* h, const int32_t* tok, const float* pos, const int32_t* tgt,
                        int64_t n, int64_t len, int32_t, float* lp, ctx_err* err) {
    return m_logprobs(h, tok, pos, tgt, n, len, lp, err);
}
int64_t m_detok(ctx_eval_host*, const int32_t* ids, int64_t n, char* out, int64_t cap, ctx_err*) {
    for (int64_t i = 0; i < n && i < cap; ++i) out[i] = static_cast<char>(ids[i]);
    if (n < cap) out[n] = '\0';
    return n;
}
void m_info(ctx_eval_host*, ctx_eval_model_info* info) {
    info->vocab_size = 259;
    info->context_length = info->trained_length = g->lt;
}
int64_t m_ndocs(ctx_eval_host*) { return static_cast<int64_t>(g->docs->tokens.size()); }
int64_t m_len(ctx_eval_host*, int64_t d) { return static_cast<int64_t>(g->docs->tokens[d].size()); }
ctx_status m_copy(ctx_eval_host*, int64_t d, int64_t start, int64_t n, int32_t* out, ctx_err*) {
    std::copy_n(g->docs->tokens[d].begin() + start, n, out);
    return CTX_OK;
}
void m_begin(ctx_eval_host*, const char* task) {
    g->current.clear();
    g->current["task:" + std::string(task)] = 1;
}
void m_number(ctx_eval_host*, const char* k, double v) { g->current[k] = v; }
void m_string(ctx_eval_host*, const char*, const char*) {}
ctx_status m_end(ctx_eval_host*, ctx_err*) {
    g->records.push_back(g->current);
    return CTX_OK;
}
void m_log(ctx_eval_host*, int32_t, const char*) {}
void m_metric(ctx_eval_host*, const char*, double) {}

lua::Options parse(lua::Runtime& rt, const std::string& lua_table) {
    rt.run_string("opts = " + lua_table, "options");
    lua_getglobal(rt.state(), "opts");
    return lua::Options::parse(rt.state(), -1,
                               plugin_option_schema(*plugins().get("eval/perplexity").descriptor),
                               "eval/perplexity options", "test:");
}

std::vector<Rec> run_mock(const Docs& docs, const std::string& options, ctx_status want = CTX_OK,
                          std::string* message = nullptr) {
    Mock mock;
    mock.docs = &docs;
    g = &mock;
    ctx_eval_api api{};
    api.struct_size = sizeof api;
    api.row_logprobs = m_logprobs;
    api.metric = m_metric;
    api.model_info = m_info;
    api.num_documents = m_ndocs;
    api.document_length = m_len;
    api.copy_tokens = m_copy;
    api.record_begin = m_begin;
    api.record_number = m_number;
    api.record_string = m_string;
    api.record_end = m_end;
    api.log = m_log;
    api.detokenize = m_detok;
    api.row_logprobs_windowed = m_logprobs_w;
    api.score_rows = m_score;
    const LoadedPlugin& lib = plugins().get("eval/perplexity");
    lua::Runtime rt;
    lua::Options o = parse(rt, options);
    auto* vt = static_cast<const ctx_eval_vtable*>(lib.descriptor->vtable);
    PluginHostContext host("eval/perplexity", 1);
    void* inst = nullptr;
    ctx_err err{};
    EXPECT_EQ(vt->create(&host.api, reinterpret_cast<const ctx_options*>(&o), &inst, &err), CTX_OK)
        << err.message;
    EXPECT_EQ(vt->run(inst, &api, nullptr, &err), want) << err.message;
    if (message) *message = err.message;
    vt->destroy(inst);
    g = nullptr;
    std::vector<Rec> out;
    for (auto& r : mock.records)
        if (r.count("task:perplexity_recall")) out.push_back(r);
    return out;
}

// What the plugin should count, from the generator's own record of its recalls.
struct Expected {
    int64_t count = 0, questions = 0, windowed_right = 0;
};
std::map<int64_t, Expected> expected(const Docs& d, int64_t L, int64_t window,
                                     const std::vector<int64_t>& edges) {
    std::map<int64_t, Expected> out;  // by bin start
    for (size_t k = 0; k < d.docs.size(); ++k) {
        const auto len = static_cast<int64_t>(d.tokens[k].size());
        for (int64_t s = 0; s + L + 1 <= len; s += L) {
            for (const RecallSpan& r : d.docs[k].recalls) {
                if (r.source_begin < s || r.value_begin < s + 1 || r.value_end > s + L + 1) continue;
                for (size_t b = 0; b + 1 < edges.size(); ++b) {
                    if (r.distance() < edges[b] || r.distance() >= edges[b + 1]) continue;
                    Expected& e = out[edges[b]];
                    ++e.count;
                    e.questions += r.question;
                    // windowed: right when every value token sits before row position W (and it
                    // is not a question, whose first token the mock always gets wrong)
                    e.windowed_right += !r.question && r.value_end - 1 - s - 1 < window;
                }
            }
        }
    }
    return out;
}

TEST(RecallByDistance, CountsBinsQuestionsAndTheWindowedControl) {
    const Docs docs = make_docs(12, 8, 512);
    const auto recs = run_mock(docs, "{ multiples = {2, 4}, recall = true, windowed = true }");
    // Lt = 64: lengths 128 and 256; default edges {0, 1, 2, 4, ...} x Lt, bins below L only.
    ASSERT_EQ(recs.size(), 2u + 3u);
    int64_t total = 0;
    for (const Rec& r : recs) {
        const auto L = static_cast<int64_t>(r.at("length"));
        const std::vector<int64_t> edges = {0, 64, 128, 256, 512, 1024};
        const Expected e = expected(docs, L, 64, edges)[static_cast<int64_t>(r.at("distance_from"))];
        SCOPED_TRACE("L=" + std::to_string(L) + " bin " + std::to_string(r.at("distance_from")));
        EXPECT_EQ(r.at("recalls"), e.count);
        EXPECT_EQ(r.at("questions"), e.questions);
        ASSERT_GT(e.count, 0) << "the test corpus has recalls in every bin";
        EXPECT_DOUBLE_EQ(r.at("accuracy"), 1.0 - static_cast<double>(e.questions) / e.count);
        if (e.questions > 0) {
            EXPECT_EQ(r.at("question_accuracy"), 0.0);
        }
        EXPECT_DOUBLE_EQ(r.at("windowed_accuracy"), static_cast<double>(e.windowed_right) / e.count);
        EXPECT_NEAR(r.at("value_nll"), 0.25, 1e-7);
        EXPECT_EQ(r.at("window"), 64);
        total += e.count;
    }
    EXPECT_GT(total, 100);
    // At L = Lt the windowed control is the model itself.
    const auto at_lt = run_mock(docs, "{ multiples = {1}, recall = true, windowed = true }");
    ASSERT_EQ(at_lt.size(), 1u);
    EXPECT_EQ(at_lt[0].at("accuracy"), at_lt[0].at("windowed_accuracy"));
}

TEST(RecallByDistance, CustomBinsAndBadBins) {
    const Docs docs = make_docs(6, 8, 256);
    const auto recs = run_mock(docs, "{ multiples = {4}, recall = true, recall_bins = {0.5, 1.5, 3} }");
    ASSERT_EQ(recs.size(), 2u);
    const auto e = expected(docs, 256, 0, {32, 96, 192});
    EXPECT_EQ(recs[0].at("distance_from"), 32);
    EXPECT_EQ(recs[0].at("distance_to"), 96);
    EXPECT_EQ(recs[0].at("recalls"), e.at(32).count);
    EXPECT_EQ(recs[1].at("recalls"), e.at(96).count);
    for (const char* bad : {"{ recall = true, recall_bins = {1} }",
                            "{ recall = true, recall_bins = {0, 2, 1} }",
                            "{ recall = true, recall_bins = {-1, 1} }"}) {
        const LoadedPlugin& lib = plugins().get("eval/perplexity");
        auto* vt = static_cast<const ctx_eval_vtable*>(lib.descriptor->vtable);
        lua::Runtime rt;
        lua::Options o = parse(rt, bad);
        PluginHostContext host("eval/perplexity", 1);
        void* inst = nullptr;
        ctx_err err{};
        EXPECT_NE(vt->create(&host.api, reinterpret_cast<const ctx_options*>(&o), &inst, &err),
                  CTX_OK) << bad;
        EXPECT_NE(std::string(err.message).find("option 'recall_bins' needs 2 to 17 increasing"),
                  std::string::npos) << err.message;
    }
}

TEST(RecallByDistance, RecallNeedsTheApi13Host) {
    const Docs docs = make_docs(2, 8, 256);
    Mock mock;
    mock.docs = &docs;
    g = &mock;
    ctx_eval_api api{};
    api.struct_size = offsetof(ctx_eval_api, score_rows);  // a 1.2 host
    api.row_logprobs = m_logprobs;
    api.model_info = m_info;
    api.num_documents = m_ndocs;
    api.document_length = m_len;
    api.copy_tokens = m_copy;
    api.record_begin = m_begin;
    api.record_number = m_number;
    api.record_string = m_string;
    api.record_end = m_end;
    api.log = m_log;
    api.detokenize = m_detok;
    const LoadedPlugin& lib = plugins().get("eval/perplexity");
    lua::Runtime rt;
    lua::Options o = parse(rt, "{ recall = true }");
    auto* vt = static_cast<const ctx_eval_vtable*>(lib.descriptor->vtable);
    PluginHostContext host("eval/perplexity", 1);
    void* inst = nullptr;
    ctx_err err{};
    ASSERT_EQ(vt->create(&host.api, reinterpret_cast<const ctx_options*>(&o), &inst, &err), CTX_OK);
    EXPECT_EQ(vt->run(inst, &api, nullptr, &err), CTX_ERR_UNSUPPORTED);
    EXPECT_NE(std::string(err.message).find("eval API 1.3"), std::string::npos) << err.message;
    vt->destroy(inst);
    g = nullptr;
}

// ---- the real host: accuracy and value NLL equal what Model::logits gives on the same windows.
TEST(RecallByDistance, RealHostMatchesTheModelsOwnPredictions) {
    const Docs docs = make_docs(4, 8, 128);
    ModelConfig c = test::tiny_config();
    c.vocab_size = 259;
    c.context_length = 32;
    Model m(c, cpu(), make_pe("rope", c), 3);
    MemoryDocs set(docs.tokens, 259);
    auto comm = make_single_comm();
    auto tokenizer = load_tokenizer("byte");
    std::vector<Record> records;
    EvalContext ctx;
    ctx.model = &m;
    ctx.documents = &set;
    ctx.comm = comm.get();
    ctx.trained_length = 32;
    ctx.tokenizer = tokenizer.get();
    ctx.collected = &records;
    lua::Runtime rt;
    lua::Options o = parse(rt, "{ lengths = {256}, recall = true, recall_bins = {0, 2, 4, 8}, max_windows = 16 }");
    EvalPlugin plugin(plugins().get("eval/perplexity"), o, 1);
    plugin.run(ctx);

    const int L = 256;
    std::map<int64_t, std::pair<int64_t, int64_t>> want;  // bin -> (count, right)
    std::map<int64_t, double> nll;
    std::map<int64_t, int64_t> value_tokens;
    int windows = 0;
    for (size_t k = 0; k < docs.docs.size() && windows < 16; ++k) {
        const auto& t = docs.tokens[k];
        for (size_t s = 0; s + L + 1 <= t.size() && windows < 16; s += L, ++windows) {
            BatchBuffers b;
            b.resize(1, L);
            for (int i = 0; i < L; ++i) {
                b.tokens[i] = t[s + i];
                b.targets[i] = t[s + i + 1];
                b.positions[i] = static_cast<float>(i);
                b.mask[i] = 1;
            }
            m.forward(b.batch());
            const std::vector<float> logits = m.logits(b.batch());
            const float* losses = m.losses();
            for (const RecallSpan& r : docs.docs[k].recalls) {
                const auto S = static_cast<int64_t>(s);
                if (r.source_begin < S || r.value_begin < S + 1 || r.value_end > S + L + 1) continue;
                const int64_t bin = r.distance() < 64 ? 0 : r.distance() < 128 ? 64 : 128;
                bool right = true;
                for (int64_t j = r.value_begin; j < r.value_end; ++j) {
                    const int64_t row = j - S - 1;
                    const float* l = logits.data() + row * 259;
                    right = right && std::max_element(l, l + 259) - l == t[j];
                    nll[bin] += losses[row];
                }
                value_tokens[bin] += r.value_end - r.value_begin;
                want[bin].first += 1;
                want[bin].second += right;
            }
        }
    }
    int found = 0;
    for (const Record& r : records) {
        if (r["task"] != "perplexity_recall") continue;
        const int64_t bin = r["distance_from"].get<int64_t>();
        EXPECT_EQ(r["recalls"].get<int64_t>(), want[bin].first) << "bin " << bin;
        if (want[bin].first > 0) {
            EXPECT_NEAR(r["accuracy"].get<double>(),
                        static_cast<double>(want[bin].second) / want[bin].first, 1e-12);
            EXPECT_NEAR(r["value_nll"].get<double>(), nll[bin] / value_tokens[bin], 1e-5);
        }
        ++found;
    }
    EXPECT_EQ(found, 3);
    EXPECT_GT(want[64].first + want[128].first, 8);
}

}  // namespace
}  // namespace ctx
