// HDF5 primitives for checkpoint.cpp (see checkpoint_hdf5.h). Kept apart so checkpoint.cpp reads
// as the layout and its checks, not as HDF5 plumbing.
#include "io/checkpoint_hdf5.h"

#include <bit>
#include <cstring>

#include "core/error.h"

namespace ctx::ckpt {

// ---------------------------------------------------------------- checksum

namespace {

constexpr uint64_t kFnvOffset = 0xcbf29ce484222325ull;
constexpr uint64_t kFnvPrime = 0x100000001b3ull;

inline uint64_t load_le64(const unsigned char* p) {
    uint64_t w;
    std::memcpy(&w, p, 8);
    if constexpr (std::endian::native == std::endian::big) w = __builtin_bswap64(w);
    return w;
}

// One FNV-1a step on a whole word. Plain word-wise FNV only moves differences upwards (two flips
// of bit 63 would cancel), hence the xorshift; both operations are bijective, so a change to any
// single word always changes the result.
inline uint64_t step(uint64_t h, uint64_t w) {
    h = (h ^ w) * kFnvPrime;
    return h ^ (h >> 32);
}

}  // namespace

uint64_t checksum64(const void* data, size_t size) {
    const auto* p = static_cast<const unsigned char*>(data);
    const size_t words = size / 8;
    uint64_t lane[4] = {kFnvOffset, kFnvOffset ^ 1, kFnvOffset ^ 2, kFnvOffset ^ 3};
    size_t i = 0;
    for (; i + 4 <= words; i += 4) {
        for (int l = 0; l < 4; ++l) lane[l] = step(lane[l], load_le64(p + 8 * (i + l)));
    }
    for (; i < words; ++i) lane[i % 4] = step(lane[i % 4], load_le64(p + 8 * i));
    uint64_t h = kFnvOffset;
    for (uint64_t l : lane) h = step(h, l);
    h = step(h, static_cast<uint64_t>(size));
    unsigned char tail[8] = {};
    if (size % 8 != 0) std::memcpy(tail, p + 8 * words, size % 8);
    h = step(h, load_le64(tail));
    h ^= h >> 33;  // murmur3 fmix64
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    h *= 0xc4ceb9fe1a85ec53ull;
    h ^= h >> 33;
    return h;
}

// ---------------------------------------------------------------- errors and session

namespace {
std::mutex g_hdf5_mutex;

herr_t innermost(unsigned n, const H5E_error2_t* err, void* out) {
    if (n == 0 && err != nullptr && err->desc != nullptr) *static_cast<std::string*>(out) = err->desc;
    return 0;
}
}  // namespace

Session::Session() : lock_(g_hdf5_mutex) { H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr); }

std::string hdf5_error_detail() {
    std::string detail;
    // Upward walks start at the function that detected the problem, the most specific message.
    H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, innermost, &detail);
    H5Eclear2(H5E_DEFAULT);
    return detail;
}

void File::fail_h5(const std::string& what) const {
    const std::string detail = hdf5_error_detail();
    if (detail.empty()) ctx::fail("{}: {}", path, what);
    ctx::fail("{}: {} ({})", path, what, detail);
}

void File::fail(const std::string& what) const { ctx::fail("{}: {}", path, what); }

// ---------------------------------------------------------------- writing

namespace {

Handle string_type(const File& f, size_t size) {
    Handle type(H5Tcopy(H5T_C_S1), H5Tclose);
    // NULLPAD with the exact length keeps every byte (UTF-8 and all) and needs no terminator.
    if (type.get() < 0 || H5Tset_size(type.get(), size) < 0 ||
        H5Tset_strpad(type.get(), H5T_STR_NULLPAD) < 0 || H5Tset_cset(type.get(), H5T_CSET_UTF8) < 0)
        f.fail_h5("cannot create a string type");
    return type;
}

Handle scalar_space(const File& f) {
    Handle space(H5Screate(H5S_SCALAR), H5Sclose);
    if (space.get() < 0) f.fail_h5("cannot create a dataspace");
    return space;
}

}  // namespace

