// HDF5 checkpoints (DESIGN.md decision 8): save, load and verify, plus the `latest` pointer.
//
// On-disk layout, format "ctxengine-checkpoint" version 1. All numbers little-endian; every
// dataset is contiguous and uncompressed and carries a uint64 attribute `checksum` (checksum64 of
// its raw bytes as read, see checkpoint_hdf5.h).
//
//   /                         attributes:
//       format                fixed-length string  "ctxengine-checkpoint"
//       version               int32                1
//       step, tokens_seen,    int64
//       data_epoch, data_index
//       metadata_checksum     uint64   checksum64 of metadata_digest() below: the attributes
//                                      above, the string datasets, `order`, and every tensor's
//                                      shape and weight_decay flag
//   /model_config_json        \  scalar fixed-length UTF-8 string datasets of exactly the text's
//   /optimizer_config_json     | length (NULLPAD, so any bytes survive); an empty string is a
//   /recipe_text               | dataset with a null dataspace. Datasets, not attributes, since
//   /pe_plugin                 | attributes are limited to 64 KiB and recipes can be longer.
//   /pe_options_json           |
//   /metadata_json            /
//   /order                    string dataset: the tensor names joined with '\n', in arena order
//   /pe_state                 uint8 [n]   (n may be 0)
//   /sampler_state            uint8 [n]   (n may be 0)
//   /rng/words                uint64 [n_ranks, 4]   xoshiro256** state of each rank
//   /rng/has_spare            uint8  [n_ranks]
//   /rng/spare                float64 [n_ranks]
//   /params/<name>            float32, the tensor's shape (scalar for shape []); attribute
//                             `weight_decay` (uint8 0/1)
//   /adam_m/<name>            float32 with the same shape, or float32 [0] when the state has no
//   /adam_v/<name>            moments for the tensor (no optimizer step yet)
//
// The file is written with HDF5 format bounds [1.8, latest]: HDF5 >= 1.8 (and h5py) read it, and
// all of its own metadata (superblock, object headers, group indexes) is checksummed by HDF5.
//
// Tensor names may contain dots but not '/' or '\n' (and "." is not a valid HDF5 link name).
// params/, adam_m/ and adam_v/ each hold exactly the datasets listed in `order`.
//
// Atomicity: the file is written as `<path>.tmp-<pid>`, flushed, closed, fsync'ed, renamed over
// `<path>` and the directory is fsync'ed, so a crash leaves the old file or the new one; a stale
// temp file from a killed writer is never read.
#include "io/checkpoint.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/ranges.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <unordered_set>

#include "io/checkpoint_hdf5.h"

namespace ctx {

namespace {

using ckpt::File;
using ckpt::Handle;
using ckpt::OpenDataset;

// ---------------------------------------------------------------- filesystem helpers

std::string parent_dir(const std::string& path) {
    const size_t slash = path.rfind('/');
    if (slash == std::string::npos) return ".";
    if (slash == 0) return "/";
    return path.substr(0, slash);
}

std::string join(const std::string& dir, const std::string& name) {
    if (dir.empty()) return name;
    return dir.back() == '/' ? dir + name : dir + "/" + name;
}

std::string errno_text() { return std::strerror(errno); }

// Makes the data of a closed file durable before it is renamed into place.
void fsync_path(const std::string& path, const std::string& what_for) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) fail("{}: cannot open '{}' to sync it ({})", what_for, path, errno_text());
    const int rc = ::fsync(fd);
    const int err = errno;
    ::close(fd);
    if (rc != 0) fail("{}: fsync of '{}' failed ({})", what_for, path, std::strerror(err));
}

// Makes a rename durable. Some filesystems cannot sync directories (EINVAL); that is not a
// failure of ours.
void fsync_dir(const std::string& dir, const std::string& what_for) {
    const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) fail("{}: cannot open directory '{}' to sync it ({})", what_for, dir, errno_text());
    const int rc = ::fsync(fd);
    const int err = errno;
    ::close(fd);
    if (rc != 0 && err != EINVAL && err != EROFS)
        fail("{}: fsync of directory '{}' failed ({})", what_for, dir, std::strerror(err));
}

