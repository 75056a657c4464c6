// HDF5 checkpoints: bit-exact round trips, atomic replacement, the `latest` pointer, and clean
// ctx::Error messages (never a crash) for every kind of damaged or foreign file.
#include <gtest/gtest.h>
#include <hdf5.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>

#include "io/checkpoint.h"
#include "io/checkpoint_hdf5.h"

namespace ctx {
namespace {

namespace fs = std::filesystem;

#define EXPECT_CONTAINS(text, part) \
    EXPECT_NE(std::string(text).find(part), std::string::npos) << "message: " << (text)

// A fresh directory under /tmp for each test, removed afterwards.
class CheckpointTest : public ::testing::Test {
protected:
    void SetUp() override {
        char tmpl[] = "/tmp/ctx_ckpt_test_XXXXXX";
        ASSERT_NE(::mkdtemp(tmpl), nullptr);
        dir_ = tmpl;
    }
    void TearDown() override {
        // Every HDF5 id is owned by a RAII handle, so even failed loads leave nothing open.
        EXPECT_EQ(H5Fget_obj_count(H5F_OBJ_ALL, H5F_OBJ_ALL), 0);
        std::error_code ec;
        fs::remove_all(dir_, ec);
    }
    std::string path(const std::string& name) const { return dir_ + "/" + name; }
    std::vector<std::string> listing() const {
        std::vector<std::string> names;
        for (const auto& e : fs::directory_iterator(dir_)) names.push_back(e.path().filename());
        std::sort(names.begin(), names.end());
        return names;
    }
    std::string dir_;
};

std::vector<float> random_floats(std::mt19937_64& gen, size_t n) {
    // Random bit patterns (NaNs, infinities and denormals included) to prove nothing converts.
    std::vector<float> v(n);
    for (float& x : v) {
        const auto bits = static_cast<uint32_t>(gen());
        std::memcpy(&x, &bits, 4);
    }
    return v;
}

CheckpointTensor tensor(std::mt19937_64& gen, const std::string& name, std::vector<int64_t> shape,
                        bool weight_decay, bool moments) {
    CheckpointTensor t;
    t.name = name;
    t.shape = std::move(shape);
    t.weight_decay = weight_decay;
    size_t n = 1;
    for (int64_t d : t.shape) n *= static_cast<size_t>(d);
    t.params = random_floats(gen, n);
    if (moments) {
        t.adam_m = random_floats(gen, n);
        t.adam_v = random_floats(gen, n);
    }
    return t;
}

TrainingState full_state() {
    std::mt19937_64 gen(42);
    TrainingState s;
    s.model_config_json = R"({"d_model":16,"n_layer":1,"style":"gpt2"})";
    s.optimizer_config_json = R"({"lr":0.0003,"beta2":0.95})";
    const std::string chunk = "-- ü 日本語 ∑ λ \t \"quoted\" \\ back\\slash \r\n{}[] é\x7f\n";
    while (s.recipe_text.size() < 200 * 1024) s.recipe_text += chunk;
    s.pe_plugin = "pe/rope";
    s.pe_options_json = R"({"base":10000})";
    s.step = 1234;
    s.tokens_seen = 5'000'000'000;  // past 32 bits
    s.data_epoch = 2;
    s.data_index = 987654;
    s.sampler_state = {0, 1, 0, 0, 255, 0, 7, 0};
    s.rank_rngs.resize(3);
    for (auto& r : s.rank_rngs)
        for (auto& w : r.words) w = gen();
    s.rank_rngs[1].has_spare = true;
    s.rank_rngs[1].spare = -0.7364128812345;
    s.tensors.push_back(tensor(gen, "wte", {50, 16}, true, true));
    s.tensors.push_back(tensor(gen, "layers.0.attn.qkv.weight", {16, 48}, true, true));
    s.tensors.push_back(tensor(gen, "layers.0.ln_1.bias", {16}, false, true));
    s.tensors.push_back(tensor(gen, "pe.wpe", {8, 16}, false, false));  // registered after the last step
    s.tensors.push_back(tensor(gen, "pe.scale", {}, false, true));      // a scalar
    s.metadata_json = R"({"run":"ckpt-test","Lt":512,"Le":4096})";
    return s;
}

bool same_floats(const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * 4) == 0);
}