Handle create_group(const File& f, hid_t loc, const std::string& name) {
    Handle g(H5Gcreate2(loc, name.c_str(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Gclose);
    if (g.get() < 0) f.fail_h5(fmt::format("cannot create group '{}'", name));
    return g;
}

void write_attr_scalar(const File& f, hid_t obj, const char* name, hid_t file_type,
                       hid_t mem_type, const void* value) {
    Handle space = scalar_space(f);
    Handle attr(H5Acreate2(obj, name, file_type, space.get(), H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
    if (attr.get() < 0 || H5Awrite(attr.get(), mem_type, value) < 0)
        f.fail_h5(fmt::format("cannot write attribute '{}'", name));
}

void write_attr_string(const File& f, hid_t obj, const char* name, const std::string& value) {
    Handle type = string_type(f, value.empty() ? 1 : value.size());
    const std::string padded = value.empty() ? std::string(1, '\0') : value;
    write_attr_scalar(f, obj, name, type.get(), type.get(), padded.data());
}

Handle write_dataset(const File& f, hid_t loc, const std::string& name, const std::string& display,
                     hid_t file_type, hid_t mem_type, const std::vector<hsize_t>& dims,
                     const void* data, size_t bytes) {
    Handle space = dims.empty() ? scalar_space(f)
                                : Handle(H5Screate_simple(static_cast<int>(dims.size()),
                                                          dims.data(), nullptr),
                                         H5Sclose);
    if (space.get() < 0) f.fail_h5(fmt::format("cannot create the dataspace of '{}'", display));
    Handle dset(H5Dcreate2(loc, name.c_str(), file_type, space.get(), H5P_DEFAULT, H5P_DEFAULT,
                           H5P_DEFAULT),
                H5Dclose);
    if (dset.get() < 0) f.fail_h5(fmt::format("cannot create dataset '{}'", display));
    // Zero-length datasets get no storage; HDF5 has nothing to write and we skip the call.
    if (bytes > 0 && H5Dwrite(dset.get(), mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data) < 0)
        f.fail_h5(fmt::format("cannot write dataset '{}'", display));
    const uint64_t sum = checksum64(data, bytes);
    write_attr_scalar(f, dset.get(), "checksum", H5T_STD_U64LE, H5T_NATIVE_UINT64, &sum);
    return dset;
}

void write_string_dataset(const File& f, hid_t loc, const std::string& name,
                          const std::string& value) {
    Handle type = string_type(f, value.empty() ? 1 : value.size());
    if (!value.empty()) {
        write_dataset(f, loc, name, name, type.get(), type.get(), {}, value.data(), value.size());
        return;
    }
    // A fixed-length string type cannot have size 0, so "" is a dataset with a null dataspace.
    Handle space(H5Screate(H5S_NULL), H5Sclose);
    Handle dset(H5Dcreate2(loc, name.c_str(), type.get(), space.get(), H5P_DEFAULT, H5P_DEFAULT,
                           H5P_DEFAULT),
                H5Dclose);
    if (space.get() < 0 || dset.get() < 0)
        f.fail_h5(fmt::format("cannot create dataset '{}'", name));
    const uint64_t sum = checksum64(nullptr, 0);
    write_attr_scalar(f, dset.get(), "checksum", H5T_STD_U64LE, H5T_NATIVE_UINT64, &sum);
}

// ---------------------------------------------------------------- reading

Handle open_group(const File& f, hid_t loc, const std::string& name) {
    if (H5Lexists(loc, name.c_str(), H5P_DEFAULT) <= 0) f.fail(fmt::format("missing group '{}'", name));
    Handle g(H5Gopen2(loc, name.c_str(), H5P_DEFAULT), H5Gclose);
    if (g.get() < 0) f.fail_h5(fmt::format("cannot open group '{}'", name));
    return g;
}

bool has_attr(hid_t obj, const char* name) { return H5Aexists(obj, name) > 0; }

namespace {

Handle open_attr(const File& f, hid_t obj, const char* name, const std::string& where) {
    if (!has_attr(obj, name)) f.fail(fmt::format("missing attribute '{}' on {}", name, where));
    Handle attr(H5Aopen(obj, name, H5P_DEFAULT), H5Aclose);
    if (attr.get() < 0) f.fail_h5(fmt::format("cannot open attribute '{}' on {}", name, where));
    Handle space(H5Aget_space(attr.get()), H5Sclose);
    if (space.get() < 0 || H5Sget_simple_extent_type(space.get()) != H5S_SCALAR)
        f.fail(fmt::format("attribute '{}' on {} is not a single value", name, where));
    return attr;
}

template <typename T>
T read_attr_integer(const File& f, hid_t obj, const char* name, const std::string& where,
                    hid_t mem_type) {
    Handle attr = open_attr(f, obj, name, where);
    Handle type(H5Aget_type(attr.get()), H5Tclose);
    if (type.get() < 0 || H5Tget_class(type.get()) != H5T_INTEGER)
        f.fail(fmt::format("attribute '{}' on {} is not an integer", name, where));
    T value{};
    // HDF5 converts any stored integer width; an out-of-range value fails instead of wrapping.
    if (H5Aread(attr.get(), mem_type, &value) < 0)
        f.fail_h5(fmt::format("cannot read attribute '{}' on {}", name, where));
    return value;
}

}  // namespace

std::string read_attr_string(const File& f, hid_t obj, const char* name, const std::string& where) {
    Handle attr = open_attr(f, obj, name, where);
    Handle type(H5Aget_type(attr.get()), H5Tclose);
    if (type.get() < 0 || H5Tget_class(type.get()) != H5T_STRING ||
        H5Tis_variable_str(type.get()) != 0)
        f.fail(fmt::format("attribute '{}' on {} is not a fixed-length string", name, where));
    const size_t size = H5Tget_size(type.get());
    if (size == 0 || size > 65536)
        f.fail(fmt::format("attribute '{}' on {} has an implausible size", name, where));
    std::string value(size, '\0');
    if (H5Aread(attr.get(), type.get(), value.data()) < 0)
        f.fail_h5(fmt::format("cannot read attribute '{}' on {}", name, where));
    while (!value.empty() && value.back() == '\0') value.pop_back();  // padding
    return value;
}

int64_t read_attr_int(const File& f, hid_t obj, const char* name, const std::string& where) {
    return read_attr_integer<int64_t>(f, obj, name, where, H5T_NATIVE_INT64);
}

uint64_t read_attr_u64(const File& f, hid_t obj, const char* name, const std::string& where) {
    return read_attr_integer<uint64_t>(f, obj, name, where, H5T_NATIVE_UINT64);
}

OpenDataset open_dataset(File& f, hid_t loc, const std::string& name, const std::string& display,
                         H5T_class_t type_class, size_t elem_size) {
    OpenDataset ds;
    ds.display = display;
    ds.elem_size = elem_size;
    if (H5Lexists(loc, name.c_str(), H5P_DEFAULT) <= 0)
        f.fail(fmt::format("missing dataset '{}'", display));
    ds.dset = Handle(H5Dopen2(loc, name.c_str(), H5P_DEFAULT), H5Dclose);
    if (ds.dset.get() < 0) f.fail_h5(fmt::format("cannot open dataset '{}'", display));
    Handle type(H5Dget_type(ds.dset.get()), H5Tclose);
    if (type.get() < 0 || H5Tget_class(type.get()) != type_class ||
        (elem_size != 0 && H5Tget_size(type.get()) != elem_size) ||
        (type_class == H5T_STRING && H5Tis_variable_str(type.get()) != 0))
        f.fail(fmt::format("dataset '{}' has the wrong element type", display));
    if (elem_size == 0) ds.elem_size = H5Tget_size(type.get());  // fixed-length strings
    Handle space(H5Dget_space(ds.dset.get()), H5Sclose);
    const H5S_class_t space_class = space.get() < 0 ? H5S_NO_CLASS : H5Sget_simple_extent_type(space.get());
    if (space_class == H5S_NULL) {
        ds.count = 0;
        return ds;
    }
    const int rank = space_class == H5S_NO_CLASS ? -1 : H5Sget_simple_extent_ndims(space.get());
    if (rank < 0 || rank > 32) f.fail_h5(fmt::format("dataset '{}' has an unreadable shape", display));
    std::vector<hsize_t> dims(static_cast<size_t>(rank));
    if (rank > 0 && H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr) < 0)
        f.fail_h5(fmt::format("dataset '{}' has an unreadable shape", display));
    // Multiply with overflow checks; the budget check below then bounds the allocation.
    uint64_t count = 1;
    for (hsize_t d : dims) {
        if (d > static_cast<hsize_t>(INT64_MAX) || (d != 0 && count > UINT64_MAX / d))
            f.fail(fmt::format("dataset '{}' has an implausible shape (file is corrupted)", display));
        count *= d;
        ds.dims.push_back(static_cast<int64_t>(d));
    }
    ds.count = count;
    if (ds.elem_size != 0 && count > f.byte_budget / ds.elem_size)
        f.fail(fmt::format("dataset '{}' claims more bytes than the file holds (file is corrupted)",
                           display));
    f.byte_budget -= count * ds.elem_size;
    return ds;
}

void read_dataset(const File& f, OpenDataset& ds, hid_t mem_type, void* buf) {
    if (ds.bytes() > 0 && H5Dread(ds.dset.get(), mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf) < 0)
        f.fail_h5(fmt::format("cannot read dataset '{}' (file is truncated or corrupted)", ds.display));
    const uint64_t stored = read_attr_u64(f, ds.dset.get(), "checksum", "dataset '" + ds.display + "'");
    if (checksum64(buf, ds.bytes()) != stored)
        f.fail(fmt::format("checksum mismatch in dataset '{}' (file is corrupted)", ds.display));
}

std::string read_string_dataset(File& f, hid_t loc, const std::string& name) {
    OpenDataset ds = open_dataset(f, loc, name, name, H5T_STRING, 0);
    if (!ds.dims.empty() && ds.count != 0)
        f.fail(fmt::format("dataset '{}' is not a single string", name));
    std::string value(ds.bytes(), '\0');
    Handle type(H5Dget_type(ds.dset.get()), H5Tclose);  // read as stored: no conversion
    read_dataset(f, ds, type.get(), value.data());
    return value;
}

}  // namespace ctx::ckpt