void require_directory(const std::string& dir, const std::string& what_for) {
    struct stat st {};
    if (::stat(dir.c_str(), &st) != 0)
        fail("{}: directory '{}' does not exist ({})", what_for, dir, errno_text());
    if (!S_ISDIR(st.st_mode)) fail("{}: '{}' is not a directory", what_for, dir);
}

void rename_into_place(const std::string& from, const std::string& to) {
    if (::rename(from.c_str(), to.c_str()) != 0)
        fail("{}: cannot rename '{}' into place ({})", to, from, errno_text());
}

// Removes the temporary file on every exit path except success.
struct TempFile {
    std::string path;
    bool keep = false;
    ~TempFile() {
        if (!keep) ::unlink(path.c_str());
    }
};

// ---------------------------------------------------------------- validation and digest

// Why a name cannot be a tensor dataset, or "" if it can.
std::string bad_name_reason(const std::string& name) {
    if (name.empty()) return "is empty";
    if (name == "." || name == "..") return "is not a valid HDF5 name";
    if (name.find('/') != std::string::npos) return "contains '/'";
    if (name.find('\n') != std::string::npos || name.find('\0') != std::string::npos)
        return "contains a newline or NUL";
    return "";
}

std::string shape_text(const std::vector<int64_t>& shape) { return fmt::format("[{}]", fmt::join(shape, ", ")); }

uint64_t element_count(const std::string& path, const CheckpointTensor& t) {
    uint64_t n = 1;
    for (int64_t d : t.shape) {
        if (d < 0 || (d != 0 && n > UINT64_MAX / static_cast<uint64_t>(d)))
            fail("{}: tensor '{}' has an invalid shape {}", path, t.name, shape_text(t.shape));
        n *= static_cast<uint64_t>(d);
    }
    return n;
}

void validate_for_save(const std::string& path, const TrainingState& s) {
    std::unordered_set<std::string> seen;
    for (const CheckpointTensor& t : s.tensors) {
        if (const std::string why = bad_name_reason(t.name); !why.empty())
            fail("{}: cannot save tensor '{}': its name {}", path, t.name, why);
        if (!seen.insert(t.name).second) fail("{}: tensor name '{}' appears twice", path, t.name);
        const uint64_t n = element_count(path, t);
        if (t.params.size() != n)
            fail("{}: tensor '{}' has shape {} ({} elements) but {} parameters", path, t.name,
                 shape_text(t.shape), n, t.params.size());
        for (const auto* m : {&t.adam_m, &t.adam_v}) {
            if (!m->empty() && m->size() != n)
                fail("{}: tensor '{}' has {} elements but {} optimizer moments", path, t.name, n,
                     m->size());
        }
    }
}

std::string join_names(const std::vector<CheckpointTensor>& tensors) {
    std::string order;
    for (size_t i = 0; i < tensors.size(); ++i) order += (i ? "\n" : "") + tensors[i].name;
    return order;
}

// The bytes metadata_checksum covers: each field as an 8-byte little-endian length or value plus
// the string bytes, in this fixed order. Covers what the per-dataset checksums do not (the root
// attributes, shapes and weight_decay flags) so no field of the file goes unverified.
uint64_t metadata_digest(const TrainingState& s, const std::string& order) {
    std::string buf;
    auto put_int = [&](int64_t v) {
        for (int i = 0; i < 8; ++i) buf.push_back(static_cast<char>((static_cast<uint64_t>(v) >> (8 * i)) & 0xff));
    };
    auto put_str = [&](const std::string& v) {
        put_int(static_cast<int64_t>(v.size()));
        buf += v;
    };
    put_str(kCheckpointFormat);
    put_int(kCheckpointVersion);
    for (int64_t v : {s.step, s.tokens_seen, s.data_epoch, s.data_index}) put_int(v);
    for (const std::string* v : {&s.model_config_json, &s.optimizer_config_json, &s.recipe_text,
                                 &s.pe_plugin, &s.pe_options_json, &s.metadata_json, &order})
        put_str(*v);
    for (const CheckpointTensor& t : s.tensors) {
        put_int(static_cast<int64_t>(t.shape.size()));
        for (int64_t d : t.shape) put_int(d);
        put_int(t.weight_decay ? 1 : 0);
    }
    return ckpt::checksum64(buf.data(), buf.size());
}

