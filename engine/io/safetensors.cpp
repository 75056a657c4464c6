#include "io/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "core/error.h"

namespace ctx {

// Tensor bytes are little-endian on disk and copied as they are.
static_assert(std::endian::native == std::endian::little, "safetensors I/O assumes a little-endian host");

using json = nlohmann::json;

namespace {

struct DtypeInfo {
    StDtype dtype;
    const char* name;
    size_t size;
};
constexpr DtypeInfo kDtypes[] = {
    {StDtype::BOOL, "BOOL", 1}, {StDtype::U8, "U8", 1},           {StDtype::I8, "I8", 1},
    {StDtype::F8_E5M2, "F8_E5M2", 1}, {StDtype::F8_E4M3, "F8_E4M3", 1}, {StDtype::I16, "I16", 2},
    {StDtype::U16, "U16", 2},   {StDtype::F16, "F16", 2},         {StDtype::BF16, "BF16", 2},
    {StDtype::I32, "I32", 4},   {StDtype::U32, "U32", 4},         {StDtype::F32, "F32", 4},
    {StDtype::F64, "F64", 8},   {StDtype::I64, "I64", 8},         {StDtype::U64, "U64", 8},
};

std::string shape_str(const std::vector<int64_t>& s) {
    std::string out = "[";
    for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
    return out + "]";
}

// A non-negative JSON integer (what shapes and offsets hold), or an error naming `what`.
uint64_t get_uint(const json& v, const std::string& origin, const std::string& what) {
    if (v.is_number_unsigned()) return v.get<uint64_t>();
    if (v.is_number_integer() && v.get<int64_t>() >= 0) return static_cast<uint64_t>(v.get<int64_t>());
    fail("{}: {} must be a non-negative integer, got {}", origin, what, v.dump());
}

// Parses JSON text, refusing duplicate keys (nlohmann would keep the last one silently) and
// nesting deeper than a valid header ever needs.
json parse_json_strict(std::string_view text, const std::string& origin) {
    std::vector<std::set<std::string>> keys;  // one set per open object
    std::string duplicate;
    auto cb = [&](int depth, json::parse_event_t ev, json& parsed) -> bool {
        if (depth > 8) fail("{}: the header JSON is nested deeper than 8 levels", origin);
        switch (ev) {
            case json::parse_event_t::object_start: keys.emplace_back(); break;
            case json::parse_event_t::object_end:
                if (!keys.empty()) keys.pop_back();
                break;
            case json::parse_event_t::key:
                if (!keys.empty() && !keys.back().insert(parsed.get<std::string>()).second &&
                    duplicate.empty())
                    duplicate = parsed.get<std::string>();
                break;
            default: break;
        }
        return true;
    };
    json j;
    try {
        j = json::parse(text.begin(), text.end(), cb);
    } catch (const json::exception& e) {  // parse_error, and out_of_range for 1e999
        fail("{}: the header is not valid JSON: {}", origin, e.what());
    }
    CTX_CHECK(duplicate.empty(), "{}: the header has the key \"{}\" more than once", origin,
              duplicate);
    return j;
}

}  // namespace

const char* st_dtype_name(StDtype d) {
    for (const auto& x : kDtypes)
        if (x.dtype == d) return x.name;
    return "?";
}

size_t st_dtype_size(StDtype d) {
    for (const auto& x : kDtypes)
        if (x.dtype == d) return x.size;
    return 0;
}

uint64_t StTensor::numel() const {
    uint64_t n = 1;
    for (int64_t s : shape) n *= static_cast<uint64_t>(s);
    return n;
}

StHeader parse_safetensors_header(std::string_view text, uint64_t data_size,
                                  const std::string& origin) {
    // The format requires the JSON to start with '{' (padding may only follow it).
    CTX_CHECK(!text.empty() && text.front() == '{',
              "{}: the header must be a JSON object starting with '{{'", origin);
    const json j = parse_json_strict(text, origin);
    CTX_CHECK(j.is_object(), "{}: the header must be a JSON object", origin);
    StHeader h;
    for (const auto& [name, v] : j.items()) {
        if (name == "__metadata__") {
            CTX_CHECK(v.is_object(), "{}: \"__metadata__\" must be an object of strings", origin);
            for (const auto& [k, s] : v.items()) {
                CTX_CHECK(s.is_string(), "{}: \"__metadata__\".\"{}\" must be a string, got {}",
                          origin, k, s.dump());
                h.metadata[k] = s.get<std::string>();
            }
            continue;
        }
        const std::string where = fmt::format("tensor \"{}\"", name);
        CTX_CHECK(v.is_object(), "{}: {} must be an object with dtype, shape and data_offsets",
                  origin, where);
        for (const char* key : {"dtype", "shape", "data_offsets"})
            CTX_CHECK(v.contains(key), "{}: {} has no \"{}\"", origin, where, key);
        StTensor t;
        t.name = name;
        const json& dt = v["dtype"];
        CTX_CHECK(dt.is_string(), "{}: {}: \"dtype\" must be a string", origin, where);
        const std::string dts = dt.get<std::string>();
        const auto* info = std::find_if(std::begin(kDtypes), std::end(kDtypes),
                                        [&](const DtypeInfo& x) { return dts == x.name; });
        CTX_CHECK(info != std::end(kDtypes),
                  "{}: {} has unknown dtype \"{}\" (expected one of F32, F16, BF16, F64, I64, "
                  "I32, I16, I8, U8, BOOL, ...)", origin, where, dts);
        t.dtype = info->dtype;
        const json& sh = v["shape"];
        CTX_CHECK(sh.is_array(), "{}: {}: \"shape\" must be an array", origin, where);
        uint64_t numel = 1;
        bool overflow = false;
        for (size_t i = 0; i < sh.size(); ++i) {
            const uint64_t d = get_uint(sh[i], origin, fmt::format("{} shape[{}]", where, i));
            CTX_CHECK(d <= static_cast<uint64_t>(INT64_MAX), "{}: {} shape[{}] = {} is too large",
                      origin, where, i, d);
            t.shape.push_back(static_cast<int64_t>(d));
            overflow = overflow || __builtin_mul_overflow(numel, d, &numel);
        }
        uint64_t bytes = 0;
        overflow = overflow || __builtin_mul_overflow(numel, info->size, &bytes);
        CTX_CHECK(!overflow, "{}: {} shape {} is too large", origin, where, shape_str(t.shape));
        const json& off = v["data_offsets"];
        CTX_CHECK(off.is_array() && off.size() == 2,
                  "{}: {}: \"data_offsets\" must be an array [begin, end]", origin, where);
        t.begin = get_uint(off[0], origin, where + " data_offsets[0]");
        t.end = get_uint(off[1], origin, where + " data_offsets[1]");
        CTX_CHECK(t.begin <= t.end, "{}: {} has data_offsets [{}, {}] with begin after end",
                  origin, where, t.begin, t.end);
        CTX_CHECK(t.end - t.begin == bytes,
                  "{}: {} has data_offsets [{}, {}] ({} bytes) but shape {} of {} needs {} bytes",
                  origin, where, t.begin, t.end, t.end - t.begin, shape_str(t.shape), dts, bytes);
        h.tensors.push_back(std::move(t));
    }
    // The tensors must tile the data section: sorted by offset, each starts where the previous
    // one ended, the first at 0 and the last at the end of the file.
    std::sort(h.tensors.begin(), h.tensors.end(), [](const StTensor& a, const StTensor& b) {
        return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
    });
    uint64_t pos = 0;
    const StTensor* prev = nullptr;
    for (const StTensor& t : h.tensors) {
        if (t.begin < pos)
            fail("{}: tensors \"{}\" [{}, {}] and \"{}\" [{}, {}] overlap", origin, prev->name,
                 prev->begin, prev->end, t.name, t.begin, t.end);
        if (t.begin > pos)
            fail("{}: the data offsets are not contiguous: bytes [{}, {}) before tensor \"{}\" "
                 "belong to no tensor", origin, pos, t.begin, t.name);
        pos = t.end;
        prev = &t;
    }
    if (pos > data_size)
        fail("{}: truncated: tensor \"{}\" ends at byte {} of the data section but the file "
             "holds only {} data bytes", origin, prev->name, pos, data_size);
    if (pos < data_size)
        fail("{}: the data section has {} bytes but the tensors end at byte {} ({} bytes belong "
             "to no tensor)", origin, data_size, pos, data_size - pos);
    return h;
}

StHeader parse_safetensors(const uint8_t* bytes, size_t available, uint64_t file_size,
                           const std::string& origin) {
    CTX_CHECK(file_size >= 8 && available >= 8,
              "{}: {} bytes is too short for a safetensors file (8-byte header length first)",
              origin, file_size);
    uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = (n << 8) | bytes[i];  // little-endian
    CTX_CHECK(n >= 2, "{}: header length {} is too small for a JSON object", origin, n);
    CTX_CHECK(n <= kStMaxHeaderBytes, "{}: header length {} exceeds the {} byte limit (not a "
              "safetensors file?)", origin, n, kStMaxHeaderBytes);
    CTX_CHECK(n <= file_size - 8, "{}: header length {} is longer than the file allows ({} bytes "
              "after the length field)", origin, n, file_size - 8);
    CTX_CHECK(available >= 8 + n, "{}: only {} of {} header bytes are available", origin,
              available - 8, n);
    StHeader h = parse_safetensors_header(
        std::string_view(reinterpret_cast<const char*>(bytes + 8), n), file_size - 8 - n, origin);
    h.data_start = 8 + n;
    return h;
}

float f16_to_f32(uint16_t h) {
    const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
    const uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
    uint32_t bits;
    if (exp == 0x1f) {
        bits = sign | 0x7f800000u | (man << 13);  // inf, NaN (payload kept)
    } else if (exp != 0) {
        bits = sign | ((exp + 112u) << 23) | (man << 13);  // rebias 15 -> 127
    } else if (man == 0) {
        bits = sign;  // +-0
    } else {
        // Subnormal half: man * 2^-24, normalised for float.
        int e = -1;
        uint32_t m = man;
        do {
            ++e;
            m <<= 1;
        } while ((m & 0x400u) == 0);
        bits = sign | ((112u - static_cast<uint32_t>(e)) << 23) | ((m & 0x3ffu) << 13);
    }
    float f;
    std::memcpy(&f, &bits, sizeof f);
    return f;
}

float bf16_to_f32(uint16_t h) {
    const uint32_t bits = static_cast<uint32_t>(h) << 16;
    float f;
    std::memcpy(&f, &bits, sizeof f);
    return f;
}

// ---------------------------------------------------------------- one file

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    CTX_CHECK(fd >= 0, "{}: cannot open: {}", path, std::strerror(errno));
    struct stat st{};
    if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        ::close(fd);
        fail("{}: not a regular file", path);
    }
    map_size_ = static_cast<size_t>(st.st_size);
    if (map_size_ > 0) {
        void* p = ::mmap(nullptr, map_size_, PROT_READ, MAP_PRIVATE, fd, 0);
        if (p == MAP_FAILED) {
            const int err = errno;
            ::close(fd);
            fail("{}: cannot map the file: {}", path, std::strerror(err));
        }
        map_ = static_cast<const uint8_t*>(p);
    }
    ::close(fd);
    try {
        header_ = parse_safetensors(map_, map_size_, map_size_, path);
    } catch (...) {
        if (map_) ::munmap(const_cast<uint8_t*>(map_), map_size_);
        map_ = nullptr;
        throw;
    }
    for (size_t i = 0; i < header_.tensors.size(); ++i) index_[header_.tensors[i].name] = i;
}

