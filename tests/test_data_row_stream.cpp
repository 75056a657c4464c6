// The row stream (deterministic, restartable, rank-split invariant) and the eval iterator.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <set>

#include "data/byte_tokenizer.h"
#include "data/corpus.h"
#include "data/row_stream.h"
#include "sampler_fixtures.h"

using namespace ctx;
using namespace ctx::test;

namespace {

constexpr int64_t kLe = 32, kLt = 16;

// 9 documents of 40..290 tokens: token j of doc d is (d * 31 + j * 7) % 259.
MemoryDocs test_docs() {
    std::vector<std::vector<int32_t>> docs;
    for (int d = 0; d < 9; ++d) {
        std::vector<int32_t> t(static_cast<size_t>(40 + 31 * d));
        for (size_t j = 0; j < t.size(); ++j) t[j] = static_cast<int32_t>((d * 31 + j * 7) % 259);
        docs.push_back(std::move(t));
    }
    return MemoryDocs(std::move(docs), 259);
}

RowStreamConfig config(int B, int rank = 0, int world = 1, uint64_t seed = 5,
                       int64_t row_len = kLt) {
    RowStreamConfig c;
    c.window_len = kLe;
    c.row_len = row_len;
    c.batch_size = B;
    c.rank = rank;
    c.world = world;
    c.seed = seed;
    return c;
}

bool same(const BatchBuffers& a, const BatchBuffers& b) {
    return a.B == b.B && a.T == b.T && a.tokens == b.tokens && a.targets == b.targets &&
           a.positions == b.positions && a.mask == b.mask;
}

// Rows [first, first + n) of a batch as a standalone batch.
BatchBuffers rows(const BatchBuffers& x, int first, int n) {
    BatchBuffers r;
    r.resize(n, x.T);
    const size_t off = static_cast<size_t>(first) * x.T, len = static_cast<size_t>(n) * x.T;
    std::copy_n(x.tokens.begin() + off, len, r.tokens.begin());
    std::copy_n(x.targets.begin() + off, len, r.targets.begin());
    std::copy_n(x.positions.begin() + off, len, r.positions.begin());
    std::copy_n(x.mask.begin() + off, len, r.mask.begin());
    return r;
}

}  // namespace

TEST(DataRowStream, WindowsAndEpochShape) {
    const MemoryDocs docs = test_docs();
    const auto windows = make_windows(docs, kLe);
    // floor((n - 1) / 32) for n = 40, 71, ..., 288: 1+2+3+4+5+6+7+8+8
    EXPECT_EQ(windows.size(), 44u);
    auto s = make_sampler("chunk");
    RowStream stream(docs, windows, *s, config(3));
    EXPECT_EQ(stream.global_batch(), 3);
    EXPECT_EQ(stream.batches_per_epoch(), 14);  // 42 rows, two windows skipped per epoch
}

TEST(DataRowStream, DeterministicAndTheRowsAreWhatTheSamplerMakesOfTheEpochOrder) {
    const MemoryDocs docs = test_docs();
    const auto windows = make_windows(docs, kLe);
    auto s = make_sampler("chunk", {{"alpha", 0.25}});
    RowStream a(docs, windows, *s, config(4)), b(docs, windows, *s, config(4));
    BatchBuffers x, y;
    const auto order = epoch_order(static_cast<int64_t>(windows.size()), 5, 0);
    for (int step = 0; step < 3; ++step) {
        a.next(x);
        b.next(y);
        ASSERT_TRUE(same(x, y)) << "step " << step;
        ASSERT_EQ(x.B, 4);
        ASSERT_EQ(x.T, kLt);
        for (int r = 0; r < 4; ++r) {
            // Row r of step `step` is window order[step*4 + r], sampled with the rng state
            // seeded from (seed, epoch 0, that global row index).
            const int64_t row = step * 4 + r;
            const Window& w = windows[static_cast<size_t>(order[static_cast<size_t>(row)])];
            std::vector<int32_t> win(kLe + 1);
            docs.read(w.doc, w.start, kLe + 1, win.data());
            const Row want = sample_row(*s, win, kLt, row_rng_seed(5, 0, row));
            const BatchBuffers got = rows(x, r, 1);
            EXPECT_EQ(got.tokens, want.tokens);
            EXPECT_EQ(got.positions, want.positions);
            EXPECT_EQ(got.targets, want.targets);
            EXPECT_EQ(got.mask, want.mask);
        }
    }
    // Another seed: another order.
    RowStream c(docs, windows, *s, config(4, 0, 1, 6));
    c.next(y);
    a.set_cursor({0, 0});
    a.next(x);
    EXPECT_FALSE(same(x, y));
    EXPECT_NE(epoch_order(40, 5, 0), epoch_order(40, 6, 0));
    EXPECT_NE(epoch_order(40, 5, 0), epoch_order(40, 5, 1));
}