// ---------------------------------------------------------------- save

void write_bytes(const File& f, hid_t loc, const char* name, const std::vector<uint8_t>& v) {
    ckpt::write_dataset(f, loc, name, name, H5T_STD_U8LE, H5T_NATIVE_UINT8, {v.size()}, v.data(),
                        v.size());
}

void write_floats(const File& f, hid_t group, const std::string& group_name,
                  const CheckpointTensor& t, const std::vector<float>& v, bool full_shape) {
    std::vector<hsize_t> dims;
    if (full_shape) {
        for (int64_t d : t.shape) dims.push_back(static_cast<hsize_t>(d));
    } else {
        dims = {0};  // no moments for this tensor
    }
    Handle dset = ckpt::write_dataset(f, group, t.name, group_name + "/" + t.name, H5T_IEEE_F32LE,
                                      H5T_NATIVE_FLOAT, dims, v.data(), v.size() * sizeof(float));
    if (group_name == "params") {
        const uint8_t wd = t.weight_decay ? 1 : 0;
        ckpt::write_attr_scalar(f, dset.get(), "weight_decay", H5T_STD_U8LE, H5T_NATIVE_UINT8, &wd);
    }
}

void write_contents(const File& f, const TrainingState& s) {
    const hid_t root = f.file.get();
    const std::string order = join_names(s.tensors);
    ckpt::write_attr_string(f, root, "format", kCheckpointFormat);
    const int32_t version = kCheckpointVersion;
    ckpt::write_attr_scalar(f, root, "version", H5T_STD_I32LE, H5T_NATIVE_INT32, &version);
    const std::pair<const char*, int64_t> ints[] = {{"step", s.step},
                                                    {"tokens_seen", s.tokens_seen},
                                                    {"data_epoch", s.data_epoch},
                                                    {"data_index", s.data_index}};
    for (const auto& [name, value] : ints)
        ckpt::write_attr_scalar(f, root, name, H5T_STD_I64LE, H5T_NATIVE_INT64, &value);
    const uint64_t digest = metadata_digest(s, order);
    ckpt::write_attr_scalar(f, root, "metadata_checksum", H5T_STD_U64LE, H5T_NATIVE_UINT64, &digest);

    ckpt::write_string_dataset(f, root, "model_config_json", s.model_config_json);
    ckpt::write_string_dataset(f, root, "optimizer_config_json", s.optimizer_config_json);
    ckpt::write_string_dataset(f, root, "recipe_text", s.recipe_text);
    ckpt::write_string_dataset(f, root, "pe_plugin", s.pe_plugin);
    ckpt::write_string_dataset(f, root, "pe_options_json", s.pe_options_json);
    ckpt::write_string_dataset(f, root, "metadata_json", s.metadata_json);
    ckpt::write_string_dataset(f, root, "order", order);
    write_bytes(f, root, "pe_state", s.pe_state);
    write_bytes(f, root, "sampler_state", s.sampler_state);

    const size_t n_ranks = s.rank_rngs.size();
    std::vector<uint64_t> words;
    std::vector<uint8_t> has_spare;
    std::vector<double> spare;
    for (const auto& r : s.rank_rngs) {
        words.insert(words.end(), r.words.begin(), r.words.end());
        has_spare.push_back(r.has_spare ? 1 : 0);
        spare.push_back(r.spare);
    }
    Handle rng = ckpt::create_group(f, root, "rng");
    ckpt::write_dataset(f, rng.get(), "words", "rng/words", H5T_STD_U64LE, H5T_NATIVE_UINT64,
                        {n_ranks, 4}, words.data(), words.size() * 8);
    ckpt::write_dataset(f, rng.get(), "has_spare", "rng/has_spare", H5T_STD_U8LE, H5T_NATIVE_UINT8,
                        {n_ranks}, has_spare.data(), has_spare.size());
    ckpt::write_dataset(f, rng.get(), "spare", "rng/spare", H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE,
                        {n_ranks}, spare.data(), spare.size() * 8);

    Handle params = ckpt::create_group(f, root, "params");
    Handle adam_m = ckpt::create_group(f, root, "adam_m");
    Handle adam_v = ckpt::create_group(f, root, "adam_v");
    for (const CheckpointTensor& t : s.tensors) {
        write_floats(f, params.get(), "params", t, t.params, true);
        write_floats(f, adam_m.get(), "adam_m", t, t.adam_m, !t.adam_m.empty());
        write_floats(f, adam_v.get(), "adam_v", t, t.adam_v, !t.adam_v.empty());
    }
}

