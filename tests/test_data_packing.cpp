// Document packing: every sampler reports where its tokens come from (ctx_sample_row.source,
// ABI 1.4), documents laid end to end (PackedDocs), and packed rows from the row stream: each
// token's document (doc_start), positions restarting or continuing, no loss on targets from the
// next document.
#include <gtest/gtest.h>

#include "data/packed_docs.h"
#include "data/row_stream.h"
#include "sampler_fixtures.h"

using namespace ctx;
using namespace ctx::test;

namespace {

// Token j of document d is 100 d + j: which document a token came from is readable.
std::shared_ptr<MemoryDocs> numbered_docs(const std::vector<int>& lengths) {
    std::vector<std::vector<int32_t>> docs;
    for (size_t d = 0; d < lengths.size(); ++d) {
        std::vector<int32_t> t(static_cast<size_t>(lengths[d]));
        for (size_t j = 0; j < t.size(); ++j) t[j] = static_cast<int32_t>(100 * d + j);
        docs.push_back(std::move(t));
    }
    return std::make_shared<MemoryDocs>(std::move(docs), 1000);
}

std::vector<int64_t> all_ids(const DocStore& d) {
    std::vector<int64_t> ids(static_cast<size_t>(d.n_docs()));
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int64_t>(i);
    return ids;
}

// The first row of the first batch of a packed stream over `lengths`.
BatchBuffers first_batch(const std::vector<int>& lengths, int64_t Le, int64_t Lt,
                         PackPositions pack, RowSampler& sampler, PackedDocs*& packed_out,
                         std::shared_ptr<PackedDocs>& keep, uint64_t seed = 3) {
    auto docs = numbered_docs(lengths);
    keep = std::make_shared<PackedDocs>(docs, all_ids(*docs));
    packed_out = keep.get();
    RowStreamConfig c;
    c.window_len = Le;
    c.row_len = Lt;
    c.batch_size = 1;
    c.seed = seed;
    c.pack = pack;
    // one window from the stream's start, so the row's documents are known
    RowStream s(*keep, {Window{0, 0}}, sampler, c);
    BatchBuffers out;
    s.next(out);
    return out;
}

}  // namespace

TEST(SamplerSource, EverySamplerReportsTheWindowIndexOfItsTokens) {
    const std::vector<int32_t> w = test_window(64);
    const std::vector<std::pair<std::string, std::map<std::string, SamplerOption>>> samplers = {
        {"full", {}}, {"chunk", {{"alpha", 0.25}}}, {"prefix", {{"alpha", 0.5}}},
        {"pose", {}}, {"randomized", {}}};
    for (const auto& [name, opts] : samplers) {
        auto s = make_sampler(name, opts);
        for (uint64_t seed = 1; seed <= 20; ++seed) {
            const Row r = sample_row(*s, w, 16, seed);
            for (size_t t = 0; t < r.tokens.size(); ++t) {
                ASSERT_GE(r.source[t], 0) << name << " token " << t;
                ASSERT_LT(r.source[t], 64) << name;
                EXPECT_EQ(r.tokens[t], w[static_cast<size_t>(r.source[t])]) << name << " " << t;
            }
        }
    }
}

TEST(PackedDocs, OneStreamOfTheDocumentsInOrder) {
    auto docs = numbered_docs({3, 0, 5, 2});
    const PackedDocs p(docs, {2, 0, 1, 3});  // the empty document is skipped
    EXPECT_EQ(p.n_docs(), 1);
    EXPECT_EQ(p.num_documents(), 3);
    EXPECT_EQ(p.doc_len(0), 10);
    std::vector<int32_t> got(10);
    p.read(0, 0, 10, got.data());
    EXPECT_EQ(got, (std::vector<int32_t>{200, 201, 202, 203, 204, 0, 1, 2, 300, 301}));
    p.read(0, 4, 5, got.data());  // across two boundaries
    EXPECT_EQ(std::vector<int32_t>(got.begin(), got.begin() + 5),
              (std::vector<int32_t>{204, 0, 1, 2, 300}));
    EXPECT_EQ(p.document_at(4).begin, 0);
    EXPECT_EQ(p.document_at(5).begin, 5);
    EXPECT_EQ(p.document_at(7).end, 8);
    EXPECT_THROW(p.document_at(10), Error);
    EXPECT_THROW(p.read(0, 8, 3, got.data()), Error);
}

