// libFuzzer target for the checkpoint reader (io/checkpoint.cpp, load_checkpoint): its
// interpretation of what HDF5 hands back (root attributes, the string datasets including the
// tensor list `order`, the rng/params/adam groups, shapes, checksums). HDF5's own file parsing is
// not the target: the harness writes a well-formed HDF5 file with the HDF5 C API, in memory (the
// core driver, written out at close to /dev/shm), whose contents the fuzz input decides
// (FuzzedDataProvider): each attribute and dataset is written as save_checkpoint writes it, left
// out, or given the wrong class, size, shape or checksum; the strings, numbers and tensor names
// are fuzz data. load_checkpoint reads the file by path, as it reads real files. It must return
// or raise ctx::Error; a state it returns must be what was written.
#include <fuzzer/FuzzedDataProvider.h>
#include <hdf5.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/error.h"
#include "io/checkpoint.h"
#include "io/checkpoint_hdf5.h"
#include "fuzz_support.h"

namespace {

using ctx::ckpt::checksum64;

// How one item is written: as save_checkpoint does, or broken in one way. Running out of fuzz
// data gives 0, so short inputs describe a proper checkpoint.
enum Variant : int {
    kNormal,
    kMissing,
    kWrongClass,  // an integer where a string is expected, a string for a number ...
    kWrongShape,  // one more dimension, or a vector where a scalar is expected
    kBadChecksum,
    kNoChecksum,
    kOtherWidth,  // another element size of the right class
    kNumVariants
};

class Builder {
public:
    explicit Builder(FuzzedDataProvider& in) : in_(in) {}

    Variant variant() {
        // Mostly normal, so that inputs get deep into the reader.
        return in_.ConsumeBool() ? static_cast<Variant>(in_.ConsumeIntegralInRange<int>(
                                       0, kNumVariants - 1))
                                 : kNormal;
    }

    void attr_int(hid_t obj, const char* name, int64_t value) {
        const Variant v = variant();
        if (v == kMissing) return;
        if (v == kWrongClass) return attr_string(obj, name, std::to_string(value), kNormal);
        if (v == kOtherWidth) {  // a narrow type: HDF5 converts (or refuses) on read
            const int8_t narrow = static_cast<int8_t>(value);
            return write_attr(obj, name, H5T_STD_I8LE, H5T_NATIVE_INT8, &narrow, v);
        }
        if (v == kBadChecksum) {  // unsigned beyond int64: a conversion overflow on read
            const uint64_t big = UINT64_MAX - static_cast<uint64_t>(in_.ConsumeIntegral<uint8_t>());
            return write_attr(obj, name, H5T_STD_U64LE, H5T_NATIVE_UINT64, &big, kNormal);
        }
        write_attr(obj, name, H5T_STD_I64LE, H5T_NATIVE_INT64, &value, v);
    }

    void attr_u64(hid_t obj, const char* name, uint64_t value, Variant v) {
        if (v == kMissing) return;
        if (v == kWrongClass) {
            const double d = static_cast<double>(value);
            return write_attr(obj, name, H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, &d, kNormal);
        }
        write_attr(obj, name, H5T_STD_U64LE, H5T_NATIVE_UINT64, &value, v);
    }

    void attr_string(hid_t obj, const char* name, const std::string& value, Variant v) {
        if (v == kMissing) return;
        if (v == kWrongClass) {
            const int32_t one = 1;
            return write_attr(obj, name, H5T_STD_I32LE, H5T_NATIVE_INT32, &one, kNormal);
        }
        if (v == kOtherWidth) {  // variable-length string
            hid_t type = H5Tcopy(H5T_C_S1);
            H5Tset_size(type, H5T_VARIABLE);
            const char* p = value.c_str();
            write_attr(obj, name, type, type, &p, kNormal);
            H5Tclose(type);
            return;
        }
        std::string padded = value.empty() ? std::string(1, '\0') : value;
        hid_t type = string_type(padded.size());
        write_attr(obj, name, type, type, padded.data(), v);
        H5Tclose(type);
    }

