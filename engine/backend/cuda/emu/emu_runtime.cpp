// CPU emulation of the CUDA runtime subset the ctxengine CUDA backend uses, for checking the
// backend's LOGIC on a machine without a GPU (engine/backend/cuda/emu/run_emulated_tests.py).
// Not part of any build target. Passing under emulation is not a GPU validation: see
// docs/CUDA.md.
//
// Device memory is tracked host memory (so cudaPointerGetAttributes tells the backend's staging
// code host from device exactly as the runtime does), filled with garbage by cudaMalloc; kernels
// are ucontext fibers scheduled round-robin with barrier emulation and deadlock detection; cuBLAS
// sgemm and the bf16 GemmEx follow their column-major definition, validate lda/ldb/ldc like the
// library and check that every operand lies inside one device allocation. Streams are
// synchronous.
#include <ucontext.h>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <vector>
#include "cuda_runtime.h"
#include "cublas_v2.h"
#include "cuda_bf16.h"

namespace emu {
emu_uint3 g_tid{0, 0, 0}, g_bid{0, 0, 0};
dim3 g_bdim, g_gdim;

namespace {
struct PendingCopy { void* dst; unsigned char bytes[16]; int n; };
struct Fiber {
    ucontext_t ctx;
    emu_uint3 tid;
    int linear = 0;
    bool done = false;
    std::vector<PendingCopy> open;                   // cp.async copies not yet committed
    std::vector<std::vector<PendingCopy>> committed;  // groups in commit order
};
struct Barrier { int count = 0, alive = 0; unsigned gen = 0; };
ucontext_t g_sched;
std::vector<Fiber> g_fibers;
std::vector<std::vector<char>> g_stacks;
Fiber* g_cur = nullptr;
Barrier g_block;
std::vector<Barrier> g_warps;
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
    f.tid = {unsigned(t) % b.x, (unsigned(t) / b.x) % b.y, unsigned(t) / (b.x * b.y)};
    getcontext(&f.ctx);
    f.ctx.uc_stack.ss_sp = g_stacks[size_t(t)].data();
    f.ctx.uc_stack.ss_size = kStack;
    f.ctx.uc_link = nullptr;
    makecontext(&f.ctx, trampoline, 0);
}

void trampoline() {
    (*g_body)();
    g_cur->done = true;
    g_progress = true;
    g_block.alive--;
    Barrier& w = g_warps[size_t(g_cur->linear / 32)];
    w.alive--;
    release_if_complete(g_block);
    release_if_complete(w);
    swapcontext(&g_cur->ctx, &g_sched);
}
}  // namespace

