// Sampler composition (METHODS.md 2.5): the mixing sampler and the curriculum data source.
#include <gtest/gtest.h>

#include <cmath>

#include "data/mix_sampler.h"
#include "data/row_stream_source.h"
#include "data/windows.h"
#include "parallel/comm.h"
#include "sampler_fixtures.h"

using namespace ctx;
using namespace ctx::test;

namespace {

constexpr int64_t kLt = 16;

// 12 documents of 150..480 tokens: token j of doc d is (d * 31 + j * 7) % 259.
std::shared_ptr<MemoryDocs> test_docs() {
    std::vector<std::vector<int32_t>> docs;
    for (int d = 0; d < 12; ++d) {
        std::vector<int32_t> t(static_cast<size_t>(150 + 30 * d));
        for (size_t j = 0; j < t.size(); ++j) t[j] = static_cast<int32_t>((d * 31 + j * 7) % 259);
        docs.push_back(std::move(t));
    }
    return std::make_shared<MemoryDocs>(std::move(docs), 259);
}

RowStreamConfig config(int B, int64_t window, uint64_t seed = 9, int rank = 0, int world = 1) {
    RowStreamConfig c;
    c.window_len = window;
    c.row_len = kLt;
    c.batch_size = B;
    c.seed = seed;
    c.rank = rank;
    c.world = world;
    return c;
}

// 25% full rows of Lt from the window start, 75% chunk-0.25 rows.
std::unique_ptr<MixSampler> full_and_chunk(int64_t chunk_window = 0) {
    std::vector<MixChild> kids;
    kids.push_back(MixChild{1.0, 0, make_sampler("full")});
    kids.push_back(MixChild{3.0, chunk_window, make_sampler("chunk", {{"alpha", 0.25}})});
    return std::make_unique<MixSampler>(std::move(kids));
}

Row run(RowSampler& s, const std::vector<int32_t>& window, uint64_t words[4]) {
    Row r;
    r.tokens.assign(kLt, -1);
    r.targets.assign(kLt, -1);
    r.positions.assign(kLt, -1);
    r.mask.assign(kLt, -1);
    ctx_sample_row row{r.tokens.data(), r.positions.data(), r.targets.data(), r.mask.data(), kLt,
                       nullptr};
    s.sample(window.data(), static_cast<int64_t>(window.size()) - 1, words, row);
    return r;
}

bool same_row(const Row& a, const Row& b) {
    return a.tokens == b.tokens && a.targets == b.targets && a.positions == b.positions &&
           a.mask == b.mask;
}

bool same(const BatchBuffers& a, const BatchBuffers& b) {
    return a.tokens == b.tokens && a.targets == b.targets && a.positions == b.positions &&
           a.mask == b.mask;
}

}  // namespace

TEST(MixSampler, ChoiceFrequenciesFollowTheWeights) {
    std::vector<MixChild> kids;
    for (double w : {1.0, 2.0, 5.0}) kids.push_back(MixChild{w, 0, make_sampler("full")});
    MixSampler mix(std::move(kids));
    EXPECT_NEAR(mix.probability(0), 1.0 / 8, 1e-12);
    EXPECT_NEAR(mix.probability(2), 5.0 / 8, 1e-12);
    const int n = 40000;
    std::vector<int> count(3, 0);
    for (int i = 0; i < n; ++i) {
        auto st = Rng(1000 + i).state().words;
        ++count[static_cast<size_t>(mix.choose(st.data()))];
    }
    double chi2 = 0;
    for (int k = 0; k < 3; ++k) {
        const double e = n * mix.probability(k);
        chi2 += (count[k] - e) * (count[k] - e) / e;
    }
    EXPECT_LT(chi2, 13.8) << "chi-square with 2 degrees of freedom, p = 0.001";
}

TEST(MixSampler, EachRowIsExactlyTheChosenChildsRowFromTheRemainingStream) {
    auto mix = full_and_chunk();
    auto full = make_sampler("full");
    auto chunk = make_sampler("chunk", {{"alpha", 0.25}});
    const std::vector<int32_t> window = test_window(64);
    int fulls = 0;
    for (uint64_t seed = 1; seed <= 400; ++seed) {
        auto st = Rng(seed).state().words;
        const Row got = run(*mix, window, st.data());
        // Replay: one draw picks the child, the child continues from the advanced state.
        auto replay = Rng(seed).state().words;
        const int child = mix->choose(replay.data());
        const Row want = run(child == 0 ? static_cast<RowSampler&>(*full) : *chunk, window,
                             replay.data());
        ASSERT_TRUE(same_row(got, want)) << "seed " << seed;
        EXPECT_EQ(st, replay) << "the mix consumed the same draws as the replay";
        if (child == 0) {
            ++fulls;
            for (int64_t t = 0; t < kLt; ++t) EXPECT_EQ(got.positions[t], t);
        }
    }
    EXPECT_GT(fulls, 60);  // ~100 of 400 expected
    EXPECT_LT(fulls, 140);
    EXPECT_EQ(mix->counts()[0], fulls);
    EXPECT_EQ(mix->counts()[1], 400 - fulls);
}