TEST(DataRowStream, RestartFromASavedCursorContinuesIdentically) {
    const MemoryDocs docs = test_docs();
    const auto windows = make_windows(docs, kLe);
    auto s = make_sampler("chunk", {{"alpha", 0.5}, {"boundary", std::string("mask")}});
    RowStream a(docs, windows, *s, config(6));  // 7 batches per epoch
    BatchBuffers x, y;
    std::vector<BatchBuffers> tail;
    StreamCursor saved;
    for (int step = 0; step < 16; ++step) {
        if (step == 4) saved = a.cursor();
        a.next(x);
        if (step >= 4) tail.push_back(x);
    }
    EXPECT_EQ(saved, (StreamCursor{0, 24}));
    RowStream b(docs, windows, *s, config(6));
    b.set_cursor(saved);
    for (size_t i = 0; i < tail.size(); ++i) {  // crosses two epoch boundaries
        b.next(y);
        ASSERT_TRUE(same(y, tail[i])) << "step " << 4 + i;
    }
    EXPECT_EQ(b.cursor(), a.cursor());
}

TEST(DataRowStream, OneRankWithTwoBEqualsTwoRanksWithB) {
    const MemoryDocs docs = test_docs();
    const auto windows = make_windows(docs, kLe);
    auto s = make_sampler("chunk", {{"alpha", 0.25}, {"boundary", std::string("next")}});
    RowStream one(docs, windows, *s, config(6));
    RowStream r0(docs, windows, *s, config(3, 0, 2)), r1(docs, windows, *s, config(3, 1, 2));
    BatchBuffers g, a, b;
    for (int step = 0; step < 16; ++step) {  // 7 per epoch: through two wraps
        one.next(g);
        r0.next(a);
        r1.next(b);
        ASSERT_TRUE(same(rows(g, 0, 3), a)) << "rank 0, step " << step;
        ASSERT_TRUE(same(rows(g, 3, 3), b)) << "rank 1, step " << step;
        ASSERT_EQ(one.cursor(), r0.cursor());
        ASSERT_EQ(one.cursor(), r1.cursor());
    }
}

