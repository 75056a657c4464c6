// CPU emulation of the CUDA runtime subset the ctxengine CUDA backend uses, for checking the
// backend's LOGIC on a machine without a GPU (engine/backend/cuda/emu/run_emulated_tests.py).
// Not part of any build target. Passing under emulation is not a GPU validation: see
// docs/CUDA.md.
//
// Device memory is tracked host memory (so cudaPointerGetAttributes tells the backend's staging
// code host from device exactly as the runtime does), filled with garbage by cudaMalloc; kernels
// are ucontext fibers scheduled round-robin with barrier emulation and deadlock detection (and
// wgmma, cp.async as the GPU orders them); cuBLAS and cuBLASLt are emulated in emu_blas.cpp.
// Streams are synchronous, or (CTX_EMU_STREAM=deferred) one queue that runs at
// synchronisations.
#include <ucontext.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <random>
#include <vector>

#include "cublasLt.h"
#include "cublas_v2.h"
#include "cuda_bf16.h"
#include "cuda_runtime.h"

namespace emu {
emu_uint3 g_tid{0, 0, 0}, g_bid{0, 0, 0};
dim3 g_bdim, g_gdim;

namespace {
// The emulator's two-way switches (CTX_EMU_*): unset or `off` is false, `on` true; any other
// value stops the run, naming the variable and what it takes.
bool env_choice(const char* var, const char* off, const char* on) {
    const char* e = std::getenv(var);
    if (e == nullptr || std::strcmp(e, off) == 0) return false;
    if (std::strcmp(e, on) == 0) return true;
    fprintf(stderr, "emu: %s=%s (expected %s or %s)\n", var, e, off, on);
    abort();
}

struct PendingCopy { void* dst; unsigned char bytes[16]; int n; };
struct PendingWgmma {
    float* d;
    int n;
    bool a_regs, accumulate, trans_b;
    float a[32];  // rows g and g + 8 of A (a_regs)
    uint64_t desc_a, desc_b;
    const uint32_t* a_frag;  // the thread's A registers (a_regs), and their values at the issue
    uint32_t a_issued[4];
    // d at the issue, for the first product of a chain on d (later ones see its results)
    bool d_snap;
    float d_issued[128];
};
struct Fiber {
    ucontext_t ctx;
    emu_uint3 tid;
    int linear = 0;
    bool done = false;
    std::vector<PendingCopy> open;                   // cp.async copies not yet committed
    std::vector<std::vector<PendingCopy>> committed;  // groups in commit order
    std::vector<PendingWgmma> wg_open;                // wgmma products not yet committed
    std::vector<std::vector<PendingWgmma>> wg_committed;  // groups in commit order
    long named_phase[16];  // the phase of each named barrier this thread last arrived in
};
struct Barrier { int count = 0, alive = 0; unsigned gen = 0; };
// A named barrier's phase: arrivals so far, the count its first arrival named (0: none yet).
struct NamedBarrier {
    int arrived = 0, count = 0;
    long phase = 0;
};
ucontext_t g_sched;
std::vector<Fiber> g_fibers;
std::vector<std::vector<char>> g_stacks;
Fiber* g_cur = nullptr;
Barrier g_block;
std::vector<Barrier> g_warps, g_warpgroups;
NamedBarrier g_named[16];
std::vector<int> g_warpgroup_regs;  // setmaxnreg's count per warpgroup (0: the launch's)
std::vector<uint64_t> g_slots;
std::vector<char> g_dyn;
const std::function<void()>* g_body = nullptr;
bool g_progress = false;
constexpr size_t kStack = 256 * 1024;

void yield() { swapcontext(&g_cur->ctx, &g_sched); }

void release_if_complete(Barrier& b) {
    if (b.count > 0 && b.count == b.alive) { b.count = 0; b.gen++; g_progress = true; }
}

void wait(Barrier& b) {
    const unsigned gen = b.gen;
    g_progress = true;
    if (++b.count == b.alive) { b.count = 0; b.gen++; return; }
    while (b.gen == gen) yield();
}

void trampoline();

void setup_fiber(int t, dim3 b) {
    Fiber& f = g_fibers[size_t(t)];
    f.linear = t;
    for (long& p : f.named_phase) p = -1;
    f.tid = {unsigned(t) % b.x, (unsigned(t) / b.x) % b.y, unsigned(t) / (b.x * b.y)};
    getcontext(&f.ctx);
    f.ctx.uc_stack.ss_sp = g_stacks[size_t(t)].data();
    f.ctx.uc_stack.ss_size = kStack;
    f.ctx.uc_link = nullptr;
    makecontext(&f.ctx, trampoline, 0);
}

void trampoline() {
    (*g_body)();
    if (!g_cur->wg_open.empty() || !g_cur->wg_committed.empty()) {
        fprintf(stderr, "emu: thread %d ended with wgmma products not waited for\n", g_cur->linear);
        abort();
    }
    g_cur->done = true;
    g_progress = true;
    g_block.alive--;
    Barrier& w = g_warps[size_t(g_cur->linear / 32)];
    w.alive--;
    Barrier& wg = g_warpgroups[size_t(g_cur->linear / 128)];
    wg.alive--;
    release_if_complete(g_block);
    release_if_complete(w);
    release_if_complete(wg);
    swapcontext(&g_cur->ctx, &g_sched);
}
}  // namespace

void syncthreads() { wait(g_block); }
bool eager_copies() {
    static const bool eager = env_choice("CTX_EMU_CP_ASYNC", "deferred", "eager");
    return eager;
}
void yield_thread() { yield(); }
void note_progress() { g_progress = true; }
int thread_linear() { return g_cur->linear; }
char* shared_at(uint32_t addr, size_t bytes, const char* what) {
    if (addr < kSharedBase || addr - kSharedBase + bytes > g_dyn.size() - 16) {
        fprintf(stderr,
                "emu: thread %d: %s of %zu bytes at shared address %u, outside the %zu bytes of "
                "dynamic shared memory (from address %u)\n",
                g_cur->linear, what, bytes, addr, g_dyn.size() - 16, kSharedBase);
        abort();
    }
    return g_dyn.data() + (addr - kSharedBase);
}
void cp_async(void* dst, const void* src, int bytes, int src_bytes) {
    if (bytes != 4 && bytes != 8 && bytes != 16) {
        fprintf(stderr, "emu: cp.async of %d bytes (4, 8 or 16)\n", bytes);
        abort();
    }
    if (uintptr_t(dst) % unsigned(bytes) != 0 || (src_bytes > 0 && uintptr_t(src) % unsigned(bytes) != 0)) {
        fprintf(stderr, "emu: cp.async of %d bytes from/to a misaligned address\n", bytes);
        abort();
    }
    PendingCopy c{dst, {}, bytes};
    const int n = src_bytes < bytes ? (src_bytes > 0 ? src_bytes : 0) : bytes;
    if (n > 0) std::memcpy(c.bytes, src, size_t(n));
    std::memset(c.bytes + n, 0, size_t(bytes - n));
    // CTX_EMU_CP_ASYNC=eager lands a copy when it is issued: the other race, a stage refilled
    // while another warp still reads it (a missing barrier before the next cp.async), then
    // shows; the default (deferred) shows a tile read before its wait.
    if (eager_copies()) {
        std::memcpy(c.dst, c.bytes, size_t(c.n));
        return;
    }
    g_cur->open.push_back(c);
}
void cp_async_commit() {
    g_cur->committed.push_back(std::move(g_cur->open));
    g_cur->open.clear();
}
void cp_async_wait(int newest_pending) {
    auto& groups = g_cur->committed;
    while (int(groups.size()) > newest_pending) {
        for (const PendingCopy& c : groups.front()) std::memcpy(c.dst, c.bytes, size_t(c.n));
        groups.erase(groups.begin());
    }
}
void warp_barrier() { wait(g_warps[size_t(g_cur->linear / 32)]); }
int lane_id() { return g_cur->linear % 32; }
uint64_t& warp_slot(int lane) { return g_slots[size_t(g_cur->linear / 32) * 32 + size_t(lane)]; }
void* dyn_shared() { return g_dyn.data(); }
void warp_gather(const void* mine, size_t bytes, void* all) {
    static unsigned char buf[32][32][64];  // [warp][lane][bytes]
    if (bytes > sizeof buf[0][0]) {
        fprintf(stderr, "emu: warp_gather of %zu bytes (at most 64)\n", bytes);
        abort();
    }
    const int w = g_cur->linear / 32, lane = g_cur->linear % 32;
    std::memcpy(buf[w][lane], mine, bytes);
    warp_barrier();
    for (int l = 0; l < 32; l++) std::memcpy(static_cast<char*>(all) + l * bytes, buf[w][l], bytes);
    warp_barrier();
}

// ---------------------------------------------------------------- wgmma
void warpgroup_barrier() {
    if (g_bdim.x * g_bdim.y * g_bdim.z % 128 != 0) {
        fprintf(stderr, "emu: wgmma in a block of %u threads (whole warpgroups of 128 needed)\n",
                g_bdim.x * g_bdim.y * g_bdim.z);
        abort();
    }
    wait(g_warpgroups[size_t(g_cur->linear / 128)]);
}

// ---------------------------------------------------------------- named barriers
void named_barrier(int id, int count, bool wait_for_it) {
    const int nt = int(g_bdim.x * g_bdim.y * g_bdim.z);
    if (id < 1 || id > 15 || count <= 0 || count % 32 != 0 || count > nt) {
        fprintf(stderr,
                "emu: thread %d: named barrier %d with count %d (ids 1-15, 0 is __syncthreads'; "
                "a count a multiple of 32, at most the block's %d threads)\n",
                g_cur->linear, id, count, nt);
        abort();
    }
    NamedBarrier& b = g_named[id];
    if (b.arrived > 0 && b.count != count) {
        fprintf(stderr, "emu: thread %d: named barrier %d with count %d, its phase began with %d\n",
                g_cur->linear, id, count, b.count);
        abort();
    }
    // The hardware counts arrivals, not threads: a second arrival of one thread in a phase
    // would stand in for a thread that has not come, a protocol error in every use we have.
    if (g_cur->named_phase[id] == b.phase) {
        fprintf(stderr, "emu: thread %d arrived twice at named barrier %d in one phase\n",
                g_cur->linear, id);
        abort();
    }
    g_cur->named_phase[id] = b.phase;
    g_progress = true;
    b.count = count;
    if (++b.arrived == count) {
        b.arrived = 0;
        b.phase++;
        return;
    }
    const long phase = b.phase;
    if (wait_for_it)
        while (b.phase == phase) yield();
}

void set_max_registers(int regs) {
    if (regs < 24 || regs > 256 || regs % 8 != 0) {
        fprintf(stderr, "emu: thread %d: setmaxnreg %d (24-256, a multiple of 8)\n", g_cur->linear,
                regs);
        abort();
    }
    // .sync.aligned over the warpgroup: all of its threads, the same count
    const int wg = g_cur->linear / 128;
    warpgroup_barrier();
    if (g_warpgroup_regs[size_t(wg)] != 0 && g_warpgroup_regs[size_t(wg)] != regs) {
        fprintf(stderr, "emu: warpgroup %d: setmaxnreg %d and %d in one step\n", wg,
                g_warpgroup_regs[size_t(wg)], regs);
        abort();
    }
    g_warpgroup_regs[size_t(wg)] = regs;
    warpgroup_barrier();
    g_warpgroup_regs[size_t(wg)] = 0;
    warpgroup_barrier();
}

namespace {
// The bf16 at shared address `at` of the dynamic shared memory, as a float.
float smem_bf16(size_t at) {
    if (at % 2 != 0 || at < kSharedBase || at - kSharedBase + 2 > g_dyn.size() - 16) {
        fprintf(stderr,
                "emu: wgmma operand at shared address %zu outside the %zu bytes of dynamic "
                "shared memory (from address %u)\n",
                at, g_dyn.size() - 16, kSharedBase);
        abort();
    }
    uint16_t h;
    std::memcpy(&h, g_dyn.data() + (at - kSharedBase), 2);
    const uint32_t u = uint32_t(h) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}
// Element (row, k) (row along M / N, k < 16) of an operand by its descriptor.
// No swizzle (mode 0): 8 x 8 core matrices, core matrix (row / 8, k / 8) at start + (row / 8) SBO
// + (k / 8) LBO; within it 16-byte rows along K (K-major), or along M / N (n_major: the PTX ISA's
// MN-major "interleave" layout).
// 128-byte swizzle (mode 1), 1024-byte atoms of 8 rows of 128 bytes: K-major, row r at start +
// (r / 8) SBO + (r % 8) 128 and k along the row (the instruction's 32 bytes of K within it; LBO
// unused); MN-major, K row k at start + (k / 8) SBO + (k % 8) 128 with 64 M / N values along it
// and the next 64 LBO on (the strides trade places against the no-swizzle MN-major layout, as
// CUTLASS's canonical GMMA layouts have them). The address then has its 16-byte chunk (bits 4-6)
// XORed with bits 7-9, the pattern TMA's 128-byte swizzle writes.
float desc_element(uint64_t desc, int row, int k, bool n_major = false) {
    const unsigned mode = unsigned(desc >> 62);
    if ((mode != 0 && mode != 1) || ((desc >> 49) & 7u) != 0) {
        fprintf(stderr,
                "emu: wgmma descriptor 0x%016llx: only no swizzle and 128-byte swizzle with base "
                "offset 0 are emulated\n",
                static_cast<unsigned long long>(desc));
        abort();
    }
    const size_t start = size_t(desc & 0x3FFFu) << 4, lbo = size_t((desc >> 16) & 0x3FFFu) << 4,
                 sbo = size_t((desc >> 32) & 0x3FFFu) << 4;
    if (mode == 0) {
        const size_t within = n_major ? size_t(k % 8) * 16 + size_t(row % 8) * 2
                                      : size_t(row % 8) * 16 + size_t(k % 8) * 2;
        return smem_bf16(start + size_t(row / 8) * sbo + size_t(k / 8) * lbo + within);
    }
    size_t at;
    if (n_major) {
        at = start + size_t(k / 8) * sbo + size_t(k % 8) * 128 + size_t(row / 64) * lbo +
             size_t(row % 64) * 2;
        if (start % 128 != 0) {
            fprintf(stderr,
                    "emu: MN-major 128-byte swizzled wgmma operand at %zu (only 128-byte aligned "
                    "starts are emulated)\n",
                    start);
            abort();
        }
    } else {
        at = start + size_t(row / 8) * sbo + size_t(row % 8) * 128 + size_t(k) * 2;
        if (start % 128 + 32 > 128) {
            fprintf(stderr,
                    "emu: K-major 128-byte swizzled wgmma operand at %zu: its 32 bytes of K "
                    "cross a 128-byte row\n",
                    start);
            abort();
        }
    }
    return smem_bf16(at ^ (((at >> 7) & 7u) << 4));
}
void run_wgmma(const PendingWgmma& op, int linear) {
    if (op.d_snap && std::memcmp(op.d, op.d_issued, sizeof(float) * size_t(op.n / 2)) != 0) {
        fprintf(stderr,
                "emu: thread %d changed a wgmma's accumulators before the wait that completes "
                "it\n",
                linear);
        abort();
    }
    if (op.a_regs && std::memcmp(op.a_frag, op.a_issued, sizeof op.a_issued) != 0) {
        fprintf(stderr,
                "emu: thread %d changed a wgmma's A registers before the wait that completes "
                "it\n",
                linear);
        abort();
    }
    const int w = (linear / 32) % 4, lane = linear % 32, g = lane / 4, t = lane % 4;
    for (int i = 0; i < op.n / 8; i++)
        for (int h = 0; h < 2; h++)
            for (int e = 0; e < 2; e++) {
                const int row = 16 * w + g + 8 * h, col = 8 * i + 2 * t + e;
                float& out = op.d[4 * i + 2 * h + e];
                float acc = op.accumulate ? out : 0.0f;
                for (int k = 0; k < 16; k++) {
                    const float x = op.a_regs ? op.a[16 * h + k] : desc_element(op.desc_a, row, k);
                    acc = std::fma(x, desc_element(op.desc_b, col, k, op.trans_b), acc);
                }
                out = acc;
            }
}
}  // namespace

void wgmma_issue(float* d, int n, const float* a_rows, const uint32_t* a_frag, uint64_t desc_a,
                 uint64_t desc_b, bool accumulate, bool trans_b) {
    if (n % 8 != 0 || n < 8 || n > 256) {
        fprintf(stderr, "emu: wgmma with n = %d\n", n);
        abort();
    }
    warpgroup_barrier();
    PendingWgmma op{
        d, n, a_rows != nullptr, accumulate, trans_b, {}, desc_a, desc_b, a_frag, {}, false, {}};
    if (a_rows != nullptr) {
        std::memcpy(op.a, a_rows, sizeof op.a);
        std::memcpy(op.a_issued, a_frag, sizeof op.a_issued);
    }
    bool chained = false;  // an earlier product in flight on the same accumulators
    for (const PendingWgmma& o : g_cur->wg_open) chained = chained || o.d == d;
    for (const auto& group : g_cur->wg_committed)
        for (const PendingWgmma& o : group) chained = chained || o.d == d;
    if (!chained) {
        op.d_snap = true;
        std::memcpy(op.d_issued, d, sizeof(float) * size_t(n / 2));
    }
    g_cur->wg_open.push_back(op);
}
void wgmma_commit() {
    g_cur->wg_committed.push_back(std::move(g_cur->wg_open));
    g_cur->wg_open.clear();
}
// Whether a thread lets every other thread of the block run on (to its next yield) before its
// products run at a wait, so they read their shared-memory operands as late as a GPU's might:
// a write that races with them (a tile refilled or a dS tile stored too early) then shows.
// CTX_EMU_WGMMA_WAIT=yield turns it on, =run (the default) runs them at once.
bool wgmma_wait_yields() {
    static const bool yields = env_choice("CTX_EMU_WGMMA_WAIT", "run", "yield");
    return yields;
}

void wgmma_wait(int newest_pending) {
    auto& groups = g_cur->wg_committed;
    if (int(groups.size()) > newest_pending && wgmma_wait_yields()) {
        g_progress = true;  // not a barrier wait: the scheduler's deadlock check must not count it
        yield();
    }
    while (int(groups.size()) > newest_pending) {
        for (const PendingWgmma& op : groups.front()) run_wgmma(op, g_cur->linear);
        groups.erase(groups.begin());
    }
}

namespace {
// The emulated devices: CTX_EMU_DEVICES of them (default 1, at most 8), all alike and all
// backed by host memory; what differs per device is the state a GPU keeps per device, such as a
// kernel's raised shared-memory limit (a launcher that raises it once per process fails on the
// second device, as on a machine with two GPUs).
int g_device = 0;
std::map<std::pair<const void*, int>, size_t>& dyn_limits() {
    static std::map<std::pair<const void*, int>, size_t> m;
    return m;
}
}  // namespace

int device_count() {
    static const int n = [] {
        const char* e = std::getenv("CTX_EMU_DEVICES");
        if (e == nullptr) return 1;
        char* end = nullptr;
        const long v = std::strtol(e, &end, 10);
        if (end == e || *end != '\0' || v < 1 || v > 8) {
            fprintf(stderr, "emu: CTX_EMU_DEVICES=%s (expected a count in [1, 8])\n", e);
            abort();
        }
        return int(v);
    }();
    return n;
}
int current_device() { return g_device; }
void set_current_device(int d) { g_device = d; }

void set_dyn_shared_limit(const void* kernel, int bytes) {
    dyn_limits()[{kernel, g_device}] = size_t(bytes);
}
size_t smem_optin() {
    static const size_t optin = [] {
        const char* e = std::getenv("CTX_EMU_SMEM_OPTIN");
        if (e == nullptr) return size_t(227 * 1024);
        char* end = nullptr;
        const long v = std::strtol(e, &end, 10);
        if (end == e || *end != '\0' || v < 48 * 1024 || v > 227 * 1024) {
            fprintf(stderr, "emu: CTX_EMU_SMEM_OPTIN=%s (expected bytes in [49152, 232448])\n", e);
            abort();
        }
        return size_t(v);
    }();
    return optin;
}
size_t dyn_shared_limit(const void* kernel) {
    const auto it = dyn_limits().find({kernel, g_device});
    return it == dyn_limits().end() ? size_t(48 * 1024) : std::max(size_t(48 * 1024), it->second);
}
void check_dyn_shared(const void* kernel, size_t shmem) {
    if (shmem > dyn_shared_limit(kernel)) {
        fprintf(stderr,
                "emu: dynamic shared %zu > the kernel's limit %zu on device %d "
                "(cudaFuncSetAttribute)\n",
                shmem, dyn_shared_limit(kernel), g_device);
        abort();
    }
}

// Between two barriers the threads of a block run one after another, lowest first, so a
// thread that reads what a higher thread writes in the same interval (a missing barrier) reads
// the old value and the result shows it; a read of a lower thread's write does not show.
// CTX_EMU_THREAD_ORDER=reverse runs the highest first, which shows the other half.
bool reverse_threads() {
    static const bool reverse = env_choice("CTX_EMU_THREAD_ORDER", "forward", "reverse");
    return reverse;
}

// What a block's dynamic shared memory holds before its threads write it (a real SM's holds
// whatever the last block left). 0xFF bytes by default: NaN as bf16 and fp32, so any read of
// shared memory a kernel never wrote poisons what it feeds, even multiplied by a masked zero
// (every op test passed so, 2026-12-06). CTX_EMU_SHARED_FILL=garbage fills it with 0xAB bytes
// instead (tiny numbers as bf16 and fp32: the fill before then, whose reads came out as a small
// error).
char shared_fill() {
    static const char fill =
        env_choice("CTX_EMU_SHARED_FILL", "nan", "garbage") ? char(0xAB) : char(0xFF);
    return fill;
}

// CTX_EMU_SCHEDULE=random[:SEED]: each round of the block's scheduler pauses every warp with
// probability 1/2 (every fourth round runs them all, and only such a round's lack of progress
// is a deadlock), so warps drift apart as on an SM: one may cross several barriers that others
// have already arrived at while another still sits between issuing a product and waiting for
// it. The round-robin default runs every thread every round. Returns the seed, or -1.
long long random_schedule_seed() {
    static const long long seed = [] {
        const char* e = std::getenv("CTX_EMU_SCHEDULE");
        if (e == nullptr || std::strcmp(e, "round-robin") == 0) return -1LL;
        if (std::strcmp(e, "random") == 0) return 1LL;
        if (std::strncmp(e, "random:", 7) == 0) {
            char* end = nullptr;
            const long long v = std::strtoll(e + 7, &end, 10);
            if (end != e + 7 && *end == '\0' && v >= 0) return v;
        }
        fprintf(stderr, "emu: CTX_EMU_SCHEDULE=%s (expected round-robin, random or random:SEED)\n",
                e);
        abort();
    }();
    return seed;
}

bool deferred_streams() {
    static const bool deferred = [] {
        if (!env_choice("CTX_EMU_STREAM", "sync", "deferred")) return false;
        fprintf(stderr, "emu: deferred streams (work runs at synchronisations)\n");
        return true;
    }();
    return deferred;
}

namespace {
std::deque<std::function<void()>> g_queue;
bool g_flushing = false;
}  // namespace

void enqueue(std::function<void()> job) {
    if (!deferred_streams() || g_flushing) {
        job();
        return;
    }
    g_queue.push_back(std::move(job));
}

void flush() {
    if (g_flushing) return;
    g_flushing = true;
    while (!g_queue.empty()) {
        std::function<void()> job = std::move(g_queue.front());
        g_queue.pop_front();
        job();
    }
    g_flushing = false;
}

void run_grid(dim3 g, dim3 b, size_t shmem, const std::function<void()>& body) {
    const int nt = int(b.x * b.y * b.z);
    if (nt > 1024 || nt <= 0) { fprintf(stderr, "emu: bad block size %d\n", nt); abort(); }
    if (shmem > smem_optin()) {
        fprintf(stderr, "emu: dynamic shared %zu > the device's %zu\n", shmem, smem_optin());
        abort();
    }
    g_gdim = g;
    g_bdim = b;
    g_body = &body;
    while (g_stacks.size() < size_t(nt)) g_stacks.emplace_back(kStack);
    const int nw = (nt + 31) / 32;
    for (unsigned bz = 0; bz < g.z; bz++)
    for (unsigned by = 0; by < g.y; by++)
    for (unsigned bx = 0; bx < g.x; bx++) {
        g_bid = {bx, by, bz};
        g_dyn.assign(shmem + 16, shared_fill());  // as uninitialised shared memory
        async_block_begin();
        g_fibers.assign(size_t(nt), Fiber{});
        g_block = Barrier{0, nt, 0};
        g_warps.assign(size_t(nw), Barrier{});
        for (int w = 0; w < nw; w++) g_warps[size_t(w)].alive = std::min(32, nt - 32 * w);
        g_warpgroups.assign(size_t((nt + 127) / 128), Barrier{});
        for (size_t w = 0; w < g_warpgroups.size(); w++)
            g_warpgroups[w].alive = std::min(128, nt - 128 * int(w));
        g_slots.assign(size_t(nw) * 32, 0);
        for (NamedBarrier& n : g_named) n = NamedBarrier{};
        g_warpgroup_regs.assign(g_warpgroups.size(), 0);
        for (int t = 0; t < nt; t++) setup_fiber(t, b);
        int alive = nt;
        const long long seed = random_schedule_seed();
        std::mt19937_64 rng(uint64_t(seed) ^ (uint64_t(bx) << 40 | uint64_t(by) << 20 | bz));
        std::vector<char> paused(size_t(nw), 0);
        for (long round = 0; alive > 0; round++) {
            g_progress = false;
            const bool all_run = seed < 0 || round % 4 == 3;
            for (int w = 0; w < nw; w++) paused[size_t(w)] = !all_run && (rng() & 1u);
            for (int k = 0; k < nt; k++) {
                const int t = reverse_threads() ? nt - 1 - k : k;
                Fiber& f = g_fibers[size_t(t)];
                if (f.done || paused[size_t(t / 32)]) continue;
                g_cur = &f;
                g_tid = f.tid;
                swapcontext(&g_sched, &f.ctx);
            }
            alive = 0;
            for (auto& f : g_fibers) alive += f.done ? 0 : 1;
            if (alive > 0 && !g_progress && all_run) {
                fprintf(stderr, "emu: barrier deadlock in block (%u,%u,%u): %d threads waiting\n",
                        bx, by, bz, alive);
                abort();
            }
        }
        async_block_end();
        // arrivals no thread waited for: the protocol's counts do not balance (on a GPU the
        // next block on the SM starts with fresh barriers, so this goes unseen there)
        for (int id = 1; id < 16; id++)
            if (g_named[id].arrived > 0) {
                fprintf(stderr,
                        "emu: block (%u,%u,%u) ended with %d of %d arrivals at named barrier %d\n",
                        bx, by, bz, g_named[id].arrived, g_named[id].count, id);
                abort();
            }
    }
}
}  // namespace emu

