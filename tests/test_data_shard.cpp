// Token shards: round trips in both token widths, atomic writes, and clear errors (never a
// crash) for truncated or corrupted files.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "data/shard.h"

using namespace ctx;
namespace fs = std::filesystem;

namespace {

class ShardTest : public ::testing::Test {
protected:
    void SetUp() override {
        dir_ = fs::temp_directory_path() /
               ("ctx_test_shard_" + std::to_string(::getpid()) + "_" +
                ::testing::UnitTest::GetInstance()->current_test_info()->name());
        fs::remove_all(dir_);
        fs::create_directories(dir_);
    }
    void TearDown() override { fs::remove_all(dir_); }
    std::string path(const std::string& name) const { return (dir_ / name).string(); }
    fs::path dir_;
};

std::vector<std::vector<int32_t>> sample_docs(int32_t vocab) {
    return {{1, 2, 3}, {}, {vocab - 1, 0, vocab / 2, 7, 7}, {}, {42}};
}

std::vector<uint8_t> read_bytes(const std::string& p) {
    std::ifstream f(p, std::ios::binary);
    return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

void write_bytes(const std::string& p, const std::vector<uint8_t>& b) {
    std::ofstream f(p, std::ios::binary | std::ios::trunc);
    f.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
}

// The ctx::Error message of opening p ("" if it opens).
std::string open_error(const std::string& p, bool verify = true) {
    try {
        ShardReader r(p, verify);
    } catch (const Error& e) {
        return e.what();
    }
    return "";
}

void expect_same_docs(const ShardReader& r, const std::vector<std::vector<int32_t>>& docs) {
    ASSERT_EQ(r.n_docs(), static_cast<int64_t>(docs.size()));
    int64_t total = 0;
    for (size_t d = 0; d < docs.size(); ++d) {
        const auto di = static_cast<int64_t>(d);
        ASSERT_EQ(r.doc_len(di), static_cast<int64_t>(docs[d].size()));
        const DocView v = r.doc(di);
        ASSERT_EQ(v.length, static_cast<int64_t>(docs[d].size()));
        std::vector<int32_t> copy(docs[d].size());
        r.read(di, 0, v.length, copy.data());
        EXPECT_EQ(copy, docs[d]);
        for (size_t j = 0; j < docs[d].size(); ++j) {
            EXPECT_EQ(v[static_cast<int64_t>(j)], docs[d][j]);
            EXPECT_EQ(r.token(di, static_cast<int64_t>(j)), docs[d][j]);
        }
        total += v.length;
    }
    EXPECT_EQ(r.n_tokens(), total);
}

}  // namespace

TEST_F(ShardTest, RoundTripUint16WithEmptyDocs) {
    const auto docs = sample_docs(259);
    write_shard(path("a.shard"), docs, 259);
    ShardReader r(path("a.shard"));
    EXPECT_EQ(r.token_bytes(), 2);
    EXPECT_EQ(r.vocab_size(), 259);
    expect_same_docs(r, docs);
    // 64-byte header, 12 tokens * 2 = 24 bytes (88, already 8-aligned), 6 offsets * 8.
    EXPECT_EQ(fs::file_size(path("a.shard")), 64u + 24u + 48u);
    const auto b = read_bytes(path("a.shard"));
    EXPECT_EQ(std::string(b.begin(), b.begin() + 8), "CTXSHRD1");
    std::vector<int32_t> part(2);
    r.read(2, 3, 2, part.data());
    EXPECT_EQ(part, (std::vector<int32_t>{7, 7}));
}

TEST_F(ShardTest, RoundTripUint32AndTheWidthBoundary) {
    const auto docs = sample_docs(70000);
    write_shard(path("w.shard"), docs, 70000);
    ShardReader r(path("w.shard"));
    EXPECT_EQ(r.token_bytes(), 4);
    EXPECT_EQ(r.token(2, 0), 69999);
    expect_same_docs(r, docs);

    write_shard(path("b16.shard"), {{65534, 0}}, 65535);
    EXPECT_EQ(ShardReader(path("b16.shard")).token_bytes(), 2);
    EXPECT_EQ(ShardReader(path("b16.shard")).token(0, 0), 65534);
    write_shard(path("b32.shard"), {{65535, 1}}, 65536);
    EXPECT_EQ(ShardReader(path("b32.shard")).token_bytes(), 4);
    EXPECT_EQ(ShardReader(path("b32.shard")).token(0, 0), 65535);
}

TEST_F(ShardTest, OddTokenCountKeepsTheIndexAligned) {
    const std::vector<std::vector<int32_t>> docs = {{5, 6, 7}};  // 6 token bytes -> pad 2
    write_shard(path("odd.shard"), docs, 259);
    EXPECT_EQ(fs::file_size(path("odd.shard")), 64u + 8u + 16u);
    expect_same_docs(ShardReader(path("odd.shard")), docs);
}

TEST_F(ShardTest, EmptyShard) {
    write_shard(path("e.shard"), {}, 259);
    ShardReader r(path("e.shard"));
    EXPECT_EQ(r.n_docs(), 0);
    EXPECT_EQ(r.n_tokens(), 0);
    EXPECT_THROW(r.doc(0), Error);
}

TEST_F(ShardTest, OverwritesAtomicallyAndLeavesNoTempFiles) {
    write_shard(path("s.shard"), {{1, 2}}, 259);
    ShardReader old_map(path("s.shard"));  // a reader mapped before the rewrite keeps its view
    write_shard(path("s.shard"), {{9, 9, 9}}, 259);
    EXPECT_EQ(ShardReader(path("s.shard")).doc_len(0), 3);
    EXPECT_EQ(old_map.token(0, 1), 2);
    int files = 0;
    for (const auto& e : fs::directory_iterator(dir_)) {
        ++files;
        EXPECT_EQ(e.path().filename(), "s.shard");
    }
    EXPECT_EQ(files, 1);
}

TEST_F(ShardTest, WriteRejectsTokensOutsideTheVocabularyAndLeavesNothing) {
    try {
        write_shard(path("bad.shard"), {{1, 2}, {3, 259}}, 259);
        FAIL();
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find(path("bad.shard") + ": document 1 token 1 is 259, "
                                             "outside the vocabulary [0, 259)"),
                  std::string::npos) << e.what();
    }
    EXPECT_TRUE(fs::is_empty(dir_));
    const std::string msg = [&] {
        try {
            write_shard((dir_ / "no_such_dir" / "x.shard").string(), {{1}}, 259);
        } catch (const Error& e) {
            return std::string(e.what());
        }
        return std::string();
    }();
    EXPECT_NE(msg.find("cannot create"), std::string::npos) << msg;
}