    // A dataset of `count` elements of `type` (dims empty: scalar) with its checksum attribute.
    void dataset(hid_t loc, const std::string& name, hid_t type, std::vector<hsize_t> dims,
                 const void* data, size_t bytes) {
        const Variant v = variant();
        if (v == kMissing) return;
        hid_t file_type = type;
        if (v == kWrongClass) file_type = H5Tget_class(type) == H5T_FLOAT ? H5T_STD_I32LE
                                                                            : H5T_IEEE_F32LE;
        if (v == kOtherWidth) file_type = H5Tget_class(type) == H5T_FLOAT ? H5T_IEEE_F64LE
                                                                            : H5T_STD_U16LE;
        if (v == kWrongShape) dims.push_back(in_.ConsumeIntegralInRange<hsize_t>(0, 2));
        hid_t space = dims.empty() ? H5Screate(H5S_SCALAR)
                                   : H5Screate_simple(static_cast<int>(dims.size()), dims.data(),
                                                      nullptr);
        hid_t dset = H5Dcreate2(loc, name.c_str(), file_type, space, H5P_DEFAULT, H5P_DEFAULT,
                                H5P_DEFAULT);
        if (dset >= 0) {
            // Only an unchanged layout has the data to write; the others are read as zeros.
            if (bytes > 0 && file_type == type && v != kWrongShape)
                H5Dwrite(dset, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data);
            if (v != kNoChecksum) {
                const uint64_t sum = v == kBadChecksum ? in_.ConsumeIntegral<uint64_t>()
                                                       : checksum64(data, bytes);
                attr_u64(dset, "checksum", sum, kNormal);
            }
            H5Dclose(dset);
        }
        H5Sclose(space);
    }

    // As save_checkpoint writes strings: a scalar fixed-length string of exactly the text's
    // length, "" as a null dataspace.
    void string_dataset(hid_t loc, const std::string& name, const std::string& value) {
        if (value.empty() && !in_.ConsumeBool()) {
            hid_t type = string_type(1);
            hid_t space = H5Screate(H5S_NULL);
            hid_t dset = H5Dcreate2(loc, name.c_str(), type, space, H5P_DEFAULT, H5P_DEFAULT,
                                    H5P_DEFAULT);
            if (dset >= 0) {
                attr_u64(dset, "checksum", checksum64(nullptr, 0), kNormal);
                H5Dclose(dset);
            }
            H5Sclose(space);
            H5Tclose(type);
            return;
        }
        hid_t type = string_type(value.empty() ? 1 : value.size());
        dataset(loc, name, type, {}, value.data(), value.size());
        H5Tclose(type);
    }

    std::string text(size_t max) { return in_.ConsumeRandomLengthString(max); }
    FuzzedDataProvider& in() { return in_; }

private:
    static hid_t string_type(size_t size) {
        hid_t type = H5Tcopy(H5T_C_S1);
        H5Tset_size(type, size);
        H5Tset_strpad(type, H5T_STR_NULLPAD);
        H5Tset_cset(type, H5T_CSET_UTF8);
        return type;
    }

    void write_attr(hid_t obj, const char* name, hid_t file_type, hid_t mem_type,
                    const void* value, Variant v) {
        hsize_t two = 2;
        hid_t space = v == kWrongShape ? H5Screate_simple(1, &two, nullptr)
                                       : H5Screate(H5S_SCALAR);
        hid_t attr = H5Acreate2(obj, name, file_type, space, H5P_DEFAULT, H5P_DEFAULT);
        if (attr >= 0) {
            if (v != kWrongShape) H5Awrite(attr, mem_type, value);
            H5Aclose(attr);
        }
        H5Sclose(space);
    }

