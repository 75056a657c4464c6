// Greedy generation with a key/value cache equals recomputing the whole sequence without a cache
// at every step (Model::forward on prompt + generated tokens), for every kind of PE: the next-token
// logits agree to float rounding and the chosen tokens are identical. Batched prompts of
// different lengths, fractional prompt positions, length-dependent RoPE scaling (dynamic NTK
// changes the rotation as the sequence grows) and the windowed control are covered.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "model/generate.h"
#include "model_fixtures.h"

namespace ctx {
namespace {

using test::cpu;
using test::make_pe;
using test::OptionValue;

struct PeCase {
    std::string label, name;
    std::map<std::string, OptionValue> opts;
    int context = 12;
    bool llama = false;  // the Llama block: RMSNorm, SwiGLU, 4 heads sharing 1 key/value head,
                         // a sliding window of 5
};

void PrintTo(const PeCase& c, std::ostream* os) { *os << c.label; }

ModelConfig config_for(const PeCase& pc) {
    ModelConfig c = test::tiny_config();
    c.vocab_size = 29;
    c.context_length = pc.context;
    if (pc.llama) {
        test::use_llama_block(c);
        c.n_head = 4, c.n_kv_head = 1, c.sliding_window = 5;
    }
    return c;
}

// Next-token logits of the sequence without a cache: one forward over all of it.
std::vector<float> uncached_logits(Model& m, const std::vector<int32_t>& tokens,
                                   const std::vector<float>& positions) {
    const int T = static_cast<int>(tokens.size());
    std::vector<int32_t> targets(tokens.size(), 0);
    std::vector<float> mask(tokens.size(), 1.0f);
    const Batch b{1, T, tokens.data(), positions.data(), targets.data(), mask.data()};
    m.forward(b);
    const std::vector<float> all = m.logits(b);
    const int V = m.config().vocab_size;
    return std::vector<float>(all.end() - V, all.end());
}

int argmax(const float* x, int n) { return static_cast<int>(std::max_element(x, x + n) - x); }

class Generation : public ::testing::TestWithParam<PeCase> {};

void check_against_recomputation(const PeCase& pc, int window) {
    const ModelConfig c = config_for(pc);
    Model m(c, cpu(), make_pe(pc.name, c, pc.opts), 7);
    m.set_attention_window(window);
    const int V = c.vocab_size, steps = 9;
    // Three prompts of different lengths; the second at fractional, gapped positions.
    std::vector<std::vector<int32_t>> seqs = {{3, 7, 1}, {5, 9, 2, 8, 11, 4, 6}, {12, 0, 17, 3, 5}};
    std::vector<std::vector<float>> pos = {{0, 1, 2}, {0, 0.5f, 2, 3.25f, 4, 6, 7.5f}, {0, 1, 2, 3, 4}};
    KvGenerator gen(m, 3, 7 + steps + 1, window);
    for (int r = 0; r < 3; ++r)
        gen.prefill(r, seqs[r].data(), pos[r].data(), static_cast<int>(seqs[r].size()));
    std::vector<std::vector<int32_t>> chosen(3);
    for (int step = 0; step <= steps; ++step) {
        std::vector<int32_t> next(3);
        std::vector<float> next_pos(3);
        for (int r = 0; r < 3; ++r) {
            const std::vector<float> want = uncached_logits(m, seqs[r], pos[r]);
            const float* got = gen.logits(r);
            double worst = 0;
            for (int v = 0; v < V; ++v) worst = std::max(worst, std::fabs(double(got[v]) - want[v]));
            ASSERT_LT(worst, 2e-4) << pc.label << " row " << r << " step " << step
                                   << " (length " << seqs[r].size() << ")";
            next[r] = argmax(want.data(), V);
            ASSERT_EQ(argmax(got, V), next[r]) << pc.label << " row " << r << " step " << step;
            next_pos[r] = pos[r].back() + 1.0f;
            chosen[r].push_back(next[r]);
        }
        if (step == steps) break;
        gen.decode(next.data(), next_pos.data());
        for (int r = 0; r < 3; ++r) {
            seqs[r].push_back(next[r]);
            pos[r].push_back(next_pos[r]);
            EXPECT_EQ(gen.length(r), static_cast<int>(seqs[r].size()));
        }
    }
    // generate() is the same greedy loop with prompts given whole.
    GenerateOptions o;
    o.max_new_tokens = steps + 1;
    o.window = window;
    const std::vector<std::vector<int32_t>> prompts = {{3, 7, 1}, {5, 9, 2, 8, 11, 4, 6}, {12, 0, 17, 3, 5}};
    const std::vector<std::vector<float>> prompt_pos = {{0, 1, 2}, {0, 0.5f, 2, 3.25f, 4, 6, 7.5f}, {0, 1, 2, 3, 4}};
    const auto res = generate(m, prompts, o, prompt_pos);
    for (int r = 0; r < 3; ++r) {
        EXPECT_EQ(res[r].tokens, chosen[r]) << pc.label << " row " << r;
        EXPECT_EQ(res[r].finish, GenerateResult::Finish::Length);
    }
}

TEST_P(Generation, CachedEqualsUncachedRecomputation) { check_against_recomputation(GetParam(), 0); }

TEST_P(Generation, WindowedCachedEqualsWindowedRecomputation) {
    check_against_recomputation(GetParam(), 4);
}

INSTANTIATE_TEST_SUITE_P(
    AllPeKinds, Generation,
    ::testing::Values(
        PeCase{"nope", "none", {}},
        PeCase{"learned", "learned", {}, 24},
        PeCase{"sinusoidal", "sinusoidal", {}},
        PeCase{"rope", "rope", {}},
        PeCase{"rope_partial_interleaved", "rope", {{"rotary_pct", 0.5}, {"layout", std::string("interleaved")}}},
        PeCase{"rope_linear", "rope", {{"scaling", std::string("linear")}, {"factor", 2.0}}},
        PeCase{"rope_dynamic_ntk", "rope", {{"scaling", std::string("dynamic_ntk")}, {"factor", 2.0}}},
        PeCase{"rope_yarn", "rope", {{"scaling", std::string("yarn")}, {"factor", 2.0}}},
        PeCase{"rope_xpos", "rope", {{"scaling", std::string("xpos")}}},
        PeCase{"alibi", "alibi", {}},
        PeCase{"kerple_log", "kerple_log", {}},
        PeCase{"kerple_power", "kerple_power", {}},
        PeCase{"t5_bias", "t5_bias", {}},
        PeCase{"fire_generic_bias", "fire", {{"hidden", 8.0}}},
        PeCase{"llama_mqa_sliding_window_rope", "rope", {}, 12, true}),
    [](const auto& info) { return info.param.label; });

// Dynamic NTK beyond the trained length: Recompute redoes a row whenever its length changes the
// rotation (one event per step past Lt = 12); Keep rotates only new tokens (HF's cached
// behaviour), which equals recomputation up to Lt and drifts from it after.
TEST(GenerationDynamicRope, RecomputeIsExactKeepDriftsPastTheTrainedLength) {
    const PeCase pc{"rope_dynamic_ntk", "rope", {{"scaling", std::string("dynamic_ntk")}, {"factor", 2.0}}};
    const ModelConfig c = config_for(pc);
    Model m(c, cpu(), make_pe(pc.name, c, pc.opts), 7);
    std::vector<int32_t> seq = {5, 9, 2, 8, 11, 4, 6, 1, 2, 3};
    std::vector<float> pos;
    for (int t = 0; t < 10; ++t) pos.push_back(static_cast<float>(t));
    KvGenerator exact(m, 1, 20), keep(m, 1, 20, 0, DynamicRope::Keep);
    exact.prefill(0, seq.data(), pos.data(), 10);
    keep.prefill(0, seq.data(), pos.data(), 10);
    for (int len = 11; len <= 16; ++len) {
        const int32_t t = static_cast<int32_t>((len * 5) % 29);
        const float p = static_cast<float>(len - 1);
        exact.decode(&t, &p);
        keep.decode(&t, &p);
        seq.push_back(t);
        pos.push_back(p);
        const std::vector<float> want = uncached_logits(m, seq, pos);
        double e_exact = 0, e_keep = 0;
        for (int v = 0; v < c.vocab_size; ++v) {
            e_exact = std::max(e_exact, std::fabs(double(exact.logits(0)[v]) - want[v]));
            e_keep = std::max(e_keep, std::fabs(double(keep.logits(0)[v]) - want[v]));
        }
        EXPECT_LT(e_exact, 2e-4) << "length " << len;
        if (len <= 12) EXPECT_LT(e_keep, 2e-4) << "length " << len;
        else EXPECT_GT(e_keep, 1e-3) << "length " << len << ": Keep should differ past Lt";
    }
    EXPECT_EQ(exact.recomputed_rows(), 4);  // lengths 13, 14, 15, 16
    EXPECT_EQ(keep.recomputed_rows(), 0);
}

TEST(GenerationStops, StopTokensStopStringsAndLength) {
    const ModelConfig c = config_for(PeCase{"rope", "rope", {}});
    Model m(c, cpu(), make_pe("rope", c), 7);
    GenerateOptions o;
    o.max_new_tokens = 8;
    const std::vector<std::vector<int32_t>> prompts = {{3, 7, 1}, {5, 9}};
    const auto free_run = generate(m, prompts, o);
    ASSERT_EQ(free_run[0].tokens.size(), 8u);
    ASSERT_EQ(free_run[1].tokens.size(), 8u);
    // Stop at the third token row 0 would produce: the two before it are kept, not the stop.
    o.stop_tokens = {free_run[0].tokens[2]};
    const auto stopped = generate(m, prompts, o);
    const auto first_stop = std::find(free_run[0].tokens.begin(), free_run[0].tokens.end(),
                                      free_run[0].tokens[2]) - free_run[0].tokens.begin();
    EXPECT_EQ(stopped[0].finish, GenerateResult::Finish::StopToken);
    EXPECT_EQ(stopped[0].tokens, std::vector<int32_t>(free_run[0].tokens.begin(),
                                                      free_run[0].tokens.begin() + first_stop));
    // Stop strings on the decoded text (tokens as letters here), cut before the match.
    GenerateOptions s;
    s.max_new_tokens = 8;
    s.decode = [](const std::vector<int32_t>& t) {
        std::string x;
        for (int32_t v : t) x.push_back(static_cast<char>('a' + v));
        return x;
    };
    std::string full;
    for (int32_t v : free_run[1].tokens) full.push_back(static_cast<char>('a' + v));
    s.stop_strings = {full.substr(3, 2)};
    const auto by_string = generate(m, prompts, s);
    EXPECT_EQ(by_string[1].finish, GenerateResult::Finish::StopString);
    EXPECT_EQ(by_string[1].text, full.substr(0, full.find(full.substr(3, 2))));
    EXPECT_STREQ(finish_name(by_string[1].finish), "stop_string");
    // Errors: empty prompt, stop strings without a decoder, a learned table too short.
    GenerateOptions bad;
    bad.stop_strings = {"x"};
    EXPECT_THROW(generate(m, prompts, bad), Error);
    EXPECT_THROW(generate(m, {{}}, o), Error);
    ModelConfig lc = c;
    lc.context_length = 6;
    Model learned(lc, cpu(), make_pe("learned", lc), 3);
    GenerateOptions many;
    many.max_new_tokens = 6;
    try {
        generate(learned, {{1, 2, 3}}, many);
        ADD_FAILURE() << "no error past the position table";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("exceeds the learned position table of 6 rows"),
                  std::string::npos) << e.what();
    }
}

}  // namespace
}  // namespace ctx