SafetensorsFile::~SafetensorsFile() {
    if (map_) ::munmap(const_cast<uint8_t*>(map_), map_size_);
}

const StTensor* SafetensorsFile::find(const std::string& name) const {
    auto it = index_.find(name);
    return it == index_.end() ? nullptr : &header_.tensors[it->second];
}

void SafetensorsFile::read_f32(const StTensor& t, float* out) const {
    const uint8_t* src = map_ + header_.data_start + t.begin;
    const uint64_t n = t.numel();
    switch (t.dtype) {
        case StDtype::F32:  // host is little-endian; an empty tensor may have no buffer
            if (n > 0) std::memcpy(out, src, n * 4);
            return;
        case StDtype::F16:
        case StDtype::BF16:
            for (uint64_t i = 0; i < n; ++i) {
                const uint16_t h = static_cast<uint16_t>(src[2 * i] | (src[2 * i + 1] << 8));
                out[i] = t.dtype == StDtype::F16 ? f16_to_f32(h) : bf16_to_f32(h);
            }
            return;
        default:
            fail("{}: tensor \"{}\" has dtype {}; only F32, F16 and BF16 convert to fp32", path_,
                 t.name, st_dtype_name(t.dtype));
    }
}

std::vector<float> SafetensorsFile::read_f32(const std::string& name) const {
    const StTensor* t = find(name);
    CTX_CHECK(t != nullptr, "{}: no tensor \"{}\"", path_, name);
    std::vector<float> out(t->numel());
    read_f32(*t, out.data());
    return out;
}

