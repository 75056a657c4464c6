// Retention of step files in a run directory (io/checkpoint.h): the newest keep_last, multiples
// of keep_every and the file `latest` names stay; nothing else in the directory is touched.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <set>

#include "io/checkpoint.h"

namespace ctx {
namespace {

namespace fs = std::filesystem;

fs::path fresh_dir(const std::string& name) {
    const fs::path d = fs::path(CTX_TEST_BINARY_DIR) / "test_tmp" / "retention" / name;
    fs::remove_all(d);
    fs::create_directories(d);
    return d;
}

void touch(const fs::path& p) { std::ofstream(p) << "x"; }

std::set<std::string> names_in(const fs::path& d) {
    std::set<std::string> out;
    for (const auto& e : fs::directory_iterator(d)) out.insert(e.path().filename().string());
    return out;
}

std::string step_file(int s) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "step-%08d.h5", s);
    return buf;
}

TEST(CheckpointRetention, KeepsNewestMultiplesAndLatest) {
    const fs::path d = fresh_dir("policy");
    for (int s = 10; s <= 100; s += 10) touch(d / step_file(s));
    touch(d / "notes.txt");
    touch(d / "step-12.h5");  // not a name ctx.save_checkpoint writes: never touched
    set_latest_checkpoint(d.string(), step_file(40));  // latest need not be the newest
    const RetentionResult r = apply_checkpoint_retention(d.string(), {2, 30});
    EXPECT_TRUE(r.failed.empty());
    std::set<std::string> want = {step_file(90), step_file(100),                // newest 2
                                  step_file(30), step_file(60),                 // multiples of 30
                                  step_file(40),                                // latest
                                  "latest", "notes.txt", "step-12.h5"};
    EXPECT_EQ(names_in(d), want);
    EXPECT_EQ(r.deleted.size(), 5u);  // 10, 20, 50, 70, 80
    // keep_last 0: keep everything
    touch(d / step_file(110));
    EXPECT_TRUE(apply_checkpoint_retention(d.string(), {0, 0}).deleted.empty());
    EXPECT_TRUE(fs::exists(d / step_file(110)));
}

TEST(CheckpointRetention, RefusesNegativeCounts) {
    const fs::path d = fresh_dir("negative");
    EXPECT_THROW(apply_checkpoint_retention(d.string(), {-1, 0}), Error);
}

}  // namespace
}  // namespace ctx