void syncthreads() { wait(g_block); }
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
    static const bool eager = [] {
        const char* e = std::getenv("CTX_EMU_CP_ASYNC");
        return e != nullptr && std::strcmp(e, "eager") == 0;
    }();
    if (eager) {
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

namespace {
std::map<const void*, size_t>& dyn_limits() {
    static std::map<const void*, size_t> m;
    return m;
}
}  // namespace

void set_dyn_shared_limit(const void* kernel, int bytes) { dyn_limits()[kernel] = size_t(bytes); }
size_t dyn_shared_limit(const void* kernel) {
    const auto it = dyn_limits().find(kernel);
    return it == dyn_limits().end() ? size_t(48 * 1024) : std::max(size_t(48 * 1024), it->second);
}
void check_dyn_shared(const void* kernel, size_t shmem) {
    if (shmem > dyn_shared_limit(kernel)) {
        fprintf(stderr, "emu: dynamic shared %zu > the kernel's limit %zu (cudaFuncSetAttribute)\n",
                shmem, dyn_shared_limit(kernel));
        abort();
    }
}

void run_grid(dim3 g, dim3 b, size_t shmem, const std::function<void()>& body) {
    const int nt = int(b.x * b.y * b.z);
    if (nt > 1024 || nt <= 0) { fprintf(stderr, "emu: bad block size %d\n", nt); abort(); }
    if (shmem > 227 * 1024) { fprintf(stderr, "emu: dynamic shared %zu > 227 KiB\n", shmem); abort(); }
    g_gdim = g;
    g_bdim = b;
    g_body = &body;
    while (g_stacks.size() < size_t(nt)) g_stacks.emplace_back(kStack);
    const int nw = (nt + 31) / 32;
    for (unsigned bz = 0; bz < g.z; bz++)
    for (unsigned by = 0; by < g.y; by++)
    for (unsigned bx = 0; bx < g.x; bx++) {
        g_bid = {bx, by, bz};
        g_dyn.assign(shmem + 16, char(0xAB));  // garbage, as uninitialised shared memory
        g_fibers.assign(size_t(nt), Fiber{});
        g_block = Barrier{0, nt, 0};
        g_warps.assign(size_t(nw), Barrier{});
        for (int w = 0; w < nw; w++) g_warps[size_t(w)].alive = std::min(32, nt - 32 * w);
        g_slots.assign(size_t(nw) * 32, 0);
        for (int t = 0; t < nt; t++) setup_fiber(t, b);
        int alive = nt;
        while (alive > 0) {
            g_progress = false;
            for (auto& f : g_fibers) {
                if (f.done) continue;
                g_cur = &f;
                g_tid = f.tid;
                swapcontext(&g_sched, &f.ctx);
            }
            alive = 0;
            for (auto& f : g_fibers) alive += f.done ? 0 : 1;
            if (alive > 0 && !g_progress) {
                fprintf(stderr, "emu: barrier deadlock in block (%u,%u,%u): %d threads waiting\n",
                        bx, by, bz, alive);
                abort();
            }
        }
    }
}
}  // namespace emu

// ---------------------------------------------------------------- runtime API
namespace {
std::map<uintptr_t, size_t> g_allocs;
bool is_dev(const void* p) {
    const uintptr_t a = uintptr_t(p);
    auto it = g_allocs.upper_bound(a);
    if (it == g_allocs.begin()) return false;
    --it;
    return a >= it->first && a < it->first + it->second;
}
// A range that starts in device memory must end in the same allocation.
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
}  // namespace

cudaError_t cudaGetDeviceCount(int* n) { *n = 1; return cudaSuccess; }
cudaError_t cudaSetDevice(int) { return cudaSuccess; }
cudaError_t cudaGetDevice(int* d) { *d = 0; return cudaSuccess; }
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* p, int) {
    std::memset(p, 0, sizeof(*p));
    std::strcpy(p->name, "CPU emulation");
    p->major = 9; p->minor = 0; p->totalGlobalMem = size_t(80) << 30;
    p->sharedMemPerBlockOptin = 227 * 1024;  // sm_90
    return cudaSuccess;
}
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned) { *s = reinterpret_cast<cudaStream_t>(0x1); return cudaSuccess; }
cudaError_t cudaStreamDestroy(cudaStream_t) { return cudaSuccess; }
cudaError_t cudaStreamSynchronize(cudaStream_t) { return cudaSuccess; }
cudaError_t cudaDeviceSynchronize() { return cudaSuccess; }
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
    auto it = g_allocs.find(uintptr_t(p));
    if (it == g_allocs.end()) { fprintf(stderr, "emu: cudaFree of unknown pointer\n"); abort(); }
    g_allocs.erase(it);
    std::free(p);
    return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind, cudaStream_t) {
    check_range(dst, bytes, "cudaMemcpyAsync destination");
    check_range(src, bytes, "cudaMemcpyAsync source");
    if (bytes) std::memmove(dst, src, bytes);
    return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void* p, int v, size_t bytes, cudaStream_t) {
    if (!is_dev(p) || !is_dev(static_cast<char*>(p) + bytes - 1)) { fprintf(stderr, "emu: memset outside device memory\n"); abort(); }
    std::memset(p, v, bytes);
    return cudaSuccess;
}
cudaError_t cudaGetLastError() { return cudaSuccess; }
const char* cudaGetErrorString(cudaError_t) { return "emulated error"; }
const char* cudaGetErrorName(cudaError_t) { return "cudaErrorEmulated"; }
cudaError_t cudaPointerGetAttributes(cudaPointerAttributes* a, const void* p) {
    std::memset(a, 0, sizeof(*a));
    a->type = is_dev(p) ? cudaMemoryTypeDevice : cudaMemoryTypeUnregistered;
    return cudaSuccess;
}

