// Saving onto a full disk (issue 19, item 4): a checkpoint save that fails with EFBIG/ENOSPC-like
// write errors (RLIMIT_FSIZE in a child process: SIGXFSZ ignored, writes past the limit fail with
// EFBIG) reports the path, leaves the previous checkpoint and `latest` intact and removes its
// temporary file; the metrics and CSV writers report the failure the same way.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <filesystem>
#include <fstream>
#include <string>

#include "io/checkpoint.h"
#include "io/metrics.h"

namespace ctx {
namespace {

namespace fs = std::filesystem;

fs::path fresh_dir(const std::string& name) {
    const fs::path d = fs::path(CTX_TEST_BINARY_DIR) / "test_tmp" / "full_disk" / name;
    fs::remove_all(d);
    fs::create_directories(d);
    return d;
}

TrainingState state_of(size_t floats, int64_t step) {
    TrainingState s;
    s.model_config_json = R"({"d_model":16,"n_layer":1,"style":"gpt2"})";
    s.metadata_json = "{}";
    s.step = step;
    CheckpointTensor t;
    t.name = "wte";
    t.shape = {static_cast<int64_t>(floats)};
    t.params.assign(floats, 0.5f);
    s.tensors.push_back(t);
    return s;
}

// Runs f in a child whose files may not grow past `limit` bytes; returns f's error message
// ("" if it threw none). The child never touches the parent's state.
std::string error_under_file_size_limit(rlim_t limit, const std::function<void()>& f) {
    int fds[2];
    if (pipe(fds) != 0) return "pipe failed";
    const pid_t pid = fork();
    if (pid == 0) {
        close(fds[0]);
        std::signal(SIGXFSZ, SIG_IGN);  // a write past the limit fails with EFBIG instead
        rlimit lim{limit, limit};
        setrlimit(RLIMIT_FSIZE, &lim);
        std::string msg;
        try {
            f();
        } catch (const std::exception& e) {
            msg = e.what();
        }
        if (write(fds[1], msg.data(), msg.size()) < 0) _exit(2);
        _exit(0);
    }
    close(fds[1]);
    std::string msg;
    char buf[4096];
    for (ssize_t n; (n = read(fds[0], buf, sizeof buf)) > 0;) msg.append(buf, size_t(n));
    close(fds[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "child status " << status;
    return msg;
}

TEST(FullDisk, FailedCheckpointSaveKeepsThePreviousOneAndLatest) {
    const fs::path d = fresh_dir("checkpoint");
    const std::string first = (d / "step-00000001.h5").string();
    save_checkpoint(first, state_of(1000, 1));
    set_latest_checkpoint(d.string(), "step-00000001.h5");
    // the next save needs ~4 MB; the disk "holds" 64 KB more
    const std::string second = (d / "step-00000002.h5").string();
    const std::string msg = error_under_file_size_limit(64 * 1024, [&] {
        save_checkpoint(second, state_of(1000000, 2));
        set_latest_checkpoint(d.string(), "step-00000002.h5");
    });
    ASSERT_FALSE(msg.empty()) << "the save succeeded past the file size limit";
    EXPECT_NE(msg.find(second), std::string::npos) << msg;
    EXPECT_NE(msg.find("File too large"), std::string::npos) << msg;  // the errno's text
    // the previous checkpoint and the pointer are untouched; no temporary or partial file is left
    EXPECT_EQ(latest_checkpoint(d.string()), first);
    EXPECT_EQ(load_checkpoint(first).step, 1);
    for (const auto& e : fs::directory_iterator(d)) {
        const std::string name = e.path().filename().string();
        EXPECT_TRUE(name == "step-00000001.h5" || name == "latest") << "left behind: " << name;
    }
}

TEST(FullDisk, MetricsAndCsvWritersReportTheFailedWrite) {
    const fs::path d = fresh_dir("metrics");
    const std::string msg = error_under_file_size_limit(4096, [&] {
        MetricsWriter w(d.string(), true);
        Record r = Record::object();
        r["text"] = std::string(1000, 'x');
        for (int i = 0; i < 100; ++i) w.jsonl(r);
    });
    EXPECT_NE(msg.find("metrics.jsonl"), std::string::npos) << msg;
    EXPECT_NE(msg.find("File too large"), std::string::npos) << msg;
    const fs::path d2 = fresh_dir("csv");
    const std::string csv = error_under_file_size_limit(4096, [&] {
        MetricsWriter w(d2.string(), true);
        Record r = Record::object();
        r["text"] = std::string(1000, 'y');
        for (int i = 0; i < 100; ++i) w.csv("table", r);
    });
    EXPECT_NE(csv.find("table.csv"), std::string::npos) << csv;
    EXPECT_NE(csv.find("File too large"), std::string::npos) << csv;
}

}  // namespace
}  // namespace ctx