Handle file_access_props(const File& f) {
    // STRONG: H5Fclose really closes the file (and everything in it), so the fsync that follows
    // covers all of its data.
    // V18 as the lowest format: superblock v2, v2 object headers and new-style groups all carry
    // HDF5's own metadata checksums, so a damaged header is reported as such instead of being
    // parsed (HDF5 1.10 can crash on corrupted v1 metadata). Readable by HDF5 >= 1.8 and h5py.
    Handle fapl(H5Pcreate(H5P_FILE_ACCESS), H5Pclose);
    if (fapl.get() < 0 || H5Pset_fclose_degree(fapl.get(), H5F_CLOSE_STRONG) < 0 ||
        H5Pset_libver_bounds(fapl.get(), H5F_LIBVER_V18, H5F_LIBVER_LATEST) < 0)
        f.fail_h5("cannot create HDF5 file-access properties");
    return fapl;
}

// ---------------------------------------------------------------- load

std::vector<std::string> split_names(const File& f, const std::string& order) {
    std::vector<std::string> names;
    std::unordered_set<std::string> seen;
    if (order.empty()) return names;
    size_t start = 0;
    while (true) {
        const size_t end = order.find('\n', start);
        std::string name = order.substr(start, end == std::string::npos ? std::string::npos : end - start);
        if (const std::string why = bad_name_reason(name); !why.empty())
            f.fail(fmt::format("dataset 'order' lists a tensor name that {} (file is corrupted)", why));
        if (!seen.insert(name).second)
            f.fail(fmt::format("dataset 'order' lists tensor '{}' twice (file is corrupted)", name));
        names.push_back(std::move(name));
        if (end == std::string::npos) break;
        start = end + 1;
    }
    return names;
}

std::vector<uint8_t> read_bytes(File& f, hid_t loc, const std::string& name, const std::string& display) {
    OpenDataset ds = ckpt::open_dataset(f, loc, name, display, H5T_INTEGER, 1);
    if (ds.dims.size() != 1) f.fail(fmt::format("dataset '{}' is not a byte vector", display));
    std::vector<uint8_t> v(ds.count);
    ckpt::read_dataset(f, ds, H5T_NATIVE_UINT8, v.data());
    return v;
}

void check_group_size(const File& f, hid_t group, const std::string& name, size_t expected) {
    H5G_info_t info{};
    if (H5Gget_info(group, &info) < 0) f.fail_h5(fmt::format("cannot list group '{}'", name));
    if (info.nlinks != expected)
        f.fail(fmt::format("group '{}' holds {} datasets but 'order' lists {} (file is corrupted)",
                           name, info.nlinks, expected));
}