// ---------------------------------------------------------------- cuBLAS
namespace {
// A column-major (rows, cols) operand with leading dimension ld: cuBLAS reads it from device
// memory, so it must lie inside one device allocation (a host pointer faults on a GPU).
void check_matrix(const void* p, size_t elem, int rows, int cols, int ld, const char* what) {
    if (rows <= 0 || cols <= 0) return;
    if (!is_dev(p)) { fprintf(stderr, "emu cublas: %s is not device memory\n", what); abort(); }
    check_range(p, (size_t(cols - 1) * size_t(ld) + size_t(rows)) * elem, what);
}
}  // namespace

cublasStatus_t cublasCreate(cublasHandle_t* h) { *h = reinterpret_cast<cublasHandle_t>(0x2); return CUBLAS_STATUS_SUCCESS; }
cublasStatus_t cublasDestroy(cublasHandle_t) { return CUBLAS_STATUS_SUCCESS; }
cublasStatus_t cublasSetStream(cublasHandle_t, cudaStream_t) { return CUBLAS_STATUS_SUCCESS; }
cublasStatus_t cublasSetMathMode(cublasHandle_t, cublasMath_t) { return CUBLAS_STATUS_SUCCESS; }
const char* cublasGetStatusString(cublasStatus_t) { return "emulated cublas error"; }