    FuzzedDataProvider& in_;
};

// metadata_digest of io/checkpoint.cpp (the documented metadata_checksum), so that a fuzzed file
// can also pass the last check and the whole read path returns.
uint64_t metadata_digest(const ctx::TrainingState& s, const std::string& order) {
    std::string buf;
    auto put_int = [&](int64_t v) {
        for (int i = 0; i < 8; ++i)
            buf.push_back(static_cast<char>((static_cast<uint64_t>(v) >> (8 * i)) & 0xff));
    };
    auto put_str = [&](const std::string& v) {
        put_int(static_cast<int64_t>(v.size()));
        buf += v;
    };
    put_str(ctx::kCheckpointFormat);
    put_int(ctx::kCheckpointVersion);
    for (int64_t v : {s.step, s.tokens_seen, s.data_epoch, s.data_index}) put_int(v);
    for (const std::string* v : {&s.model_config_json, &s.optimizer_config_json, &s.recipe_text,
                                 &s.pe_plugin, &s.pe_options_json, &s.metadata_json, &order})
        put_str(*v);
    for (const ctx::CheckpointTensor& t : s.tensors) {
        put_int(static_cast<int64_t>(t.shape.size()));
        for (int64_t d : t.shape) put_int(d);
        put_int(t.weight_decay ? 1 : 0);
    }
    return checksum64(buf.data(), buf.size());
}

std::vector<std::string> split_lines(const std::string& order) {
    std::vector<std::string> names;
    size_t start = 0;
    while (!order.empty()) {
        const size_t end = order.find('\n', start);
        names.push_back(order.substr(start, end == std::string::npos ? end : end - start));
        if (end == std::string::npos) break;
        start = end + 1;
    }
    return names;
}

// Tensors with small fuzz shapes and values, written under params/, adam_m/ and adam_v/.
void write_tensors(Builder& b, hid_t root, ctx::TrainingState& s, const std::string& order) {
    FuzzedDataProvider& in = b.in();
    hid_t groups[3] = {H5Gcreate2(root, "params", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT),
                       H5Gcreate2(root, "adam_m", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT),
                       H5Gcreate2(root, "adam_v", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT)};
    for (const std::string& name : split_lines(order)) {
        ctx::CheckpointTensor t;
        t.name = name;
        const int rank = in.ConsumeIntegralInRange(0, 3);
        std::vector<hsize_t> dims;
        size_t count = 1;
        for (int d = 0; d < rank; ++d) {
            dims.push_back(in.ConsumeIntegralInRange<hsize_t>(0, 4));
            t.shape.push_back(static_cast<int64_t>(dims.back()));
            count *= dims.back();
        }
        t.params.assign(count, in.ConsumeFloatingPoint<float>());
        t.weight_decay = in.ConsumeBool();
        b.dataset(groups[0], name, H5T_IEEE_F32LE, dims, t.params.data(), count * 4);
        hid_t ds = H5Lexists(groups[0], name.c_str(), H5P_DEFAULT) > 0
                       ? H5Dopen2(groups[0], name.c_str(), H5P_DEFAULT)
                       : -1;
        if (ds >= 0) {
            b.attr_int(ds, "weight_decay", t.weight_decay ? 1 : 0);
            H5Dclose(ds);
        }
        // Moments: the full shape, or float32 [0] for "none yet".
        const bool none = in.ConsumeBool();
        const std::vector<hsize_t> mdims = none ? std::vector<hsize_t>{0} : dims;
        if (!none) t.adam_m.assign(count, 0.5f), t.adam_v.assign(count, 0.25f);
        b.dataset(groups[1], name, H5T_IEEE_F32LE, mdims, t.adam_m.data(), t.adam_m.size() * 4);
        b.dataset(groups[2], name, H5T_IEEE_F32LE, mdims, t.adam_v.data(), t.adam_v.size() * 4);
        s.tensors.push_back(std::move(t));
    }
    if (in.ConsumeBool()) {  // a dataset `order` does not list
        const float x = 0;
        b.dataset(groups[in.ConsumeIntegralInRange(0, 2)], "extra", H5T_IEEE_F32LE, {1}, &x, 4);
    }
    for (hid_t g : groups)
        if (g >= 0) H5Gclose(g);
}

// Writes the checkpoint the input describes to `path`: the core driver builds the file in memory
// and writes it out once, at close. `expected` gets what a successful load must return.
void write_checkpoint(FuzzedDataProvider& in, const std::string& path,
                      ctx::TrainingState& expected) {
    hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
    H5Pset_fapl_core(fapl, 64 * 1024, /*backing_store=*/1);
    H5Pset_libver_bounds(fapl, H5F_LIBVER_V18, H5F_LIBVER_LATEST);
    hid_t file = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl);
    H5Pclose(fapl);
    if (file < 0) __builtin_trap();  // the harness itself is broken
    Builder b(in);
    ctx::TrainingState& s = expected;
    const Variant format_variant = b.variant();
    const std::string format =
        format_variant == kNormal ? ctx::kCheckpointFormat : b.text(32);
    b.attr_string(file, "format", format, format_variant == kNormal ? kNormal : b.variant());
    b.attr_int(file, "version",
               in.ConsumeBool() ? in.ConsumeIntegral<int64_t>() : ctx::kCheckpointVersion);
    s.step = in.ConsumeIntegral<int64_t>();
    s.tokens_seen = in.ConsumeIntegral<int64_t>();
    s.data_epoch = in.ConsumeIntegral<int64_t>();
    s.data_index = in.ConsumeIntegral<int64_t>();
    for (const auto& [name, v] : {std::pair{"step", s.step}, {"tokens_seen", s.tokens_seen},
                                  {"data_epoch", s.data_epoch}, {"data_index", s.data_index}})
        b.attr_int(file, name, v);
    s.model_config_json = b.text(64);
    s.optimizer_config_json = b.text(64);
    s.recipe_text = b.text(64);
    s.pe_plugin = b.text(16);
    s.pe_options_json = b.text(64);
    s.metadata_json = b.text(64);
    const std::string order = b.text(64);
    for (const auto& [name, value] :
         {std::pair<const char*, const std::string*>{"model_config_json", &s.model_config_json},
          {"optimizer_config_json", &s.optimizer_config_json}, {"recipe_text", &s.recipe_text},
          {"pe_plugin", &s.pe_plugin}, {"pe_options_json", &s.pe_options_json},
          {"metadata_json", &s.metadata_json}, {"order", &order}})
        b.string_dataset(file, name, *value);
    s.pe_state.assign(in.ConsumeIntegralInRange<size_t>(0, 8), 7);
    s.sampler_state.assign(in.ConsumeIntegralInRange<size_t>(0, 8), 9);
    b.dataset(file, "pe_state", H5T_STD_U8LE, {s.pe_state.size()}, s.pe_state.data(),
              s.pe_state.size());
    b.dataset(file, "sampler_state", H5T_STD_U8LE, {s.sampler_state.size()},
              s.sampler_state.data(), s.sampler_state.size());