TEST(DataRowStream, EpochWrapDropsTheIncompleteTail) {
    const MemoryDocs docs = test_docs();
    const auto windows = make_windows(docs, kLe);  // 44 windows
    auto s = make_sampler("full");                 // row == window: rows identify windows
    RowStream st(docs, windows, *s, config(7, 0, 1, 5, kLe));
    EXPECT_EQ(st.batches_per_epoch(), 6);  // 42 rows, 2 skipped
    BatchBuffers x;
    for (int64_t epoch = 0; epoch < 2; ++epoch) {
        const auto order = epoch_order(44, 5, epoch);
        std::set<std::vector<int32_t>> seen;
        for (int step = 0; step < 6; ++step) {
            EXPECT_EQ(st.cursor(), (StreamCursor{epoch, step * 7}));
            st.next(x);
            for (int r = 0; r < 7; ++r) {
                const Window& w = windows[static_cast<size_t>(order[static_cast<size_t>(step * 7 + r)])];
                std::vector<int32_t> win(kLe + 1);
                docs.read(w.doc, w.start, kLe + 1, win.data());
                const BatchBuffers got = rows(x, r, 1);
                ASSERT_EQ(got.tokens, std::vector<int32_t>(win.begin(), win.end() - 1));
                ASSERT_EQ(got.targets, std::vector<int32_t>(win.begin() + 1, win.end()));
                seen.insert(got.tokens);
            }
        }
        EXPECT_EQ(seen.size(), 42u) << "no window twice within an epoch";
        EXPECT_EQ(st.cursor(), (StreamCursor{epoch + 1, 0})) << "wrapped at 42 of 44";
    }
    // A cursor inside the tail that cannot hold a batch moves to the next epoch.
    st.set_cursor({3, 38});
    EXPECT_EQ(st.cursor(), (StreamCursor{4, 0}));
    st.set_cursor({3, 37});
    EXPECT_EQ(st.cursor(), (StreamCursor{3, 37})) << "37 + 7 <= 44 still fits";
    EXPECT_THROW(st.set_cursor({0, 45}), Error);
    EXPECT_THROW(st.set_cursor({-1, 0}), Error);
}

TEST(DataRowStream, RejectsConfigurationsThatCannotWork) {
    const MemoryDocs docs = test_docs();
    auto s = make_sampler("full");
    const auto windows = make_windows(docs, kLe);
    const std::string msg = error_of([&] { RowStream(docs, windows, *s, config(23, 0, 2)); });
    EXPECT_NE(msg.find("44 windows of length 32 cannot fill one global batch of 46 rows"),
              std::string::npos) << msg;
    EXPECT_THROW(RowStream(docs, windows, *s, config(2, 2, 2)), Error);  // rank >= world
    EXPECT_THROW(RowStream(docs, make_windows(docs, 16), *s, config(2)), Error)
        << "windows made for Le = 16 cannot hold 32 + 1 tokens at their last start";
}

TEST(DataRowStream, EvalIteratorVisitsEveryWindowInOrder) {
    const MemoryDocs docs = test_docs();
    const auto windows = make_windows(docs, kLe);
    EvalIterator it(docs, windows, kLe, 16);
    BatchBuffers x;
    std::vector<int> sizes;
    int64_t w = 0;
    for (int n; (n = it.next(x)) > 0;) {
        sizes.push_back(n);
        for (int r = 0; r < 16; ++r) {
            const size_t off = static_cast<size_t>(r) * kLe;
            if (r >= n) {  // padding rows of the last batch
                for (int t = 0; t < kLe; ++t) ASSERT_EQ(x.mask[off + t], 0.0f);
                continue;
            }
            const Window& win = windows[static_cast<size_t>(w++)];
            for (int t = 0; t < kLe; ++t) {
                ASSERT_EQ(x.tokens[off + t], (win.doc * 31 + (win.start + t) * 7) % 259);
                ASSERT_EQ(x.targets[off + t], (win.doc * 31 + (win.start + t + 1) * 7) % 259);
                ASSERT_EQ(x.positions[off + t], static_cast<float>(t));
                ASSERT_EQ(x.mask[off + t], 1.0f);
            }
        }
    }
    EXPECT_EQ(sizes, (std::vector<int>{16, 16, 12}));
    EXPECT_EQ(it.position(), 44);
    EXPECT_EQ(it.next(x), 0);
    it.reset();
    EXPECT_EQ(it.next(x), 16);
}