cublasStatus_t cublasSgemmStridedBatched(cublasHandle_t, cublasOperation_t ta, cublasOperation_t tb,
                                         int m, int n, int k, const float* alpha, const float* A, int lda,
                                         long long sa, const float* B, int ldb, long long sb,
                                         const float* beta, float* C, int ldc, long long sc, int batch) {
    if (m < 0 || n < 0 || k < 0 || batch < 0) return CUBLAS_STATUS_INVALID_VALUE;
    if (lda < std::max(1, ta == CUBLAS_OP_N ? m : k)) { fprintf(stderr, "emu sgemm: bad lda %d\n", lda); return CUBLAS_STATUS_INVALID_VALUE; }
    if (ldb < std::max(1, tb == CUBLAS_OP_N ? k : n)) { fprintf(stderr, "emu sgemm: bad ldb %d\n", ldb); return CUBLAS_STATUS_INVALID_VALUE; }
    if (ldc < std::max(1, m)) { fprintf(stderr, "emu sgemm: bad ldc %d\n", ldc); return CUBLAS_STATUS_INVALID_VALUE; }
    for (int z = 0; z < batch; z++) {
        const float* a = A + z * sa;
        const float* b = B + z * sb;
        float* c = C + z * sc;
        if (k > 0) {
            check_matrix(a, sizeof(float), ta == CUBLAS_OP_N ? m : k, ta == CUBLAS_OP_N ? k : m, lda, "sgemm A");
            check_matrix(b, sizeof(float), tb == CUBLAS_OP_N ? k : n, tb == CUBLAS_OP_N ? n : k, ldb, "sgemm B");
        }
        check_matrix(c, sizeof(float), m, n, ldc, "sgemm C");
        for (int j = 0; j < n; j++)
            for (int i = 0; i < m; i++) {
                double s = 0;
                for (int l = 0; l < k; l++) {
                    const size_t ai = ta == CUBLAS_OP_N ? size_t(i) + size_t(l) * lda : size_t(l) + size_t(i) * lda;
                    const size_t bi = tb == CUBLAS_OP_N ? size_t(l) + size_t(j) * ldb : size_t(j) + size_t(l) * ldb;
                    s += double(a[ai]) * double(b[bi]);
                }
                float& cv = c[size_t(i) + size_t(j) * ldc];
                cv = float(*alpha * s + (*beta == 0.0f ? 0.0 : double(*beta) * cv));
            }
    }
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSgemm(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                           const float* alpha, const float* A, int lda, const float* B, int ldb,
                           const float* beta, float* C, int ldc) {
    return cublasSgemmStridedBatched(h, ta, tb, m, n, k, alpha, A, lda, 0, B, ldb, 0, beta, C, ldc, 0, 1);
}

cublasStatus_t cublasGemmEx(cublasHandle_t, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                            const void* alpha, const void* A, cudaDataType Atype, int lda, const void* B,
                            cudaDataType Btype, int ldb, const void* beta, void* C, cudaDataType Ctype,
                            int ldc, cublasComputeType_t computeType, cublasGemmAlgo_t) {
    if (Atype != CUDA_R_16BF || Btype != CUDA_R_16BF || Ctype != CUDA_R_32F ||
        computeType != CUBLAS_COMPUTE_32F) {
        fprintf(stderr, "emu GemmEx: only bf16 x bf16 -> fp32 with CUBLAS_COMPUTE_32F is emulated\n");
        return CUBLAS_STATUS_NOT_SUPPORTED;
    }
    if (m < 0 || n < 0 || k < 0) return CUBLAS_STATUS_INVALID_VALUE;
    if (lda < std::max(1, ta == CUBLAS_OP_N ? m : k)) { fprintf(stderr, "emu GemmEx: bad lda %d\n", lda); return CUBLAS_STATUS_INVALID_VALUE; }
    if (ldb < std::max(1, tb == CUBLAS_OP_N ? k : n)) { fprintf(stderr, "emu GemmEx: bad ldb %d\n", ldb); return CUBLAS_STATUS_INVALID_VALUE; }
    if (ldc < std::max(1, m)) { fprintf(stderr, "emu GemmEx: bad ldc %d\n", ldc); return CUBLAS_STATUS_INVALID_VALUE; }
    if (k > 0) {
        check_matrix(A, 2, ta == CUBLAS_OP_N ? m : k, ta == CUBLAS_OP_N ? k : m, lda, "GemmEx A");
        check_matrix(B, 2, tb == CUBLAS_OP_N ? k : n, tb == CUBLAS_OP_N ? n : k, ldb, "GemmEx B");
    }
    check_matrix(C, sizeof(float), m, n, ldc, "GemmEx C");
    const __nv_bfloat16* a = static_cast<const __nv_bfloat16*>(A);
    const __nv_bfloat16* b = static_cast<const __nv_bfloat16*>(B);
    float* c = static_cast<float*>(C);
    const float al = *static_cast<const float*>(alpha), be = *static_cast<const float*>(beta);
    for (int j = 0; j < n; j++)
        for (int i = 0; i < m; i++) {
            double s = 0;
            for (int l = 0; l < k; l++) {
                const size_t ai = ta == CUBLAS_OP_N ? size_t(i) + size_t(l) * lda : size_t(l) + size_t(i) * lda;
                const size_t bi = tb == CUBLAS_OP_N ? size_t(l) + size_t(j) * ldb : size_t(j) + size_t(l) * ldb;
                s += double(__bfloat162float(a[ai])) * double(__bfloat162float(b[bi]));
            }
            float& cv = c[size_t(i) + size_t(j) * ldc];
            cv = float(al * s + (be == 0.0f ? 0.0 : double(be) * cv));
        }
    return CUBLAS_STATUS_SUCCESS;
}
