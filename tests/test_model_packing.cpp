// Packed rows through the whole model: a row holding two documents (Batch::doc_start, positions
// restarting per document) computes for each document exactly what a row of that document alone
// computes, for every kind of positional encoding and both attention modes; its gradients match
// finite differences; and malformed document layouts are refused.
#include <gtest/gtest.h>

#include <cmath>

#include "model_fixtures.h"

namespace ctx {
namespace {

using test::cpu;
using test::make_pe;
using test::tiny_config;

struct PackCase {
    const char* label;
    const char* pe;
    std::map<std::string, test::OptionValue> opts;
    bool llama = false;  // RMSNorm, SwiGLU, grouped-query attention
};
void PrintTo(const PackCase& c, std::ostream* os) { *os << c.label; }

ModelConfig config_of(const PackCase& pc) {
    ModelConfig c = tiny_config();
    c.context_length = 16;
    if (pc.llama) {
        test::use_llama_block(c);
        c.n_head = 4, c.n_kv_head = 2;
    }
    return c;
}

// A row of n tokens at positions 0 .. n-1 (document `seed`'s tokens), targets its next tokens.
BatchBuffers row_of(int n, int vocab, int seed) {
    BatchBuffers b;
    b.resize(1, n);
    for (int t = 0; t < n; ++t) {
        b.tokens[t] = (seed * 5 + t * 7 + 3) % vocab;
        b.targets[t] = (seed * 5 + (t + 1) * 7 + 3) % vocab;
        b.positions[t] = float(t);
        b.mask[t] = 1.0f;
    }
    return b;
}

class PackedModel : public ::testing::TestWithParam<PackCase> {};

TEST_P(PackedModel, EachDocumentComputesWhatItsOwnRowComputes) {
    const PackCase& pc = GetParam();
    const ModelConfig c = config_of(pc);
    Model m(c, cpu(), make_pe(pc.pe, c, pc.opts), 3);
    const int V = c.vocab_size, n1 = 5, n2 = 7;
    const BatchBuffers a = row_of(n1, V, 1), b = row_of(n2, V, 2);
    BatchBuffers packed;
    packed.resize(1, n1 + n2);
    packed.doc_start.assign(n1 + n2, 0);
    for (int t = 0; t < n1 + n2; ++t) {
        const BatchBuffers& src = t < n1 ? a : b;
        const int u = t < n1 ? t : t - n1;
        packed.tokens[t] = src.tokens[u];
        packed.targets[t] = src.targets[u];
        packed.positions[t] = src.positions[u];  // restarting per document
        packed.mask[t] = 1.0f;
        packed.doc_start[t] = t < n1 ? 0 : n1;
    }
    for (AttentionChoice mode : {AttentionChoice::Materialised, AttentionChoice::Flash}) {
        if (!cpu().attention_mode_supported(mode == AttentionChoice::Flash ? AttentionMode::Flash
                                                                           : AttentionMode::Materialised,
                                            c.d_model, c.n_head))
            continue;
        m.set_attention_choice(mode);
        m.forward(packed.batch());
        const std::vector<float> lp = m.logits(packed.batch());
        m.forward(a.batch());
        const std::vector<float> la = m.logits(a.batch());
        m.forward(b.batch());
        const std::vector<float> lb = m.logits(b.batch());
        double worst = 0;
        for (size_t i = 0; i < la.size(); ++i) worst = std::max(worst, double(std::fabs(lp[i] - la[i])));
        for (size_t i = 0; i < lb.size(); ++i)
            worst = std::max(worst, double(std::fabs(lp[la.size() + i] - lb[i])));
        EXPECT_LT(worst, 1e-5) << pc.label << " " << attention_choice_name(mode);
        // and without doc_start the second document would see the first
        packed.doc_start.clear();
        m.forward(packed.batch());
        const std::vector<float> unmasked = m.logits(packed.batch());
        double diff = 0;
        for (size_t i = 0; i < lb.size(); ++i)
            diff = std::max(diff, double(std::fabs(unmasked[la.size() + i] - lb[i])));
        EXPECT_GT(diff, 1e-3) << pc.label;
        packed.doc_start.assign(n1 + n2, 0);
        for (int t = n1; t < n1 + n2; ++t) packed.doc_start[t] = n1;
    }
}

TEST_P(PackedModel, GradientsMatchFiniteDifferences) {
    const PackCase& pc = GetParam();
    const ModelConfig c = config_of(pc);
    Model m(c, cpu(), make_pe(pc.pe, c, pc.opts), 3);
    BatchBuffers buf = test::tiny_batch(c.vocab_size);
    // row 0: documents [0, 2), [2, 5), [5, 6); row 1: [0, 1), [1, 6)
    buf.doc_start = {0, 0, 2, 2, 2, 5, 0, 1, 1, 1, 1, 1};
    test::check_model_gradients(m, buf, pc.label);
}

INSTANTIATE_TEST_SUITE_P(
    Pe, PackedModel,
    ::testing::Values(PackCase{"rope", "rope", {}}, PackCase{"alibi", "alibi", {}},
                      PackCase{"learned", "learned", {{"init_std", 0.3}}},
                      PackCase{"t5_bias", "t5_bias", {}},
                      // gelu and a threshold between positions: no kink inside a finite
                      // difference (as test_pe_bias_model's FIRE cases)
                      PackCase{"fire_generic_bias", "fire",
                               {{"activation", std::string("gelu")}, {"threshold", 6.5},
                                {"init_c", 0.5}, {"hidden", 8.0}}},
                      PackCase{"llama_grouped_query_rope", "rope", {}, true}),
    [](const auto& info) { return std::string(info.param.label); });

TEST(PackedModelLayout, MalformedDocumentStartsAreRefused) {
    const ModelConfig c = tiny_config();
    Model m(c, cpu(), make_pe("rope", c), 3);
    BatchBuffers buf = test::tiny_batch(c.vocab_size);
    for (const std::vector<int32_t>& bad :
         {std::vector<int32_t>{0, 0, 3, 3, 3, 5, 0, 0, 0, 0, 0, 0},   // starts after itself
          std::vector<int32_t>{0, 0, 2, 2, 0, 0, 0, 0, 0, 0, 0, 0},   // returns to document 0
          std::vector<int32_t>{0, 0, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0}}) {  // 1 is not a start
        buf.doc_start = bad;
        try {
            m.forward(buf.batch());
            ADD_FAILURE() << "accepted a malformed doc_start";
        } catch (const Error& e) {
            EXPECT_NE(std::string(e.what()).find("documents must be contiguous runs"),
                      std::string::npos) << e.what();
        }
    }
}

}  // namespace
}  // namespace ctx