TEST(MixSampler, AChildWindowIsAPrefixOfTheStreamWindow) {
    auto mix = full_and_chunk(/*chunk_window=*/32);  // chunk rows from Le = 32 in windows of 128
    const std::vector<int32_t> window = test_window(128);
    for (uint64_t seed = 1; seed <= 300; ++seed) {
        auto st = Rng(seed).state().words;
        const Row r = run(*mix, window, st.data());
        for (int64_t t = 0; t < kLt; ++t) {
            const auto p = static_cast<int64_t>(r.positions[t]);
            EXPECT_LT(p, 32) << "seed " << seed;
            EXPECT_EQ(r.tokens[t], window[p]);
            if (r.mask[t] == 1.0f && (t + 1 == kLt || r.positions[t + 1] == p + 1)) {
                EXPECT_EQ(r.targets[t], window[p + 1]);
            }
        }
    }
}

TEST(MixSampler, NestedMixesAndBadChildrenAreReported) {
    std::vector<MixChild> inner;
    inner.push_back(MixChild{1, 0, make_sampler("full")});
    inner.push_back(MixChild{1, 0, make_sampler("randomized")});
    std::vector<MixChild> outer;
    outer.push_back(MixChild{1, 0, std::make_unique<MixSampler>(std::move(inner))});
    outer.push_back(MixChild{1, 0, make_sampler("chunk", {{"alpha", 0.5}})});
    MixSampler nested(std::move(outer));
    EXPECT_EQ(nested.name(),
              "mix(0.5 mix(0.5 sampler/full, 0.5 sampler/randomized), 0.5 sampler/chunk)");
    const auto w = test_window(64);
    for (uint64_t seed = 1; seed <= 50; ++seed) {
        auto st = Rng(seed).state().words;
        run(nested, w, st.data());  // rows are validated by each plugin wrapper
    }

    EXPECT_NE(error_of([] { MixSampler m({}); }).find("at least one child"), std::string::npos);
    for (double bad : {0.0, -1.0, double(NAN), double(INFINITY)}) {
        std::vector<MixChild> k;
        k.push_back(MixChild{bad, 0, make_sampler("full")});
        EXPECT_NE(error_of([&] { MixSampler m(std::move(k)); }).find("finite weight > 0"),
                  std::string::npos) << bad;
    }
    auto big = full_and_chunk(/*chunk_window=*/100);
    EXPECT_NE(error_of([&] { big->trial(w.data(), 64, kLt); }).find("wants windows of 100"),
              std::string::npos);
    // The trial reaches every child: chunk-1/32 of 16 tokens would need segments of half a token.
    std::vector<MixChild> k;
    k.push_back(MixChild{99, 0, make_sampler("full")});
    k.push_back(MixChild{1, 0, make_sampler("chunk", {{"alpha", 0.03125}})});
    MixSampler rare(std::move(k));
    EXPECT_NE(error_of([&] { rare.trial(w.data(), 64, kLt); }).find("sampler/chunk"),
              std::string::npos);
}

TEST(MixSampler, StreamOfMixedRowsIsDeterministicAndRankSplitInvariant) {
    auto docs = test_docs();
    const int64_t Le = 64;
    auto mix_a = full_and_chunk(), mix_b = full_and_chunk(), mix_0 = full_and_chunk(),
         mix_1 = full_and_chunk();
    RowStream one(*docs, make_windows(*docs, Le), *mix_a, config(4, Le));
    RowStream again(*docs, make_windows(*docs, Le), *mix_b, config(4, Le));
    RowStream r0(*docs, make_windows(*docs, Le), *mix_0, config(2, Le, 9, 0, 2));
    RowStream r1(*docs, make_windows(*docs, Le), *mix_1, config(2, Le, 9, 1, 2));
    for (int step = 0; step < 12; ++step) {
        BatchBuffers a, b, x0, x1;
        one.next(a);
        again.next(b);
        r0.next(x0);
        r1.next(x1);
        ASSERT_TRUE(same(a, b)) << "step " << step;
        BatchBuffers joined;
        joined.resize(4, kLt);
        for (auto [src, off] : {std::pair{&x0, 0}, std::pair{&x1, 2}}) {
            std::copy(src->tokens.begin(), src->tokens.end(), joined.tokens.begin() + off * kLt);
            std::copy(src->targets.begin(), src->targets.end(), joined.targets.begin() + off * kLt);
            std::copy(src->positions.begin(), src->positions.end(), joined.positions.begin() + off * kLt);
            std::copy(src->mask.begin(), src->mask.end(), joined.mask.begin() + off * kLt);
        }
        ASSERT_TRUE(same(a, joined)) << "step " << step;
    }
}