void expect_same_state(const TrainingState& a, const TrainingState& b) {
    EXPECT_EQ(a.model_config_json, b.model_config_json);
    EXPECT_EQ(a.optimizer_config_json, b.optimizer_config_json);
    EXPECT_EQ(a.recipe_text, b.recipe_text);
    EXPECT_EQ(a.pe_plugin, b.pe_plugin);
    EXPECT_EQ(a.pe_options_json, b.pe_options_json);
    EXPECT_EQ(a.pe_state, b.pe_state);
    EXPECT_EQ(a.step, b.step);
    EXPECT_EQ(a.tokens_seen, b.tokens_seen);
    EXPECT_EQ(a.data_epoch, b.data_epoch);
    EXPECT_EQ(a.data_index, b.data_index);
    EXPECT_EQ(a.sampler_state, b.sampler_state);
    EXPECT_EQ(a.metadata_json, b.metadata_json);
    ASSERT_EQ(a.rank_rngs.size(), b.rank_rngs.size());
    for (size_t r = 0; r < a.rank_rngs.size(); ++r) {
        EXPECT_EQ(a.rank_rngs[r].words, b.rank_rngs[r].words) << "rank " << r;
        EXPECT_EQ(a.rank_rngs[r].has_spare, b.rank_rngs[r].has_spare) << "rank " << r;
        EXPECT_EQ(std::memcmp(&a.rank_rngs[r].spare, &b.rank_rngs[r].spare, 8), 0) << "rank " << r;
    }
    ASSERT_EQ(a.tensors.size(), b.tensors.size());
    for (size_t i = 0; i < a.tensors.size(); ++i) {
        const CheckpointTensor& x = a.tensors[i];
        const CheckpointTensor& y = b.tensors[i];
        EXPECT_EQ(x.name, y.name) << "tensor " << i;
        EXPECT_EQ(x.shape, y.shape) << x.name;
        EXPECT_EQ(x.weight_decay, y.weight_decay) << x.name;
        EXPECT_TRUE(same_floats(x.params, y.params)) << x.name;
        EXPECT_TRUE(same_floats(x.adam_m, y.adam_m)) << x.name;
        EXPECT_TRUE(same_floats(x.adam_v, y.adam_v)) << x.name;
    }
}

// The message of the ctx::Error that loading `path` throws ("" if none is thrown).
std::string load_error(const std::string& path) {
    try {
        load_checkpoint(path);
    } catch (const Error& e) {
        return e.what();
    }
    return "";
}

// Opens a checkpoint read-write with the raw HDF5 API to damage it in controlled ways.
void edit_file(const std::string& path, const std::function<void(hid_t)>& edit) {
    ckpt::Session quiet;
    hid_t file = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
    ASSERT_GE(file, 0);
    edit(file);
    ASSERT_GE(H5Fclose(file), 0);
}

void delete_link(const std::string& path, const std::string& name) {
    edit_file(path, [&](hid_t f) { ASSERT_GE(H5Ldelete(f, name.c_str(), H5P_DEFAULT), 0) << name; });
}