// ---------------------------------------------------------------- runtime API
namespace {
std::map<uintptr_t, size_t> g_allocs;
}  // namespace
namespace emu {
bool is_dev(const void* p) {
    const uintptr_t a = uintptr_t(p);
    auto it = g_allocs.upper_bound(a);
    if (it == g_allocs.begin()) return false;
    --it;
    return a >= it->first && a < it->first + it->second;
}
void check_range(const void* p, size_t bytes, const char* what) {
    const uintptr_t a = uintptr_t(p);
    auto it = g_allocs.upper_bound(a);
    if (it == g_allocs.begin()) return;
    --it;
    if (a < it->first || a >= it->first + it->second) return;  // host memory
    if (a + bytes > it->first + it->second) {
        fprintf(stderr, "emu: %s of %zu bytes runs past the end of a %zu-byte allocation\n", what,
                bytes, it->second);
        abort();
    }
}
}  // namespace emu
using emu::check_range;
using emu::is_dev;

cudaError_t cudaGetDeviceCount(int* n) {
    *n = emu::device_count();
    return cudaSuccess;
}
cudaError_t cudaSetDevice(int d) {
    if (d < 0 || d >= emu::device_count()) return cudaErrorInvalidDevice;
    emu::set_current_device(d);
    return cudaSuccess;
}
cudaError_t cudaGetDevice(int* d) {
    *d = emu::current_device();
    return cudaSuccess;
}
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* p, int d) {
    if (d < 0 || d >= emu::device_count()) return cudaErrorInvalidDevice;
    std::memset(p, 0, sizeof(*p));
    std::strcpy(p->name, "CPU emulation");
    p->major = 9; p->minor = 0; p->totalGlobalMem = size_t(80) << 30;
    p->sharedMemPerBlockOptin = emu::smem_optin();  // sm_90, or CTX_EMU_SMEM_OPTIN
    return cudaSuccess;
}
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned) { *s = reinterpret_cast<cudaStream_t>(0x1); return cudaSuccess; }
cudaError_t cudaStreamDestroy(cudaStream_t) { return cudaSuccess; }
cudaError_t cudaStreamSynchronize(cudaStream_t) { emu::flush(); return cudaSuccess; }
struct emu_event {
    std::chrono::steady_clock::time_point at;
    bool recorded = false;
    bool pending = false;  // recorded on the queue, not yet reached
};
cudaError_t cudaEventCreate(cudaEvent_t* e) { *e = new emu_event; return cudaSuccess; }
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned) { return cudaEventCreate(e); }
cudaError_t cudaEventQuery(cudaEvent_t e) { return e->pending ? cudaErrorNotReady : cudaSuccess; }
cudaError_t cudaEventDestroy(cudaEvent_t e) {
    if (e->pending) emu::flush();  // the queued record still refers to it
    delete e;
    return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t) {
    e->pending = true;
    emu::enqueue([e] {
        e->at = std::chrono::steady_clock::now();
        e->recorded = true;
        e->pending = false;
    });
    return cudaSuccess;
}
// as CUDA, recorded or not; here it runs the whole queue
cudaError_t cudaEventSynchronize(cudaEvent_t) { emu::flush(); return cudaSuccess; }
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t from, cudaEvent_t to) {
    if (from->pending || to->pending) return cudaErrorNotReady;
    if (!from->recorded || !to->recorded) return cudaErrorInvalidValue;
    *ms = std::chrono::duration<float, std::milli>(to->at - from->at).count();
    return cudaSuccess;
}
cudaError_t cudaDeviceSynchronize() { emu::flush(); return cudaSuccess; }
cudaError_t cudaMalloc(void** p, size_t bytes) {
    void* q = nullptr;
    if (posix_memalign(&q, 256, bytes ? bytes : 1) != 0) return cudaErrorMemoryAllocation;
    std::memset(q, 0x7f, bytes);  // garbage, as cudaMalloc
    g_allocs[uintptr_t(q)] = bytes;
    *p = q;
    return cudaSuccess;
}
cudaError_t cudaFree(void* p) {
    if (!p) return cudaSuccess;
    emu::flush();  // cudaFree waits for the device
    auto it = g_allocs.find(uintptr_t(p));
    if (it == g_allocs.end()) { fprintf(stderr, "emu: cudaFree of unknown pointer\n"); abort(); }
    g_allocs.erase(it);
    std::free(p);
    return cudaSuccess;
}
namespace {
std::map<uintptr_t, size_t> g_pinned;
}  // namespace
cudaError_t cudaHostAlloc(void** p, size_t bytes, unsigned) {
    *p = std::malloc(bytes ? bytes : 1);
    if (*p == nullptr) return cudaErrorMemoryAllocation;
    g_pinned[uintptr_t(*p)] = bytes;
    return cudaSuccess;
}
cudaError_t cudaFreeHost(void* p) {
    if (!p) return cudaSuccess;
    emu::flush();
    if (g_pinned.erase(uintptr_t(p)) == 0) { fprintf(stderr, "emu: cudaFreeHost of unknown pointer\n"); abort(); }
    std::free(p);
    return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind, cudaStream_t) {
    check_range(dst, bytes, "cudaMemcpyAsync destination");
    check_range(src, bytes, "cudaMemcpyAsync source");
    if (bytes == 0) return cudaSuccess;
    cudaPointerAttributes a;
    cudaPointerGetAttributes(&a, src);
    if (a.type == cudaMemoryTypeUnregistered) {  // pageable: CUDA stages the source at the call
        auto staged = std::make_shared<std::vector<unsigned char>>(
            static_cast<const unsigned char*>(src), static_cast<const unsigned char*>(src) + bytes);
        emu::enqueue([dst, staged] { std::memmove(dst, staged->data(), staged->size()); });
    } else {
        emu::enqueue([dst, src, bytes] { std::memmove(dst, src, bytes); });
    }
    return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void* p, int v, size_t bytes, cudaStream_t) {
    if (!is_dev(p) || !is_dev(static_cast<char*>(p) + bytes - 1)) { fprintf(stderr, "emu: memset outside device memory\n"); abort(); }
    emu::enqueue([p, v, bytes] { std::memset(p, v, bytes); });
    return cudaSuccess;
}
cudaError_t cudaGetLastError() { return cudaSuccess; }
const char* cudaGetErrorString(cudaError_t) { return "emulated error"; }
const char* cudaGetErrorName(cudaError_t) { return "cudaErrorEmulated"; }
cudaError_t cudaPointerGetAttributes(cudaPointerAttributes* a, const void* p) {
    std::memset(a, 0, sizeof(*a));
    a->type = is_dev(p) ? cudaMemoryTypeDevice : cudaMemoryTypeUnregistered;
    if (a->type == cudaMemoryTypeUnregistered) {
        auto it = g_pinned.upper_bound(uintptr_t(p));
        if (it != g_pinned.begin() && uintptr_t(p) < (--it)->first + it->second) a->type = cudaMemoryTypeHost;
    }
    return cudaSuccess;
}
