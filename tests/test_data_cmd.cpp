// `ctxengine data generate / info` through run_data_command.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "cli/data_cmd.h"
#include "data/byte_tokenizer.h"
#include "data/corpus.h"
#include "data/shard.h"
#include "data/windows.h"

using namespace ctx;
namespace fs = std::filesystem;

namespace {

struct TempDir {
    fs::path path = fs::temp_directory_path() / ("ctx_test_data_cmd_" + std::to_string(::getpid()));
    TempDir() { fs::remove_all(path); }
    ~TempDir() { fs::remove_all(path); }
};

std::string slurp(const fs::path& p) {
    std::ifstream f(p, std::ios::binary);
    return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

}  // namespace

TEST(DataCmd, GenerateWritesADocumentSplitOfTheCorpus) {
    TempDir tmp;
    const std::string out = (tmp.path / "corpus").string();
    const std::vector<std::string> args = {"generate", "--out", out, "--docs", "20",
                                           "--min-len", "500", "--max-len", "1500",
                                           "--seed", "3", "--val-fraction", "0.2"};
    testing::internal::CaptureStdout();
    ASSERT_EQ(run_data_command(args), 0);
    const std::string printed = testing::internal::GetCapturedStdout();
    EXPECT_NE(printed.find("train.shard: 16 docs"), std::string::npos) << printed;
    EXPECT_NE(printed.find("val.shard: 4 docs"), std::string::npos) << printed;

    ShardReader train(out + "/train.shard"), val(out + "/val.shard");
    EXPECT_EQ(train.n_docs(), 16);
    EXPECT_EQ(val.n_docs(), 4);
    EXPECT_EQ(train.vocab_size(), 259);
    EXPECT_EQ(train.token_bytes(), 2);
    // The shards hold exactly the corpus documents, split by document as split_documents says.
    CorpusOptions o;
    o.n_docs = 20;
    o.min_len = 500;
    o.max_len = 1500;
    o.seed = 3;
    const DocSplit split = split_documents(20, 0.2, 0.0, 3);
    ByteTokenizer tok;
    for (size_t i = 0; i < split.val.size(); ++i) {
        const auto want = tok.encode(generate_document(o, split.val[i]).text);
        std::vector<int32_t> got(static_cast<size_t>(val.doc_len(static_cast<int64_t>(i))));
        val.read(static_cast<int64_t>(i), 0, static_cast<int64_t>(got.size()), got.data());
        EXPECT_EQ(got, want) << "val doc " << i;
    }
    const auto first = tok.encode(generate_document(o, split.train[0]).text);
    ASSERT_EQ(train.doc_len(0), static_cast<int64_t>(first.size()));
    EXPECT_EQ(train.token(0, 5), first[5]);

    // Same flags, same bytes.
    const std::string once = slurp(out + "/train.shard");
    testing::internal::CaptureStdout();
    ASSERT_EQ(run_data_command(args), 0);
    testing::internal::GetCapturedStdout();
    EXPECT_EQ(slurp(out + "/train.shard"), once);

    testing::internal::CaptureStdout();
    EXPECT_EQ(run_data_command({"info", out + "/val.shard", "--le", "256,1024"}), 0);
    const std::string info = testing::internal::GetCapturedStdout();
    EXPECT_NE(info.find("2-byte tokens, vocab_size 259, 4 docs"), std::string::npos) << info;
    int64_t windows256 = 0;
    for (int64_t n : val.doc_lengths()) windows256 += windows_in_doc(n, 256);
    std::string needle = std::to_string(windows256);  // the "windows" column for Le 256
    needle = " " + needle;
    EXPECT_NE(info.find(needle + " "), std::string::npos) << info;
}

TEST(DataCmd, UsageAndFailureExitCodes) {
    TempDir tmp;
    testing::internal::CaptureStderr();
    EXPECT_EQ(run_data_command({}), 2);
    EXPECT_EQ(run_data_command({"explode"}), 2);
    EXPECT_EQ(run_data_command({"generate"}), 2);  // no --out
    EXPECT_EQ(run_data_command({"generate", "--out", tmp.path.string(), "--docs", "many"}), 2);
    EXPECT_EQ(run_data_command({"generate", "--out", tmp.path.string(), "--bogus", "1"}), 2);
    EXPECT_EQ(run_data_command({"generate", "--out", tmp.path.string(), "--min-len", "900",
                                "--max-len", "100"}), 2);
    EXPECT_EQ(run_data_command({"info"}), 2);
    EXPECT_EQ(run_data_command({"info", (tmp.path / "nope.shard").string()}), 1);
    const std::string err = testing::internal::GetCapturedStderr();
    EXPECT_NE(err.find("unknown data command 'explode'"), std::string::npos) << err;
    EXPECT_NE(err.find("--docs expects an integer, got 'many'"), std::string::npos) << err;
    EXPECT_NE(err.find("unknown option '--bogus'"), std::string::npos) << err;
    EXPECT_NE(err.find("min_len <= max_len"), std::string::npos) << err;
    EXPECT_NE(err.find("nope.shard: cannot open shard"), std::string::npos) << err;
}