// End to end: corpus -> byte tokens -> shard on disk -> windows -> chunk rows.
TEST(DataRowStream, RowsFromARealShard) {
    CorpusOptions o;
    o.n_docs = 6;
    o.min_len = 600;
    o.max_len = 1200;
    ByteTokenizer tok;
    std::vector<std::vector<int32_t>> docs;
    for (const auto& d : generate_corpus(o)) docs.push_back(tok.encode(d.text));
    const std::string path = (std::filesystem::temp_directory_path() /
                              ("ctx_test_rows_" + std::to_string(::getpid()) + ".shard")).string();
    write_shard(path, docs, tok.vocab_size());
    {
        ShardReader shard(path);
        const auto windows = make_windows(shard, 128);
        int64_t expect = 0;
        for (const auto& d : docs) expect += windows_in_doc(static_cast<int64_t>(d.size()), 128);
        ASSERT_EQ(static_cast<int64_t>(windows.size()), expect);
        auto s = make_sampler("chunk", {{"alpha", 0.25}});
        RowStreamConfig c;
        c.window_len = 128;
        c.row_len = 32;
        c.batch_size = 4;
        c.seed = 3;
        RowStream st(shard, windows, *s, c);
        const auto order = epoch_order(static_cast<int64_t>(windows.size()), 3, 0);
        BatchBuffers x;
        for (int step = 0; step < 3; ++step) {
            st.next(x);
            for (int r = 0; r < 4; ++r) {
                const Window& w = windows[static_cast<size_t>(order[static_cast<size_t>(step * 4 + r)])];
                for (int t = 0; t < 32; ++t) {
                    const size_t i = static_cast<size_t>(r) * 32 + t;
                    const auto p = static_cast<int64_t>(x.positions[i]);
                    ASSERT_EQ(x.tokens[i], docs[static_cast<size_t>(w.doc)][static_cast<size_t>(w.start + p)]);
                }
            }
        }
    }
    std::filesystem::remove(path);
}

// Resuming on another number of ranks (2 -> 1 -> 3, with different rows per rank): the global
// row stream continues where it stopped, no row repeated or skipped within an epoch; every row
// is the one the one-process stream makes at that global index (its sampler seed depends on the
// index only). Only the end of an epoch depends on the global batch (drop-last).
TEST(DataRowStream, ResumeAcrossWorldSizesContinuesTheGlobalRowStream) {
    const MemoryDocs docs = test_docs();
    const auto windows = make_windows(docs, kLe);  // 44
    auto s = make_sampler("chunk", {{"alpha", 0.25}});
    RowStream reference(docs, windows, *s, config(1));  // one row per batch: the global order
    std::vector<BatchBuffers> want;
    for (int i = 0; i < 40; ++i) {
        BatchBuffers b;
        reference.next(b);
        want.push_back(b);
    }
    // phases: (world, rows per rank, batches)
    const int phases[][3] = {{2, 3, 2}, {1, 3, 3}, {3, 2, 3}};
    StreamCursor cursor;
    size_t row = 0;
    for (const auto& [W, B, batches] : phases) {
        std::vector<std::unique_ptr<RowStream>> ranks;
        for (int r = 0; r < W; ++r) {
            ranks.push_back(std::make_unique<RowStream>(docs, windows, *s, config(B, r, W)));
            ranks.back()->set_cursor(cursor);
        }
        for (int k = 0; k < batches; ++k)
            for (int r = 0; r < W; ++r) {
                BatchBuffers x;
                ranks[static_cast<size_t>(r)]->next(x);
                for (int i = 0; i < B; ++i, ++row)
                    ASSERT_TRUE(same(rows(x, i, 1), want[row]))
                        << "world " << W << " batch " << k << " rank " << r << " row " << i;
            }
        cursor = ranks.front()->cursor();
        for (const auto& rk : ranks) EXPECT_EQ(rk->cursor(), cursor) << "ranks agree";
    }
    EXPECT_EQ(row, size_t(2 * 2 * 3 + 3 * 3 + 3 * 3 * 2));  // 39 rows, all of epoch 0
    // 5 of the 44 windows are left, fewer than a global batch of 6: the next epoch begins
    EXPECT_EQ(cursor, (StreamCursor{1, 0}));
}