// ---------------------------------------------------------------- sets (sharded or not)

SafetensorsSet SafetensorsSet::open_file(const std::string& path) {
    SafetensorsSet s;
    s.origin_ = path;
    s.files_.push_back(std::make_unique<SafetensorsFile>(path));
    for (const StTensor& t : s.files_[0]->tensors()) s.where_[t.name] = {0, &t};
    return s;
}

SafetensorsSet SafetensorsSet::open_dir(const std::string& dir) {
    namespace fs = std::filesystem;
    const fs::path single = fs::path(dir) / "model.safetensors";
    const fs::path index = fs::path(dir) / "model.safetensors.index.json";
    std::error_code ec;
    if (fs::is_regular_file(single, ec)) return open_file(single.string());
    CTX_CHECK(fs::is_regular_file(index, ec),
              "{}: neither model.safetensors nor model.safetensors.index.json is there (PyTorch "
              ".bin checkpoints are not read: re-save with safe_serialization=True)", dir);
    const std::string ipath = index.string();
    std::ifstream in(ipath, std::ios::binary);
    CTX_CHECK(in, "{}: cannot read", ipath);
    std::stringstream text;
    text << in.rdbuf();
    json j;
    try {
        j = json::parse(text.str());
    } catch (const json::exception& e) {
        fail("{}: not valid JSON: {}", ipath, e.what());
    }
    CTX_CHECK(j.is_object() && j.contains("weight_map") && j["weight_map"].is_object(),
              "{}: expected an object with a \"weight_map\" object (tensor name -> shard file)",
              ipath);
    SafetensorsSet s;
    s.origin_ = ipath;
    std::map<std::string, size_t> file_index;
    std::map<std::string, std::string> wanted;  // tensor -> shard
    for (const auto& [name, f] : j["weight_map"].items()) {
        CTX_CHECK(f.is_string(), "{}: weight_map[\"{}\"] must be a file name", ipath, name);
        const std::string file = f.get<std::string>();
        // Shards live beside the index: no directories, no way out of it.
        CTX_CHECK(!file.empty() && file.find('/') == std::string::npos && file != "." &&
                      file != "..",
                  "{}: weight_map[\"{}\"] = \"{}\" must be a file name in the same directory",
                  ipath, name, file);
        wanted[name] = file;
        if (!file_index.count(file)) {
            file_index[file] = s.files_.size();
            s.files_.push_back(std::make_unique<SafetensorsFile>((fs::path(dir) / file).string()));
        }
    }
    CTX_CHECK(!wanted.empty(), "{}: the weight_map is empty", ipath);
    for (const auto& [name, file] : wanted) {
        const size_t fi = file_index[file];
        const StTensor* t = s.files_[fi]->find(name);
        CTX_CHECK(t != nullptr, "{}: the index maps \"{}\" to {} but that shard has no such "
                  "tensor", ipath, name, file);
        s.where_[name] = {fi, t};
    }
    for (const auto& [file, fi] : file_index)
        for (const StTensor& t : s.files_[fi]->tensors())
            CTX_CHECK(wanted.count(t.name) && wanted[t.name] == file,
                      "{}: shard {} holds tensor \"{}\" which the index {}", ipath, file, t.name,
                      wanted.count(t.name) ? "maps to " + wanted[t.name] : "does not list");
    return s;
}