TEST(PackedRows, FullRowsKnowTheirDocuments) {
    auto full = make_sampler("full", {}, 1000);
    PackedDocs* p = nullptr;
    std::shared_ptr<PackedDocs> keep;
    // documents of 4, 3, 6 and 9 tokens; the window covers [0, 12] of the stream
    for (PackPositions mode : {PackPositions::Restart, PackPositions::Continue}) {
        const BatchBuffers b = first_batch({4, 3, 6, 9}, 12, 12, mode, *full, p, keep);
        ASSERT_EQ(b.doc_start.size(), 12u);
        EXPECT_EQ(b.doc_start, (std::vector<int32_t>{0, 0, 0, 0, 4, 4, 4, 7, 7, 7, 7, 7}));
        EXPECT_EQ(b.tokens, (std::vector<int32_t>{0, 1, 2, 3, 100, 101, 102, 200, 201, 202, 203,
                                                  204}));
        const std::vector<float> restart = {0, 1, 2, 3, 0, 1, 2, 0, 1, 2, 3, 4};
        const std::vector<float> cont = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11};
        EXPECT_EQ(b.positions, mode == PackPositions::Restart ? restart : cont);
        // the last token of each document predicts the next document's first: not trained
        EXPECT_EQ(b.mask, (std::vector<float>{1, 1, 1, 0, 1, 1, 0, 1, 1, 1, 1, 1}));
        EXPECT_EQ(b.targets[2], 3);
        EXPECT_EQ(b.targets[11], 205);  // the window's extra token, same document
    }
}

TEST(PackedRows, ChunkRowsKeepGapsAndDocumentsInOrder) {
    auto chunk = make_sampler("chunk", {{"alpha", 0.25}}, 1000);
    PackedDocs* p = nullptr;
    std::shared_ptr<PackedDocs> keep;
    for (uint64_t seed = 1; seed <= 20; ++seed) {
        const BatchBuffers b = first_batch({5, 7, 3, 11, 6, 9, 30}, 32, 8, PackPositions::Restart,
                                           *chunk, p, keep, seed);
        for (int t = 0; t < 8; ++t) {
            const int32_t doc = b.tokens[t] / 100, first = b.doc_start[t];
            EXPECT_EQ(b.tokens[first] / 100, doc) << "token " << t << " and its document start";
            if (first > 0) {
                EXPECT_NE(b.tokens[first - 1] / 100, doc);
            }
            // restart positions: the token's index in its document (all start inside the window)
            EXPECT_EQ(b.positions[t], float(b.tokens[t] % 100)) << t;
            if (t + 1 < 8 && b.doc_start[t + 1] == t + 1) {
                EXPECT_EQ(b.mask[t], 0.0f) << t;
            }
        }
    }
}

TEST(PackedRows, RestartKeepsTheSamplersSpacing) {
    // sampler/randomized draws increasing positions with random gaps: restarting per document
    // moves each document's first token to its offset and keeps every gap after it
    auto rnd = make_sampler("randomized", {}, 1000);
    auto full = make_sampler("full", {}, 1000);
    PackedDocs* p = nullptr;
    std::shared_ptr<PackedDocs> keep;
    for (uint64_t seed = 1; seed <= 10; ++seed) {
        const BatchBuffers c = first_batch({5, 7, 3, 30}, 24, 12, PackPositions::Continue, *rnd,
                                           p, keep, seed);
        const BatchBuffers r = first_batch({5, 7, 3, 30}, 24, 12, PackPositions::Restart, *rnd,
                                           p, keep, seed);
        ASSERT_EQ(c.tokens, r.tokens);
        ASSERT_EQ(c.doc_start, r.doc_start);
        for (int t = 0; t < 12; ++t) {
            if (r.doc_start[t] == t) {  // a document's first row token: its index in the document
                EXPECT_NEAR(r.positions[t], float(r.tokens[t] % 100), 1e-4) << t;
            } else {
                EXPECT_NEAR(r.positions[t] - r.positions[t - 1], c.positions[t] - c.positions[t - 1],
                            1e-4) << "seed " << seed << " token " << t;
            }
        }
    }
    // a non-packed stream reusing the buffer drops the old layout
    auto docs = numbered_docs({40});
    RowStreamConfig cfg;
    cfg.window_len = 12, cfg.row_len = 12, cfg.batch_size = 1;
    RowStream plain(*docs, {Window{0, 0}}, *full, cfg);
    BatchBuffers buf = first_batch({4, 9}, 12, 12, PackPositions::Restart, *full, p, keep);
    ASSERT_FALSE(buf.doc_start.empty());
    plain.next(buf);
    EXPECT_TRUE(buf.doc_start.empty());
}

TEST(PackedRows, SamplersWithoutSourcesAreRefused) {
    // a sampler that reports no sources (an older plugin, a Lua sampler): a clear error
    struct NoSource final : RowSampler {
        const std::string& name() const override { return name_; }
        std::string name_ = "test/no_source";
        void sample(const int32_t* window, int64_t, uint64_t*, ctx_sample_row& row) override {
            for (int64_t t = 0; t < row.row_len; ++t) {
                row.tokens[t] = window[t];
                row.positions[t] = float(t);
                row.targets[t] = window[t + 1];
                row.loss_mask[t] = 1.0f;
            }
        }
    } none;
    PackedDocs* p = nullptr;
    std::shared_ptr<PackedDocs> keep;
    const std::string e = error_of([&] {
        first_batch({4, 9}, 12, 12, PackPositions::Restart, none, p, keep);
    });
    EXPECT_NE(e.find("the sampler gave no window index for token 0"), std::string::npos) << e;
}