TEST(Curriculum, StagesFollowTheStepCountAndEachIsItsOwnRowStream) {
    auto docs = test_docs();
    const std::vector<CurriculumStage> stages = {{3, 32}, {2, 64}, {0, 128}};
    auto chunk = [] { return make_sampler("chunk", {{"alpha", 0.25}}); };
    CurriculumSource cur(docs, chunk(), stages, config(4, 0));
    EXPECT_EQ(cur.stage_of(0), 0u);
    EXPECT_EQ(cur.stage_of(2), 0u);
    EXPECT_EQ(cur.stage_of(3), 1u);
    EXPECT_EQ(cur.stage_of(4), 1u);
    EXPECT_EQ(cur.stage_of(5), 2u);
    EXPECT_EQ(cur.stage_of(1000), 2u);
    // Reference: plain row streams over each stage's windows with the stage seeds.
    std::vector<std::unique_ptr<SamplerPlugin>> samplers;
    std::vector<std::unique_ptr<RowStream>> refs;
    for (size_t k = 0; k < stages.size(); ++k) {
        samplers.push_back(chunk());
        refs.push_back(std::make_unique<RowStream>(
            *docs, make_windows(*docs, stages[k].window), *samplers.back(),
            config(4, stages[k].window, curriculum_stage_seed(9, k))));
    }
    EXPECT_EQ(curriculum_stage_seed(9, 0), 9u);
    EXPECT_NE(curriculum_stage_seed(9, 1), curriculum_stage_seed(9, 2));
    for (int b = 0; b < 9; ++b) {
        const size_t k = b < 3 ? 0 : b < 5 ? 1 : 2;
        EXPECT_EQ(cur.current_stage(), k);
        EXPECT_EQ(cur.num_windows(), refs[k]->num_windows());
        BatchBuffers got, want;
        cur.next(got, 4, kLt);
        refs[k]->next(want);
        ASSERT_TRUE(same(got, want)) << "batch " << b;
        float max_pos = 0;
        for (float p : got.positions) max_pos = std::max(max_pos, p);
        EXPECT_LT(max_pos, stages[k].window);
    }
}

TEST(Curriculum, ResumeMidStageAndAtABoundaryContinuesExactly) {
    auto docs = test_docs();
    const std::vector<CurriculumStage> stages = {{3, 32}, {0, 64}};
    auto comm = make_single_comm();
    for (int cut : {1, 3, 5}) {  // inside stage 1, at the boundary, inside stage 2
        CurriculumSource a(docs, make_sampler("chunk", {{"alpha", 0.25}}), stages, config(4, 0));
        BatchBuffers x;
        for (int b = 0; b < cut; ++b) a.next(x, 4, kLt);
        TrainingState saved;
        a.save(saved, *comm);
        CurriculumSource b(docs, make_sampler("chunk", {{"alpha", 0.25}}), stages, config(4, 0));
        b.restore(saved, *comm);
        EXPECT_EQ(b.batches(), cut);
        for (int i = 0; i < 6; ++i) {
            BatchBuffers p, q;
            a.next(p, 4, kLt);
            b.next(q, 4, kLt);
            ASSERT_TRUE(same(p, q)) << "cut " << cut << ", batch " << cut + i;
        }
    }
}

TEST(Curriculum, MismatchedStatesAndBadStagesAreErrors) {
    auto docs = test_docs();
    auto comm = make_single_comm();
    CurriculumSource a(docs, make_sampler("full"), {{2, 32}, {0, 64}}, config(4, 0));
    TrainingState cur_state;
    a.save(cur_state, *comm);
    CurriculumSource other(docs, make_sampler("full"), {{3, 32}, {0, 64}}, config(4, 0));
    EXPECT_NE(error_of([&] { other.restore(cur_state, *comm); }).find("different stages"),
              std::string::npos);
    RowStreamSource plain(docs, make_sampler("full"), make_windows(*docs, 32), config(4, 32));
    EXPECT_NE(error_of([&] { plain.restore(cur_state, *comm); }).find("curriculum"),
              std::string::npos);
    TrainingState plain_state;
    plain.save(plain_state, *comm);
    EXPECT_NE(error_of([&] { a.restore(plain_state, *comm); }).find("single row stream"),
              std::string::npos);
    TrainingState cut = cur_state;
    cut.sampler_state.resize(12);
    EXPECT_NE(error_of([&] { a.restore(cut, *comm); }).find("truncated"), std::string::npos);

    auto make = [&](std::vector<CurriculumStage> s) {
        return error_of([&] { CurriculumSource c(docs, make_sampler("full"), s, config(4, 0)); });
    };
    EXPECT_NE(make({}).find("at least one stage"), std::string::npos);
    EXPECT_NE(make({{0, 32}, {0, 64}}).find("steps must be positive"), std::string::npos);
    EXPECT_NE(make({{2, 8}, {0, 64}}).find("shorter than the row length"), std::string::npos);
    EXPECT_NE(make({{2, 32}, {0, 100000}}).find("cannot fill one global batch"),
              std::string::npos);
}