std::vector<std::string> SafetensorsSet::names() const {
    std::vector<std::string> out;
    for (const auto& [name, w] : where_) out.push_back(name);
    return out;
}

const StTensor& SafetensorsSet::info(const std::string& name) const {
    auto it = where_.find(name);
    CTX_CHECK(it != where_.end(), "{}: no tensor \"{}\"", origin_, name);
    return *it->second.second;
}

std::vector<float> SafetensorsSet::read_f32(const std::string& name) const {
    auto it = where_.find(name);
    CTX_CHECK(it != where_.end(), "{}: no tensor \"{}\"", origin_, name);
    std::vector<float> out(it->second.second->numel());
    files_[it->second.first]->read_f32(*it->second.second, out.data());
    return out;
}

const std::map<std::string, std::string>& SafetensorsSet::metadata() const {
    static const std::map<std::string, std::string> none;
    return files_.empty() ? none : files_[0]->metadata();
}

// ---------------------------------------------------------------- writer

void write_safetensors(const std::string& path, const std::vector<StWriteTensor>& tensors,
                       const std::map<std::string, std::string>& metadata) {
    json header = json::object();  // nlohmann sorts keys; offsets follow the given order anyway
    if (!metadata.empty()) header["__metadata__"] = metadata;
    uint64_t offset = 0;
    for (const StWriteTensor& t : tensors) {
        CTX_CHECK(!t.name.empty() && t.name != "__metadata__",
                  "{}: invalid tensor name \"{}\"", path, t.name);
        CTX_CHECK(!header.contains(t.name), "{}: tensor \"{}\" is written twice", path, t.name);
        uint64_t n = 1;
        for (int64_t d : t.shape) {
            CTX_CHECK(d >= 0, "{}: tensor \"{}\" has a negative dimension", path, t.name);
            n *= static_cast<uint64_t>(d);
        }
        CTX_CHECK(n == 0 || t.data != nullptr, "{}: tensor \"{}\" has no data", path, t.name);
        header[t.name] = {{"dtype", "F32"}, {"shape", t.shape},
                          {"data_offsets", {offset, offset + 4 * n}}};
        offset += 4 * n;
    }
    std::string text = header.dump();
    text.append((8 - text.size() % 8) % 8, ' ');  // data starts 8-byte aligned
    const std::string tmp = fmt::format("{}.tmp-{}", path, ::getpid());
    FILE* f = std::fopen(tmp.c_str(), "wb");
    CTX_CHECK(f != nullptr, "{}: cannot create: {}", tmp, std::strerror(errno));
    bool ok = true;
    uint8_t len[8];
    for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(uint64_t(text.size()) >> (8 * i));
    ok = ok && std::fwrite(len, 1, 8, f) == 8;
    ok = ok && std::fwrite(text.data(), 1, text.size(), f) == text.size();
    for (const StWriteTensor& t : tensors) {
        uint64_t n = 1;
        for (int64_t d : t.shape) n *= static_cast<uint64_t>(d);
        if (n) ok = ok && std::fwrite(t.data, sizeof(float), n, f) == n;
    }
    ok = ok && std::fflush(f) == 0 && ::fsync(fileno(f)) == 0;
    ok = (std::fclose(f) == 0) && ok;
    if (!ok || std::rename(tmp.c_str(), path.c_str()) != 0) {
        const int err = errno;
        std::remove(tmp.c_str());
        fail("{}: cannot write: {}", path, std::strerror(err));
    }
}

}  // namespace ctx