TEST_F(ShardTest, TruncatedFilesAreClearErrors) {
    write_shard(path("t.shard"), sample_docs(259), 259);
    const auto full = read_bytes(path("t.shard"));
    for (size_t keep : {full.size() - 1, full.size() - 8, size_t{70}, size_t{64}, size_t{10},
                        size_t{0}}) {
        write_bytes(path("cut.shard"), std::vector<uint8_t>(full.begin(), full.begin() + keep));
        const std::string msg = open_error(path("cut.shard"));
        EXPECT_NE(msg.find(path("cut.shard")), std::string::npos) << keep << ": " << msg;
        if (keep >= 64) {
            EXPECT_NE(msg.find("truncated"), std::string::npos) << keep << ": " << msg;
        } else {
            EXPECT_NE(msg.find("shorter than the 64-byte header"), std::string::npos) << msg;
        }
    }
    auto longer = full;
    longer.push_back(0);
    write_bytes(path("long.shard"), longer);
    EXPECT_NE(open_error(path("long.shard")).find("but the header describes"), std::string::npos);
    EXPECT_NE(open_error(path("missing.shard")).find("cannot open shard"), std::string::npos);
}

TEST_F(ShardTest, CorruptedFilesAreClearErrors) {
    write_shard(path("c.shard"), sample_docs(259), 259);
    const auto good = read_bytes(path("c.shard"));
    auto corrupt = [&](size_t at, uint8_t value) {
        auto b = good;
        b[at] = value;
        write_bytes(path("x.shard"), b);
        return open_error(path("x.shard"));
    };
    EXPECT_NE(corrupt(0, 'X').find("not a ctxengine shard (bad magic)"), std::string::npos);
    for (size_t at : {size_t{16}, size_t{24}, size_t{33}, size_t{50}, size_t{60}})
        EXPECT_NE(corrupt(at, good[at] ^ 0x40).find("header checksum mismatch"),
                  std::string::npos) << "byte " << at;
    // The index: offsets[2] (doc 1's end) larger than offsets[3].
    const size_t index = 64 + 24;
    EXPECT_NE(corrupt(index + 2 * 8, 200).find("corrupt document index"), std::string::npos);
    EXPECT_NE(corrupt(index + 5 * 8, 99).find("corrupt document index"), std::string::npos);
    // A token beyond the vocabulary: 0xFFFF at token 0.
    auto b = good;
    b[64] = b[65] = 0xFF;
    write_bytes(path("tok.shard"), b);
    const std::string msg = open_error(path("tok.shard"));
    EXPECT_NE(msg.find(path("tok.shard") + ": token 0 is 65535, outside the vocabulary [0, 259)"),
              std::string::npos) << msg;
    EXPECT_EQ(open_error(path("tok.shard"), /*verify=*/false), "") << "checks can be skipped";
}

TEST_F(ShardTest, MovedReaderOwnsTheMapping) {
    write_shard(path("m.shard"), {{4, 5}}, 259);
    ShardReader a(path("m.shard"));
    ShardReader b(std::move(a));
    EXPECT_EQ(b.token(0, 1), 5);
    EXPECT_EQ(a.n_docs(), 0);  // NOLINT: the moved-from reader is empty, not dangling
    EXPECT_THROW(b.token(0, 2), Error);
    EXPECT_THROW(b.token(1, 0), Error);
}
