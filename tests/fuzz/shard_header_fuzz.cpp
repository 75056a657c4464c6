// libFuzzer target for the token shard reader (data/shard.h, ShardReader): any byte string taken
// as a whole .shard file must be refused with ctx::Error or read safely. The header checksum would
// stop almost every mutation at the first check, so each input is read twice: as it is, and with
// the checksum field recomputed over the (mutated) header, which lets the fuzzer reach the size,
// offset, index and token checks behind it. A shard that opens is then read through every
// accessor; what they return must stay inside the file.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "core/error.h"
#include "data/shard.h"
#include "fuzz_support.h"

namespace {

// The header checksum as data/shard.cpp computes it (FNV-1a 64 of header bytes [0, 56)).
constexpr size_t kChecksummed = 56;
uint64_t fnv1a64(const uint8_t* p, size_t n) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}

void read_everything(const ctx::ShardReader& shard, size_t file_size) {
    if (shard.n_tokens() < 0 || static_cast<uint64_t>(shard.n_tokens()) > file_size)
        __builtin_trap();
    int64_t total = 0;
    std::vector<int32_t> buf;
    for (int64_t d = 0; d < shard.n_docs(); ++d) {
        const int64_t len = shard.doc_len(d);
        if (len < 0 || len > shard.n_tokens()) __builtin_trap();
        total += len;
        buf.resize(static_cast<size_t>(len));
        shard.read(d, 0, len, buf.data());
        for (int32_t t : buf)
            if (t < 0 || t >= shard.vocab_size()) __builtin_trap();  // verify_tokens promised it
        if (len > 0 && shard.token(d, len - 1) != buf.back()) __builtin_trap();
        const ctx::DocView v = shard.doc(d);
        if (v.length != len) __builtin_trap();
    }
    if (total != shard.n_tokens()) __builtin_trap();
    // Out-of-range requests are errors, not reads.
    auto must_refuse = [&](int64_t doc, int64_t start, int64_t n) {
        int32_t sink[1];
        try {
            shard.read(doc, start, n, sink);
        } catch (const ctx::Error&) {
            return;
        }
        __builtin_trap();
    };
    must_refuse(-1, 0, 0);
    must_refuse(shard.n_docs(), 0, 0);
    if (shard.n_docs() > 0) {
        must_refuse(0, -1, 1);
        must_refuse(0, 0, shard.doc_len(0) + 1);
    }
}

void try_read(const uint8_t* data, size_t size) {
    const ctx::fuzz::MemFile file(data, size);
    try {
        const ctx::ShardReader shard(file.path(), /*verify_tokens=*/true);
        read_everything(shard, size);
    } catch (const ctx::Error& e) {
        ctx::fuzz::note(e);
    }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    try_read(data, size);
    if (size >= ctx::kShardHeaderBytes) {
        std::vector<uint8_t> fixed(data, data + size);
        const uint64_t sum = fnv1a64(fixed.data(), kChecksummed);
        std::memcpy(fixed.data() + kChecksummed, &sum, sizeof sum);
        if (std::memcmp(fixed.data(), data, ctx::kShardHeaderBytes) != 0)
            try_read(fixed.data(), fixed.size());
    }
    return 0;
}