// Replaces a float dataset with one of another shape, with a valid checksum, so only the shape
// check can catch it.
void replace_floats(const std::string& path, const std::string& name, std::vector<hsize_t> dims) {
    edit_file(path, [&](hid_t f) {
        if (H5Lexists(f, name.c_str(), H5P_DEFAULT) > 0) {
            ASSERT_GE(H5Ldelete(f, name.c_str(), H5P_DEFAULT), 0);
        }
        size_t n = 1;
        for (hsize_t d : dims) n *= d;
        std::vector<float> data(n, 1.5f);
        hid_t space = H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr);
        hid_t dset = H5Dcreate2(f, name.c_str(), H5T_IEEE_F32LE, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
        ASSERT_GE(dset, 0);
        ASSERT_GE(H5Dwrite(dset, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, data.data()), 0);
        const uint64_t sum = ckpt::checksum64(data.data(), n * 4);
        hid_t aspace = H5Screate(H5S_SCALAR);
        hid_t attr = H5Acreate2(dset, "checksum", H5T_STD_U64LE, aspace, H5P_DEFAULT, H5P_DEFAULT);
        ASSERT_GE(H5Awrite(attr, H5T_NATIVE_UINT64, &sum), 0);
        H5Aclose(attr);
        H5Sclose(aspace);
        H5Dclose(dset);
        H5Sclose(space);
    });
}

// Flips one byte inside a (contiguous) dataset's stored data.
void flip_byte_in(const std::string& path, const std::string& dataset, uint64_t byte) {
    haddr_t offset = HADDR_UNDEF;
    {
        ckpt::Session quiet;
        hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
        hid_t d = H5Dopen2(f, dataset.c_str(), H5P_DEFAULT);
        offset = H5Dget_offset(d);
        H5Dclose(d);
        H5Fclose(f);
    }
    ASSERT_NE(offset, HADDR_UNDEF) << dataset;
    std::fstream io(path, std::ios::in | std::ios::out | std::ios::binary);
    io.seekg(static_cast<std::streamoff>(offset + byte));
    char c = 0;
    io.read(&c, 1);
    c ^= 0x5a;
    io.seekp(static_cast<std::streamoff>(offset + byte));
    io.write(&c, 1);
    ASSERT_TRUE(io.good());
}

std::string read_all(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return {std::istreambuf_iterator<char>(in), {}};
}