    // rng/: words [n, 4], has_spare [n], spare [n]; the three may disagree on n.
    hid_t rng = in.ConsumeIntegralInRange(0, 15) == 15
                    ? -1
                    : H5Gcreate2(file, "rng", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    const size_t n = in.ConsumeIntegralInRange<size_t>(0, 3);
    s.rank_rngs.resize(n);
    std::vector<uint64_t> words;
    std::vector<uint8_t> has_spare;
    std::vector<double> spare;
    for (auto& r : s.rank_rngs) {
        for (auto& w : r.words) w = in.ConsumeIntegral<uint64_t>(), words.push_back(w);
        r.has_spare = in.ConsumeBool();
        r.spare = in.ConsumeFloatingPoint<double>();
        has_spare.push_back(r.has_spare ? 1 : 0);
        spare.push_back(r.spare);
    }
    if (rng >= 0) {
        const size_t n_spare = in.ConsumeIntegralInRange(0, 7) == 7 ? n + 1 : n;
        has_spare.resize(n_spare), spare.resize(n_spare);
        b.dataset(rng, "words", H5T_STD_U64LE, {n, 4}, words.data(), words.size() * 8);
        b.dataset(rng, "has_spare", H5T_STD_U8LE, {n_spare}, has_spare.data(), n_spare);
        b.dataset(rng, "spare", H5T_IEEE_F64LE, {n_spare}, spare.data(), n_spare * 8);
        H5Gclose(rng);
    }
    write_tensors(b, file, s, order);
    const uint64_t digest = in.ConsumeBool() ? in.ConsumeIntegral<uint64_t>()
                                             : metadata_digest(s, order);
    b.attr_u64(file, "metadata_checksum", digest, b.variant());

    if (H5Fclose(file) < 0) __builtin_trap();
}

// HDF5 cannot create a file through a memfd's /proc/self/fd path (it resolves the link), so the
// file goes to /dev/shm (memory) when there is one; removed after each input.
struct ScratchFile {
    std::string path;
    ScratchFile() {
        const char* dir = ::access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
        path = std::string(dir) + "/ctx-fuzz-checkpoint-" + std::to_string(::getpid()) + ".h5";
    }
    ~ScratchFile() { ::unlink(path.c_str()); }
};

bool same_state(const ctx::TrainingState& a, const ctx::TrainingState& b) {
    if (a.tensors.size() != b.tensors.size() || a.rank_rngs.size() != b.rank_rngs.size())
        return false;
    for (size_t i = 0; i < a.tensors.size(); ++i)
        if (a.tensors[i].name != b.tensors[i].name || a.tensors[i].shape != b.tensors[i].shape ||
            a.tensors[i].params.size() != b.tensors[i].params.size())
            return false;
    return a.step == b.step && a.tokens_seen == b.tokens_seen && a.data_index == b.data_index &&
           a.model_config_json == b.model_config_json && a.metadata_json == b.metadata_json &&
           a.pe_state == b.pe_state && a.sampler_state == b.sampler_state;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);  // the harness's own HDF5 failures are expected
    return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    FuzzedDataProvider in(data, size);
    const ScratchFile file;
    ctx::TrainingState written;
    write_checkpoint(in, file.path, written);
    try {
        const ctx::TrainingState loaded = ctx::load_checkpoint(file.path);
        if (!same_state(loaded, written)) __builtin_trap();
    } catch (const ctx::Error& e) {
        ctx::fuzz::note(e);
    }
    return 0;
}