// A moment is either the tensor's full shape or float32 [0] for "none".
std::vector<float> read_moment(File& f, hid_t group, const std::string& group_name,
                               const CheckpointTensor& t) {
    const std::string display = group_name + "/" + t.name;
    OpenDataset ds = ckpt::open_dataset(f, group, t.name, display, H5T_FLOAT, sizeof(float));
    const bool none = ds.dims == std::vector<int64_t>{0};
    if (ds.dims != t.shape && !none)
        f.fail(fmt::format("dataset '{}' has shape {} but 'params/{}' has shape {}", display,
                           shape_text(ds.dims), t.name, shape_text(t.shape)));
    std::vector<float> v(ds.count);
    ckpt::read_dataset(f, ds, H5T_NATIVE_FLOAT, v.data());
    return v;
}

TrainingState read_contents(File& f) {
    const hid_t root = f.file.get();
    if (!ckpt::has_attr(root, "format"))
        f.fail("not a ctxengine checkpoint (no 'format' attribute)");
    const std::string format = ckpt::read_attr_string(f, root, "format", "the root group");
    if (format != kCheckpointFormat)
        f.fail(fmt::format("not a ctxengine checkpoint (format is '{}', expected '{}')", format,
                           kCheckpointFormat));
    // The version is checked before anything else is interpreted: a newer file may differ in
    // every other respect, checksums included.
    const int64_t version = ckpt::read_attr_int(f, root, "version", "the root group");
    if (version > kCheckpointVersion)
        f.fail(fmt::format("written by a newer ctxengine (checkpoint version {}, this build reads {})",
                           version, kCheckpointVersion));
    if (version < 1)
        f.fail(fmt::format("unsupported checkpoint version {} (this build reads {})", version,
                           kCheckpointVersion));

    TrainingState s;
    s.step = ckpt::read_attr_int(f, root, "step", "the root group");
    s.tokens_seen = ckpt::read_attr_int(f, root, "tokens_seen", "the root group");
    s.data_epoch = ckpt::read_attr_int(f, root, "data_epoch", "the root group");
    s.data_index = ckpt::read_attr_int(f, root, "data_index", "the root group");
    s.model_config_json = ckpt::read_string_dataset(f, root, "model_config_json");
    s.optimizer_config_json = ckpt::read_string_dataset(f, root, "optimizer_config_json");
    s.recipe_text = ckpt::read_string_dataset(f, root, "recipe_text");
    s.pe_plugin = ckpt::read_string_dataset(f, root, "pe_plugin");
    s.pe_options_json = ckpt::read_string_dataset(f, root, "pe_options_json");
    s.metadata_json = ckpt::read_string_dataset(f, root, "metadata_json");
    const std::string order = ckpt::read_string_dataset(f, root, "order");
    s.pe_state = read_bytes(f, root, "pe_state", "pe_state");
    s.sampler_state = read_bytes(f, root, "sampler_state", "sampler_state");

    Handle rng = ckpt::open_group(f, root, "rng");
    OpenDataset words = ckpt::open_dataset(f, rng.get(), "words", "rng/words", H5T_INTEGER, 8);
    if (words.dims.size() != 2 || words.dims[1] != 4)
        f.fail(fmt::format("dataset 'rng/words' has shape {}, expected [n_ranks, 4]", shape_text(words.dims)));
    const int64_t n_ranks = words.dims[0];
    std::vector<uint64_t> word_values(words.count);
    ckpt::read_dataset(f, words, H5T_NATIVE_UINT64, word_values.data());
    std::vector<uint8_t> has_spare = read_bytes(f, rng.get(), "has_spare", "rng/has_spare");
    OpenDataset spare = ckpt::open_dataset(f, rng.get(), "spare", "rng/spare", H5T_FLOAT, 8);
    if (spare.dims != std::vector<int64_t>{n_ranks} || has_spare.size() != static_cast<size_t>(n_ranks))
        f.fail(fmt::format("datasets 'rng/has_spare' and 'rng/spare' must have {} entries like 'rng/words'",
                           n_ranks));
    std::vector<double> spare_values(spare.count);
    ckpt::read_dataset(f, spare, H5T_NATIVE_DOUBLE, spare_values.data());
    s.rank_rngs.resize(static_cast<size_t>(n_ranks));
    for (size_t r = 0; r < s.rank_rngs.size(); ++r) {
        for (size_t k = 0; k < 4; ++k) s.rank_rngs[r].words[k] = word_values[4 * r + k];
        s.rank_rngs[r].has_spare = has_spare[r] != 0;
        s.rank_rngs[r].spare = spare_values[r];
    }

    const std::vector<std::string> names = split_names(f, order);
    Handle params = ckpt::open_group(f, root, "params");
    Handle adam_m = ckpt::open_group(f, root, "adam_m");
    Handle adam_v = ckpt::open_group(f, root, "adam_v");
    s.tensors.reserve(names.size());
    for (const std::string& name : names) {
        CheckpointTensor t;
        t.name = name;
        const std::string display = "params/" + name;
        OpenDataset p = ckpt::open_dataset(f, params.get(), name, display, H5T_FLOAT, sizeof(float));
        t.shape = p.dims;
        t.weight_decay = ckpt::read_attr_int(f, p.dset.get(), "weight_decay", "dataset '" + display + "'") != 0;
        t.params.resize(p.count);
        ckpt::read_dataset(f, p, H5T_NATIVE_FLOAT, t.params.data());
        t.adam_m = read_moment(f, adam_m.get(), "adam_m", t);
        t.adam_v = read_moment(f, adam_v.get(), "adam_v", t);
        s.tensors.push_back(std::move(t));
    }
    // Every listed dataset was found; any extra one means `order` and the groups disagree.
    check_group_size(f, params.get(), "params", names.size());
    check_group_size(f, adam_m.get(), "adam_m", names.size());
    check_group_size(f, adam_v.get(), "adam_v", names.size());

    if (ckpt::read_attr_u64(f, root, "metadata_checksum", "the root group") != metadata_digest(s, order))
        f.fail("checksum mismatch in the root attributes and strings (metadata_checksum; file is corrupted)");
    return s;
}