void write_all(const std::string& path, const std::string& bytes) {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// ---------------------------------------------------------------- checksum

TEST(CheckpointChecksum, KnownValuesArePinned) {
    // Pinned so an accidental change to the hash (which would orphan every saved checkpoint) fails.
    EXPECT_EQ(ckpt::checksum64(nullptr, 0), 18205202145230008710ull);
    const std::string text = "ctxengine checkpoint checksum test vector, 53 bytes..";
    EXPECT_EQ(ckpt::checksum64(text.data(), text.size()), 12365867638217133443ull);
    // Every single-bit flip, and the classic cancelling pair for word-wise FNV, change the result.
    std::string copy = text;
    const uint64_t base = ckpt::checksum64(text.data(), text.size());
    for (size_t i = 0; i < copy.size(); ++i) {
        for (int bit = 0; bit < 8; ++bit) {
            copy[i] ^= static_cast<char>(1 << bit);
            EXPECT_NE(ckpt::checksum64(copy.data(), copy.size()), base) << i << ":" << bit;
            copy[i] ^= static_cast<char>(1 << bit);
        }
    }
    copy[7] ^= static_cast<char>(0x80);
    copy[39] ^= static_cast<char>(0x80);  // same lane, both top bits
    EXPECT_NE(ckpt::checksum64(copy.data(), copy.size()), base);
}

// ---------------------------------------------------------------- round trips

TEST_F(CheckpointTest, FullStateRoundTripsBitExactly) {
    const TrainingState s = full_state();
    save_checkpoint(path("step_1234.h5"), s);
    const TrainingState back = load_checkpoint(path("step_1234.h5"));
    expect_same_state(s, back);
    EXPECT_TRUE(back.tensors[3].adam_m.empty());  // "pe.wpe" had no moments
    EXPECT_TRUE(back.pe_state.empty());
}

TEST_F(CheckpointTest, EmptyStateAndNoMomentsRoundTrip) {
    TrainingState empty;  // no tensors, no ranks, empty strings
    empty.metadata_json = "";
    save_checkpoint(path("empty.h5"), empty);
    expect_same_state(empty, load_checkpoint(path("empty.h5")));

    std::mt19937_64 gen(7);
    TrainingState fresh;  // before the first optimizer step
    fresh.pe_state = {0, 0, 0};
    fresh.tensors.push_back(tensor(gen, "wte", {10, 4}, true, false));
    fresh.tensors.push_back(tensor(gen, "ln.bias", {4}, false, false));
    fresh.tensors.push_back(tensor(gen, "zero.sized", {0, 4}, false, true));
    save_checkpoint(path("fresh.h5"), fresh);
    const TrainingState back = load_checkpoint(path("fresh.h5"));
    expect_same_state(fresh, back);
    for (const auto& t : back.tensors) EXPECT_TRUE(t.adam_m.empty() && t.adam_v.empty()) << t.name;
}

TEST_F(CheckpointTest, SaveReplacesAtomicallyAndLeavesNoTempFiles) {
    TrainingState a = full_state();
    save_checkpoint(path("ckpt.h5"), a);
    a.step = 2000;
    a.tensors[0].params[5] = 42.0f;
    a.tensors.pop_back();
    save_checkpoint(path("ckpt.h5"), a);
    EXPECT_EQ(listing(), std::vector<std::string>{"ckpt.h5"});
    expect_same_state(a, load_checkpoint(path("ckpt.h5")));
}

TEST_F(CheckpointTest, SaveIntoMissingDirectoryThrowsAndLeavesNothing) {
    const std::string target = path("no/such/dir/ckpt.h5");
    try {
        save_checkpoint(target, full_state());
        FAIL() << "no error";
    } catch (const Error& e) {
        EXPECT_CONTAINS(e.what(), target);
        EXPECT_CONTAINS(e.what(), "does not exist");
    }
    EXPECT_TRUE(listing().empty());
}

TEST_F(CheckpointTest, SaveRejectsInconsistentStateAndLeavesNothing) {
    const auto save_error = [&](const TrainingState& s) {
        try {
            save_checkpoint(path("bad.h5"), s);
        } catch (const Error& e) {
            return std::string(e.what());
        }
        return std::string();
    };
    TrainingState s = full_state();
    s.tensors[1].name = "layers/0";
    EXPECT_CONTAINS(save_error(s), "contains '/'");
    s = full_state();
    s.tensors[2].params.pop_back();
    EXPECT_CONTAINS(save_error(s), "layers.0.ln_1.bias");
    s = full_state();
    s.tensors[0].adam_v.resize(3);
    EXPECT_CONTAINS(save_error(s), "optimizer moments");
    s = full_state();
    s.tensors[1].name = "wte";
    EXPECT_CONTAINS(save_error(s), "appears twice");
    EXPECT_TRUE(listing().empty());
}

// ---------------------------------------------------------------- latest pointer

TEST_F(CheckpointTest, LatestPointerRoundTrip) {
    EXPECT_EQ(latest_checkpoint(dir_), "");  // no pointer yet
    save_checkpoint(path("step_100.h5"), full_state());
    set_latest_checkpoint(dir_, "step_100.h5");
    EXPECT_EQ(read_all(path("latest")), "step_100.h5\n");
    EXPECT_EQ(latest_checkpoint(dir_), path("step_100.h5"));
    save_checkpoint(path("step_200.h5"), full_state());
    set_latest_checkpoint(dir_, "step_200.h5");
    EXPECT_EQ(latest_checkpoint(dir_), path("step_200.h5"));
    EXPECT_EQ(latest_checkpoint(dir_ + "/"), path("step_200.h5"));
    EXPECT_EQ(listing(), (std::vector<std::string>{"latest", "step_100.h5", "step_200.h5"}));
}

TEST_F(CheckpointTest, LatestPointerErrors) {
    const auto latest_error = [&] {
        try {
            latest_checkpoint(dir_);
        } catch (const Error& e) {
            return std::string(e.what());
        }
        return std::string();
    };
    write_all(path("latest"), "step_9.h5\n");
    std::string msg = latest_error();
    EXPECT_CONTAINS(msg, path("latest"));
    EXPECT_CONTAINS(msg, "does not exist");
    write_all(path("latest"), "  \n");
    EXPECT_CONTAINS(latest_error(), "invalid checkpoint pointer");
    write_all(path("latest"), "../elsewhere/ckpt.h5\n");
    EXPECT_CONTAINS(latest_error(), "invalid checkpoint pointer");
    write_all(path("latest"), std::string("a\0b", 3));
    EXPECT_CONTAINS(latest_error(), "invalid checkpoint pointer");
    write_all(path("latest"), std::string(10000, 'x'));
    EXPECT_CONTAINS(latest_error(), "too long");

    EXPECT_THROW(set_latest_checkpoint(dir_, "missing.h5"), Error);
    EXPECT_THROW(set_latest_checkpoint(dir_, "sub/ckpt.h5"), Error);
    EXPECT_THROW(set_latest_checkpoint(dir_, ""), Error);
    EXPECT_THROW(set_latest_checkpoint(dir_, "latest"), Error);
    EXPECT_THROW(set_latest_checkpoint(path("nodir"), "x.h5"), Error);
}

TEST_F(CheckpointTest, StaleTempFilesFromAKilledSaveAreIgnored) {
    const TrainingState s = full_state();
    save_checkpoint(path("ckpt.h5"), s);
    set_latest_checkpoint(dir_, "ckpt.h5");
    // What a writer killed mid-save leaves: half a checkpoint and half a pointer.
    const std::string good = read_all(path("ckpt.h5"));
    write_all(path("ckpt.h5.tmp-123"), good.substr(0, good.size() / 2));
    write_all(path("latest.tmp-123"), "ckpt.h5.tmp-1");
    expect_same_state(s, load_checkpoint(path("ckpt.h5")));
    EXPECT_EQ(latest_checkpoint(dir_), path("ckpt.h5"));
    // A later save by another process still succeeds and keeps the stale file out of its way.
    save_checkpoint(path("ckpt.h5"), s);
    EXPECT_EQ(load_error(path("ckpt.h5")), "");
}

// ---------------------------------------------------------------- damaged and foreign files

TEST_F(CheckpointTest, MissingOrForeignFilesAreReported) {
    std::string msg = load_error(path("nosuch.h5"));
    EXPECT_CONTAINS(msg, path("nosuch.h5"));
    EXPECT_CONTAINS(msg, "No such file");

    write_all(path("notes.txt"), "this is not HDF5\n");
    msg = load_error(path("notes.txt"));
    EXPECT_CONTAINS(msg, path("notes.txt"));
    EXPECT_CONTAINS(msg, "not an HDF5 file");

    EXPECT_CONTAINS(load_error(dir_), "not a regular file");
}

TEST_F(CheckpointTest, TruncatedFilesAreReported) {
    save_checkpoint(path("good.h5"), full_state());
    const std::string good = read_all(path("good.h5"));
    for (size_t cut : {size_t{0}, size_t{100}, good.size() / 2, good.size() - 16}) {
        write_all(path("cut.h5"), good.substr(0, cut));
        const std::string msg = load_error(path("cut.h5"));
        EXPECT_CONTAINS(msg, path("cut.h5")) << "cut at " << cut;
        EXPECT_CONTAINS(msg, "truncated") << "cut at " << cut;
    }
}

TEST_F(CheckpointTest, FlippedBytesGiveChecksumErrors) {
    const struct {
        const char* dataset;
        uint64_t byte;
    } cases[] = {{"params/wte", 1000},          {"adam_v/layers.0.attn.qkv.weight", 3},
                 {"params/pe.scale", 0},        {"recipe_text", 150000},
                 {"sampler_state", 4},          {"rng/words", 17}};
    for (const auto& c : cases) {
        save_checkpoint(path("ckpt.h5"), full_state());
        flip_byte_in(path("ckpt.h5"), c.dataset, c.byte);
        const std::string msg = load_error(path("ckpt.h5"));
        EXPECT_CONTAINS(msg, path("ckpt.h5") + ": checksum mismatch in dataset '" + c.dataset +
                                 "' (file is corrupted)");
    }
}

TEST_F(CheckpointTest, DamagedHdf5MetadataIsReportedNotParsed) {
    // The files use HDF5's checksummed (1.8+) metadata structures; a flip inside any of them,
    // wherever it lands, must come back as an error naming the file.
    save_checkpoint(path("good.h5"), full_state());
    const std::string good = read_all(path("good.h5"));
    int structures = 0;
    for (const char* signature : {"OHDR", "OCHK", "FRHP", "FHDB", "FHIB", "BTHD", "BTLF"}) {
        for (size_t at = good.find(signature); at != std::string::npos; at = good.find(signature, at + 1)) {
            std::string bad = good;
            bad[at + 6] ^= 0x21;
            write_all(path("bad.h5"), bad);
            const std::string msg = load_error(path("bad.h5"));
            EXPECT_CONTAINS(msg, path("bad.h5")) << signature << " at " << at;
            ++structures;
        }
    }
    EXPECT_GT(structures, 20);  // every group and dataset has an object header
}

TEST_F(CheckpointTest, RandomDamageNeverCrashesOrLoadsWrongData) {
    const TrainingState s = full_state();
    save_checkpoint(path("good.h5"), s);
    const std::string good = read_all(path("good.h5"));
    std::mt19937 gen(1234);
    int loaded = 0;
    for (int it = 0; it < 300; ++it) {
        std::string bad = good;
        for (int k = 0; k < 1 + it % 3; ++k) bad[gen() % bad.size()] ^= static_cast<char>(1 + gen() % 255);
        write_all(path("bad.h5"), bad);
        try {
            // A flip in unused bytes (padding, free space) is harmless; anything else must throw.
            expect_same_state(s, load_checkpoint(path("bad.h5")));
            ++loaded;
        } catch (const Error& e) {
            EXPECT_CONTAINS(e.what(), path("bad.h5"));
        }
    }
    EXPECT_LT(loaded, 150);
}

TEST_F(CheckpointTest, ChangedRootAttributesFailTheMetadataChecksum) {
    save_checkpoint(path("ckpt.h5"), full_state());
    edit_file(path("ckpt.h5"), [](hid_t f) {
        hid_t a = H5Aopen(f, "step", H5P_DEFAULT);
        const int64_t step = 1235;
        ASSERT_GE(H5Awrite(a, H5T_NATIVE_INT64, &step), 0);
        H5Aclose(a);
    });
    EXPECT_CONTAINS(load_error(path("ckpt.h5")), "metadata_checksum");
}

TEST_F(CheckpointTest, WrongFormatAndNewerVersionAreReported) {
    save_checkpoint(path("ckpt.h5"), full_state());
    edit_file(path("ckpt.h5"), [](hid_t f) {
        hid_t a = H5Aopen(f, "version", H5P_DEFAULT);
        const int32_t v = 2;
        ASSERT_GE(H5Awrite(a, H5T_NATIVE_INT32, &v), 0);
        H5Aclose(a);
    });
    std::string msg = load_error(path("ckpt.h5"));
    EXPECT_CONTAINS(msg, path("ckpt.h5"));
    EXPECT_CONTAINS(msg, "written by a newer ctxengine (checkpoint version 2, this build reads 1)");

    save_checkpoint(path("ckpt.h5"), full_state());
    edit_file(path("ckpt.h5"), [](hid_t f) {
        ASSERT_GE(H5Adelete(f, "format"), 0);
        hid_t type = H5Tcopy(H5T_C_S1);
        H5Tset_size(type, 11);
        hid_t space = H5Screate(H5S_SCALAR);
        hid_t a = H5Acreate2(f, "format", type, space, H5P_DEFAULT, H5P_DEFAULT);
        ASSERT_GE(H5Awrite(a, type, "other-thing"), 0);
        H5Aclose(a);
        H5Sclose(space);
        H5Tclose(type);
    });
    msg = load_error(path("ckpt.h5"));
    EXPECT_CONTAINS(msg, "not a ctxengine checkpoint");
    EXPECT_CONTAINS(msg, "'other-thing'");

    edit_file(path("ckpt.h5"), [](hid_t f) { ASSERT_GE(H5Adelete(f, "format"), 0); });
    EXPECT_CONTAINS(load_error(path("ckpt.h5")), "no 'format' attribute");

    // Any other HDF5 file is "not a ctxengine checkpoint", not a crash.
    {
        ckpt::Session quiet;
        hid_t f = H5Fcreate(path("other.h5").c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
        ASSERT_GE(f, 0);
        H5Fclose(f);
    }
    EXPECT_CONTAINS(load_error(path("other.h5")), "not a ctxengine checkpoint");
}

TEST_F(CheckpointTest, MissingDatasetsAreNamed) {
    for (const char* name : {"params/wte", "adam_m/layers.0.ln_1.bias", "adam_v/pe.wpe", "rng/words",
                             "rng/spare", "recipe_text", "order", "pe_state", "adam_v"}) {
        save_checkpoint(path("ckpt.h5"), full_state());
        delete_link(path("ckpt.h5"), name);
        const std::string msg = load_error(path("ckpt.h5"));
        EXPECT_CONTAINS(msg, path("ckpt.h5"));
        EXPECT_CONTAINS(msg, std::string("missing ") + (std::string(name) == "adam_v" ? "group" : "dataset") +
                                 " '" + name + "'");
    }
}

TEST_F(CheckpointTest, ShapeAndLengthMismatchesAreReported) {
    save_checkpoint(path("ckpt.h5"), full_state());
    replace_floats(path("ckpt.h5"), "adam_m/wte", {16, 50});
    EXPECT_CONTAINS(load_error(path("ckpt.h5")),
                    "dataset 'adam_m/wte' has shape [16, 50] but 'params/wte' has shape [50, 16]");

    save_checkpoint(path("ckpt.h5"), full_state());
    replace_floats(path("ckpt.h5"), "adam_v/pe.wpe", {3});
    EXPECT_CONTAINS(load_error(path("ckpt.h5")), "dataset 'adam_v/pe.wpe' has shape [3]");

    save_checkpoint(path("ckpt.h5"), full_state());
    replace_floats(path("ckpt.h5"), "rng/spare", {2});
    EXPECT_CONTAINS(load_error(path("ckpt.h5")), "'rng/spare'");

    save_checkpoint(path("ckpt.h5"), full_state());
    replace_floats(path("ckpt.h5"), "params/extra", {2});  // a dataset 'order' does not list
    EXPECT_CONTAINS(load_error(path("ckpt.h5")), "group 'params' holds 6 datasets but 'order' lists 5");

    save_checkpoint(path("ckpt.h5"), full_state());
    replace_floats(path("ckpt.h5"), "params/wte", {50, 17});  // shape no longer matches the metadata
    EXPECT_NE(load_error(path("ckpt.h5")), "");
}

TEST_F(CheckpointTest, HugeSizeClaimsAreRefusedBeforeAllocating) {
    // A dataset whose header claims 4 TiB (never written, so the file stays small) must be
    // refused by the size check, not by std::bad_alloc or the OOM killer.
    save_checkpoint(path("ckpt.h5"), full_state());
    edit_file(path("ckpt.h5"), [](hid_t f) {
        ASSERT_GE(H5Ldelete(f, "params/wte", H5P_DEFAULT), 0);
        const hsize_t dims[2] = {hsize_t{1} << 20, hsize_t{1} << 20};
        hid_t space = H5Screate_simple(2, dims, nullptr);
        hid_t dset = H5Dcreate2(f, "params/wte", H5T_IEEE_F32LE, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
        ASSERT_GE(dset, 0);
        H5Dclose(dset);
        H5Sclose(space);
    });
    const std::string msg = load_error(path("ckpt.h5"));
    EXPECT_CONTAINS(msg, path("ckpt.h5"));
    EXPECT_CONTAINS(msg, "dataset 'params/wte' claims more bytes than the file holds");
}

}  // namespace
}  // namespace ctx
