// Internal to the checkpoint code (checkpoint.cpp): RAII ownership of HDF5 ids, HDF5 error
// capture, the 64-bit checksum and the few dataset/attribute primitives the layout is built from.
// Every failure becomes a ctx::Error that starts with the checkpoint path.
#pragma once

#include <hdf5.h>

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

namespace ctx::ckpt {

// The checksum stored in every dataset's `checksum` attribute and in `metadata_checksum`.
// FNV-1a-style, but over 8-byte little-endian words in 4 independent lanes (word i -> lane i % 4)
// so that hashing runs at memory speed on multi-GB checkpoints; an xorshift after each multiply
// spreads high bits downwards. The lanes, the byte length and the zero-padded tail word are then
// folded into one state, which is finished with the murmur3 fmix64 avalanche. Changing this
// function invalidates every existing checkpoint, so a unit test pins known values.
uint64_t checksum64(const void* data, size_t size);

// Owns one hid_t and releases it with the matching H5?close, so nothing leaks when an exception
// unwinds through the save or load code.
class Handle {
public:
    using Closer = herr_t (*)(hid_t);
    Handle() = default;
    Handle(hid_t id, Closer closer) : id_(id), closer_(closer) {}
    Handle(const Handle&) = delete;
    Handle& operator=(const Handle&) = delete;
    Handle(Handle&& other) noexcept : id_(other.id_), closer_(other.closer_) { other.id_ = -1; }
    Handle& operator=(Handle&& other) noexcept {
        if (this != &other) {
            reset();
            id_ = other.id_;
            closer_ = other.closer_;
            other.id_ = -1;
        }
        return *this;
    }
    ~Handle() { reset(); }

    hid_t get() const { return id_; }
    // Closes now and reports the status (H5Fclose failing means data may not be on disk).
    herr_t close() {
        herr_t status = 0;
        if (id_ >= 0 && closer_ != nullptr) status = closer_(id_);
        id_ = -1;
        return status;
    }
    void reset() { (void)close(); }

private:
    hid_t id_ = -1;
    Closer closer_ = nullptr;
};

// Held for the duration of one save or load: serialises HDF5 use from this module and switches
// HDF5's automatic error printing off, so failures surface only as our own messages. The setting
// is not restored afterwards: HDF5 1.10 keeps it per thread, and restoring the default printer
// with H5Eset_auto2 makes the library's shutdown fail ("HDF5: infinite loop closing library")
// after an object failed its metadata checksum.
class Session {
public:
    Session();
    Session(const Session&) = delete;
    Session& operator=(const Session&) = delete;

private:
    std::unique_lock<std::mutex> lock_;
};

// The most specific message on HDF5's current error stack ("truncated file: eof = ..."), or ""
// if the stack is empty. Clears the stack.
std::string hdf5_error_detail();

// An open checkpoint file plus what the primitives need for messages and sanity limits.
struct File {
    std::string path;
    Handle file;
    // Load only: bytes the datasets may still claim. Every dataset is stored uncompressed and
    // contiguous, so together they cannot hold more than the file size; a larger claim means
    // corrupted metadata, and is refused before anything is allocated.
    uint64_t byte_budget = UINT64_MAX;

    // Throws "<path>: <what>" plus the HDF5 detail in parentheses when there is one.
    [[noreturn]] void fail_h5(const std::string& what) const;
    [[noreturn]] void fail(const std::string& what) const;
};

// ---- writing ----
Handle create_group(const File& f, hid_t loc, const std::string& name);
void write_attr_string(const File& f, hid_t obj, const char* name, const std::string& value);
void write_attr_scalar(const File& f, hid_t obj, const char* name, hid_t file_type,
                       hid_t mem_type, const void* value);
// Creates a contiguous dataset (dims empty = scalar), writes `bytes` bytes from data unless
// there are none, and attaches the checksum. `display` is the full name used in messages.
Handle write_dataset(const File& f, hid_t loc, const std::string& name, const std::string& display,
                     hid_t file_type, hid_t mem_type, const std::vector<hsize_t>& dims,
                     const void* data, size_t bytes);
// A string as a scalar fixed-length string dataset (readable in h5dump); "" as a null dataspace.
void write_string_dataset(const File& f, hid_t loc, const std::string& name,
                          const std::string& value);

// ---- reading ----
Handle open_group(const File& f, hid_t loc, const std::string& name);
bool has_attr(hid_t obj, const char* name);
std::string read_attr_string(const File& f, hid_t obj, const char* name, const std::string& where);
int64_t read_attr_int(const File& f, hid_t obj, const char* name, const std::string& where);
uint64_t read_attr_u64(const File& f, hid_t obj, const char* name, const std::string& where);

struct OpenDataset {
    std::string display;
    Handle dset;
    std::vector<int64_t> dims;  // empty for a scalar
    uint64_t count = 0;         // number of elements
    size_t elem_size = 0;
    uint64_t bytes() const { return count * elem_size; }
};
// Opens `name` under loc and checks its element type (class and size) and its size against the
// byte budget. Missing -> "missing dataset '<display>'".
OpenDataset open_dataset(File& f, hid_t loc, const std::string& name, const std::string& display,
                         H5T_class_t type_class, size_t elem_size);
// Reads the whole dataset into buf (ds.bytes() bytes) and verifies its checksum attribute.
void read_dataset(const File& f, OpenDataset& ds, hid_t mem_type, void* buf);
std::string read_string_dataset(File& f, hid_t loc, const std::string& name);

}  // namespace ctx::ckpt