// ---------------------------------------------------------------- latest pointer

void write_small_file_atomically(const std::string& target, const std::string& content) {
    const std::string tmp = fmt::format("{}.tmp-{}", target, ::getpid());
    TempFile guard{tmp};
    const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) fail("{}: cannot create '{}' ({})", target, tmp, errno_text());
    size_t done = 0;
    int err = 0;
    while (done < content.size()) {
        const ssize_t n = ::write(fd, content.data() + done, content.size() - done);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) {
            err = errno;
            break;
        }
        done += static_cast<size_t>(n);
    }
    if (err == 0 && ::fsync(fd) != 0) err = errno;
    if (::close(fd) != 0 && err == 0) err = errno;
    if (err != 0) fail("{}: cannot write '{}' ({})", target, tmp, std::strerror(err));
    rename_into_place(tmp, target);
    guard.keep = true;
    fsync_dir(parent_dir(target), target);
}

}  // namespace

// ---------------------------------------------------------------- public API

void save_checkpoint(const std::string& path, const TrainingState& state) {
    if (path.empty()) fail("save_checkpoint: empty path");
    validate_for_save(path, state);
    const std::string dir = parent_dir(path);
    require_directory(dir, path + ": cannot save checkpoint");
    // The session's lock is held until the rename (and the temp file's removal on failure), so
    // two threads saving to the same path cannot share one temp name.
    ckpt::Session session;
    TempFile temp{fmt::format("{}.tmp-{}", path, ::getpid())};
    {
        File f;
    f.path = path;
        Handle fapl = file_access_props(f);
        f.file = Handle(H5Fcreate(temp.path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl.get()), H5Fclose);
        if (f.file.get() < 0) f.fail_h5(fmt::format("cannot create temporary file '{}'", temp.path));
        write_contents(f, state);
        if (H5Fflush(f.file.get(), H5F_SCOPE_GLOBAL) < 0) f.fail_h5("cannot flush the checkpoint");
        if (f.file.close() < 0) f.fail_h5("cannot close the checkpoint");
    }
    fsync_path(temp.path, path);
    rename_into_place(temp.path, path);
    temp.keep = true;
    fsync_dir(dir, path);
}

