// CPU emulation of sm_90's asynchronous tensor copies for the CUDA emulation
// (run_emulated_tests.py): tensor maps (cuTensorMapEncodeTiled, reached through
// cudaGetDriverEntryPointByVersion as on a GPU), shared-memory barriers (mbarrier: arrival
// counts, transaction bytes, phases) and the tensor copy (cp.async.bulk.tensor) with its
// out-of-bounds zeros and 128-byte swizzle. Semantics in emu/cuda_runtime.h; the device side
// is engine/backend/cuda/cuda_tma.cuh.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <vector>

#include "cuda.h"
#include "cuda_runtime.h"

namespace {

// What the emulated encoder keeps in CUtensorMap::opaque.
struct EmuTensorMap {
    uint64_t magic;
    uint64_t base;
    uint32_t rank, elem_bytes, swizzle_128b, pad;
    uint64_t dims[5];
    uint64_t strides[4];  // bytes, of dims 1-4 (dim 0's is the element size)
    uint32_t box[5];
};
static_assert(sizeof(EmuTensorMap) <= sizeof(CUtensorMap),
              "the emulated map fits the opaque words");
constexpr uint64_t kMapMagic = 0x63747854656E736FULL;

struct MBarrier {
    uint32_t count = 0, pending = 0;
    int64_t tx = 0;      // transaction bytes announced and not yet landed (may dip below 0)
    uint64_t phase = 0;  // phases completed
};
struct PendingCopy {
    uint32_t bar, dst;
    bool swizzle_128b;
    std::vector<char> image;  // the box as it lands, before the swizzle
};
std::map<uint32_t, MBarrier> g_bars;
std::vector<PendingCopy> g_copies;

[[noreturn]] void fail(const char* what) {
    fprintf(stderr, "emu: thread %d: %s\n", emu::thread_linear(), what);
    abort();
}

MBarrier& barrier_at(uint32_t addr) {
    auto it = g_bars.find(addr);
    if (it == g_bars.end()) {
        fprintf(stderr, "emu: thread %d: mbarrier at shared address %u was never initialised\n",
                emu::thread_linear(), addr);
        abort();
    }
    return it->second;
}

void complete_if_done(MBarrier& b) {
    if (b.pending == 0 && b.tx == 0) {
        b.phase++;
        b.pending = b.count;
        emu::note_progress();
    }
}

// 16-byte chunk c of a 128-byte row lands at c ^ (address bits 7-9).
uint32_t swizzled(uint32_t addr) { return addr ^ (((addr >> 7) & 7u) << 4); }

void land(const PendingCopy& c) {
    for (size_t o = 0; o < c.image.size(); o += 16) {
        const uint32_t a = c.dst + uint32_t(o);
        std::memcpy(emu::shared_at(c.swizzle_128b ? swizzled(a) : a, 16, "tensor copy"),
                    c.image.data() + o, 16);
    }
    MBarrier& b = barrier_at(c.bar);
    b.tx -= int64_t(c.image.size());
    emu::note_progress();
    complete_if_done(b);
}

void land_copies_of(uint32_t bar) {
    for (size_t i = 0; i < g_copies.size();) {
        if (g_copies[i].bar == bar) {
            const PendingCopy c = std::move(g_copies[i]);
            g_copies.erase(g_copies.begin() + long(i));
            land(c);
        } else {
            i++;
        }
    }
}

}  // namespace

namespace emu {

void async_block_begin() {
    g_bars.clear();
    g_copies.clear();
}

void async_block_end() {
    if (!g_copies.empty()) {
        fprintf(stderr,
                "emu: the block ended with %zu tensor copies no thread waited for (on a GPU "
                "they may land in the next block's shared memory)\n",
                g_copies.size());
        abort();
    }
}

void mbarrier_init(uint32_t addr, uint32_t count) {
    if (addr % 8 != 0) fail("mbarrier at a shared address not 8-byte aligned");
    if (count < 1 || count >= (1u << 20)) fail("mbarrier.init with a count outside [1, 2^20)");
    shared_at(addr, 8, "mbarrier");
    for (const PendingCopy& c : g_copies)
        if (c.bar == addr) fail("mbarrier.init on a barrier with tensor copies in flight");
    MBarrier b;
    b.count = b.pending = count;
    g_bars[addr] = b;
    note_progress();
}

void mbarrier_arrive(uint32_t addr, uint32_t tx_bytes) {
    MBarrier& b = barrier_at(addr);
    if (b.pending == 0) fail("mbarrier arrival beyond the phase's count (its bytes still due)");
    b.tx += int64_t(tx_bytes);
    b.pending--;
    note_progress();
    complete_if_done(b);
}

void mbarrier_wait(uint32_t addr, uint32_t parity) {
    barrier_at(addr);
    // the phase of this parity has completed once the current phase's parity differs
    for (;;) {
        land_copies_of(addr);
        if ((barrier_at(addr).phase & 1u) != (parity & 1u)) return;
        yield_thread();
    }
}

void tma_load(uint32_t dst, const void* tensor_map, uint32_t bar, const int* coords, int rank) {
    EmuTensorMap m;
    std::memcpy(&m, tensor_map, sizeof m);
    if (m.magic != kMapMagic) fail("tensor copy with a tensor map the encoder did not write");
    if (int(m.rank) != rank) fail("tensor copy of a rank other than its tensor map's");
    if (dst % (m.swizzle_128b ? 1024u : 128u) != 0)
        fail("tensor copy to a shared address not 128-byte aligned (1024 with 128-byte swizzle)");
    barrier_at(bar);
    size_t count = 1;
    for (int d = 0; d < rank; d++) count *= m.box[d];
    PendingCopy c{bar, dst, m.swizzle_128b != 0, std::vector<char>(count * m.elem_bytes, 0)};
    shared_at(dst, c.image.size(), "tensor copy");
    for (const auto& bar_state : g_bars)
        if (bar_state.first + 8 > dst && bar_state.first < dst + c.image.size())
            fail("tensor copy over an mbarrier's 8 bytes");
    int index[5] = {0, 0, 0, 0, 0};
    for (size_t e = 0; e < count; e++) {
        bool inside = true;
        uint64_t at = m.base;
        for (int d = 0; d < rank; d++) {
            const long long x = (long long)coords[d] + index[d];
            inside = inside && x >= 0 && uint64_t(x) < m.dims[d];
            at += uint64_t(x) * (d == 0 ? m.elem_bytes : m.strides[d - 1]);
        }
        if (inside)
            std::memcpy(c.image.data() + e * m.elem_bytes, reinterpret_cast<const void*>(at),
                        m.elem_bytes);
        for (int d = 0; d < rank && ++index[d] == int(m.box[d]); d++) index[d] = 0;
    }
    note_progress();
    if (emu::eager_copies())
        land(c);
    else
        g_copies.push_back(std::move(c));
}

}  // namespace emu