TrainingState load_checkpoint(const std::string& path) {
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0) fail("{}: cannot open checkpoint ({})", path, errno_text());
    if (!S_ISREG(st.st_mode)) fail("{}: cannot open checkpoint (not a regular file)", path);
    ckpt::Session session;
    File f;
    f.path = path;
    f.byte_budget = static_cast<uint64_t>(st.st_size);
    if (H5Fis_hdf5(path.c_str()) <= 0)
        f.fail_h5("cannot open checkpoint: not an HDF5 file or truncated");
    Handle fapl = file_access_props(f);
    f.file = Handle(H5Fopen(path.c_str(), H5F_ACC_RDONLY, fapl.get()), H5Fclose);
    if (f.file.get() < 0) f.fail_h5("cannot open checkpoint: not an HDF5 file or truncated");
    return read_contents(f);
}

void set_latest_checkpoint(const std::string& dir, const std::string& file_name) {
    const std::string pointer = join(dir, "latest");
    if (const std::string why = bad_name_reason(file_name); !why.empty())
        fail("{}: cannot point at '{}': a checkpoint file name {}", pointer, file_name, why);
    if (file_name == "latest") fail("{}: cannot point at itself", pointer);
    const std::string target = join(dir, file_name);
    struct stat st {};
    if (::stat(target.c_str(), &st) != 0 || !S_ISREG(st.st_mode))
        fail("{}: cannot point at '{}': {} does not exist", pointer, file_name, target);
    static std::mutex mutex;  // threads share the `latest.tmp-<pid>` name
    std::lock_guard<std::mutex> lock(mutex);
    write_small_file_atomically(pointer, file_name + "\n");
}

std::string latest_checkpoint(const std::string& dir) {
    const std::string pointer = join(dir, "latest");
    const int fd = ::open(pointer.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        if (errno == ENOENT) return "";
        fail("{}: cannot read checkpoint pointer ({})", pointer, errno_text());
    }
    // A file name is short; anything longer than this is not a pointer we wrote.
    char buf[4097];
    size_t size = 0;
    while (size < sizeof(buf)) {
        const ssize_t n = ::read(fd, buf + size, sizeof(buf) - size);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        size += static_cast<size_t>(n);
    }
    ::close(fd);
    if (size >= sizeof(buf)) fail("{}: invalid checkpoint pointer (too long)", pointer);
    std::string name(buf, size);
    const auto is_space = [](char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; };
    while (!name.empty() && is_space(name.back())) name.pop_back();
    size_t first = 0;
    while (first < name.size() && is_space(name[first])) ++first;
    name.erase(0, first);
    const bool control = std::any_of(name.begin(), name.end(),
                                     [](char c) { return static_cast<unsigned char>(c) < 0x20; });
    if (const std::string why = bad_name_reason(name); !why.empty() || control)
        fail("{}: invalid checkpoint pointer '{}' (the name {})", pointer, name,
             why.empty() ? "contains control characters" : why);
    const std::string target = join(dir, name);
    struct stat st {};
    if (::stat(target.c_str(), &st) != 0 || !S_ISREG(st.st_mode))
        fail("{}: points at '{}', but {} does not exist", pointer, name, target);
    return target;
}

}  // namespace ctx