CUresult cuTensorMapEncodeTiled(CUtensorMap* tensorMap, CUtensorMapDataType tensorDataType,
                                cuuint32_t tensorRank, void* globalAddress,
                                const cuuint64_t* globalDim, const cuuint64_t* globalStrides,
                                const cuuint32_t* boxDim, const cuuint32_t* elementStrides,
                                CUtensorMapInterleave interleave, CUtensorMapSwizzle swizzle,
                                CUtensorMapL2promotion, CUtensorMapFloatOOBfill oobFill) {
    uint32_t elem = 0;
    switch (tensorDataType) {
        case CU_TENSOR_MAP_DATA_TYPE_UINT8:
            elem = 1;
            break;
        case CU_TENSOR_MAP_DATA_TYPE_UINT16:
        case CU_TENSOR_MAP_DATA_TYPE_BFLOAT16:
            elem = 2;
            break;
        case CU_TENSOR_MAP_DATA_TYPE_FLOAT32:
            elem = 4;
            break;
    }
    if (elem == 0 || interleave != CU_TENSOR_MAP_INTERLEAVE_NONE ||
        oobFill != CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE ||
        (swizzle != CU_TENSOR_MAP_SWIZZLE_NONE && swizzle != CU_TENSOR_MAP_SWIZZLE_128B)) {
        fprintf(stderr,
                "emu: cuTensorMapEncodeTiled: only swizzle none / 128B, no interleave and "
                "zero fill are emulated\n");
        abort();
    }
    if (tensorMap == nullptr || tensorRank < 1 || tensorRank > 5 ||
        reinterpret_cast<uintptr_t>(globalAddress) % 16 != 0)
        return CUDA_ERROR_INVALID_VALUE;
    EmuTensorMap m{};
    m.magic = kMapMagic;
    m.base = reinterpret_cast<uint64_t>(globalAddress);
    m.rank = tensorRank;
    m.elem_bytes = elem;
    m.swizzle_128b = swizzle == CU_TENSOR_MAP_SWIZZLE_128B;
    for (uint32_t d = 0; d < tensorRank; d++) {
        if (globalDim[d] == 0 || globalDim[d] > (1ULL << 32) || boxDim[d] == 0 || boxDim[d] > 256 ||
            elementStrides[d] != 1)
            return CUDA_ERROR_INVALID_VALUE;
        m.dims[d] = globalDim[d];
        m.box[d] = boxDim[d];
        if (d > 0) {
            m.strides[d - 1] = globalStrides[d - 1];
            if (m.strides[d - 1] % 16 != 0 || m.strides[d - 1] >= (1ULL << 40))
                return CUDA_ERROR_INVALID_VALUE;
        }
    }
    const uint64_t inner = uint64_t(boxDim[0]) * elem;
    if (inner % 16 != 0 || (m.swizzle_128b && inner > 128)) return CUDA_ERROR_INVALID_VALUE;
    if (m.swizzle_128b && inner != 128) {
        fprintf(stderr,
                "emu: cuTensorMapEncodeTiled: 128-byte swizzle of %llu-byte rows (only "
                "whole 128-byte rows are emulated)\n",
                static_cast<unsigned long long>(inner));
        abort();
    }
    std::memset(tensorMap, 0, sizeof *tensorMap);
    std::memcpy(tensorMap, &m, sizeof m);
    return CUDA_SUCCESS;
}

cudaError_t cudaGetDriverEntryPointByVersion(const char* symbol, void** fn, unsigned,
                                             unsigned long long,
                                             cudaDriverEntryPointQueryResult* status) {
    const bool known = std::strcmp(symbol, "cuTensorMapEncodeTiled") == 0;
    *fn = known ? reinterpret_cast<void*>(&cuTensorMapEncodeTiled) : nullptr;
    if (status != nullptr)
        *status = known ? cudaDriverEntryPointSuccess : cudaDriverEntryPointSymbolNotFound;
    return known ? cudaSuccess : cudaErrorInvalidValue;
}
