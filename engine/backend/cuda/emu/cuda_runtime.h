// CPU emulation of the CUDA runtime subset the ctxengine CUDA backend uses, for checking the
// backend's LOGIC on a machine without a GPU (engine/backend/cuda/emu/run_emulated_tests.py).
// Not part of any build target. Passing under emulation is not a GPU validation: see
// docs/CUDA.md.
//
// Kernels: run_emulated_tests.py rewrites `k<<<grid, block, shared, stream>>>(args)` into
// emu::launch(k, grid, block, shared, stream, args) and `extern __shared__ T x[];` into a pointer to
// the block's dynamic shared memory; every CUDA thread is a cooperative fiber, blocks run one at a
// time, __syncthreads and warp shuffles are barriers (a barrier some threads never reach aborts
// with a deadlock report), `__shared__` variables are function statics (shared by the block).
#pragma once
#include <cmath>
#include <cstring>
#include <functional>
#include <algorithm>
#include "cuda_runtime_api.h"

struct dim3 { unsigned x, y, z; constexpr dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {} };
struct emu_uint3 { unsigned x, y, z; };
struct uint4 { unsigned x, y, z, w; };
struct alignas(8) float2 { float x, y; };
inline float2 make_float2(float x, float y) { return float2{x, y}; }

namespace emu {
extern emu_uint3 g_tid, g_bid;
extern dim3 g_bdim, g_gdim;
void syncthreads();
void warp_barrier();
int lane_id();
uint64_t& warp_slot(int lane);
// Every lane of the warp publishes `bytes` (<= 64) from mine; all receives the 32 lanes' copies
// in lane order (the emulated tensor-core instruction, cuda_mma.cuh, gathers its fragments so).
void warp_gather(const void* mine, size_t bytes, void* all);
// Asynchronous copies (cp.async, cuda_mma.cuh): a copy's source is read when it is issued, but
// its bytes land in shared memory only when a wait covers its group, as on the GPU, so a
// kernel that reads a tile before waiting for it reads the garbage the emulated shared memory
// starts with; CTX_EMU_CP_ASYNC=eager lands each copy at once instead, which exposes a stage
// refilled while other warps still read it. src_bytes < bytes fills the rest with zeros.
void cp_async(void* dst, const void* src, int bytes, int src_bytes);
void cp_async_commit();
void cp_async_wait(int newest_pending);  // every committed group but the newest n has landed
void* dyn_shared();
// The warpgroup tensor-core instruction (wgmma, cuda_wgmma.cuh), per thread of a warpgroup (4
// warps, threads 128 w .. 128 w + 127): an issued product (64 x n, K 16) computes this thread's
// accumulators d (n / 2 floats, the wgmma accumulator layout) only when a wait covers its
// group, reading its shared-memory operands then, as the GPU may: a tile overwritten before the
// wait, or accumulators read before it, give wrong numbers; accumulators written before it abort
// the run. a_rows: this thread's two rows of A
// (row g, then row g + 8 of its warp's 16; 16 values each) when A comes from registers, else
// null and A comes from desc_a; a_frag: this thread's four A registers then, which the GPU may
// read until the wait (changed before it, they abort the run). Descriptors: no swizzle,
// addresses in the block's dynamic shared memory (anything else aborts); B K-major, or N-major
// with trans_b.
void wgmma_issue(float* d, int n, const float* a_rows, const uint32_t* a_frag, uint64_t desc_a,
                 uint64_t desc_b, bool accumulate, bool trans_b);
void wgmma_commit();
void wgmma_wait(int newest_pending);  // every committed group but the newest n has run
// The 128 threads of this thread's warpgroup (wgmma's .sync.aligned: every warp of the group
// executes it; one that does not is a deadlock report).
void warpgroup_barrier();
// Named barriers (bar.sync / bar.arrive id, count; cuda_device.cuh): id 1-15 (0 is
// __syncthreads'), count a multiple of 32 up to the block's threads. A phase completes when
// count threads have arrived, releasing those that wait (bar.arrive does not). A count that
// differs from the phase's first, a thread arriving twice in one phase and a block ending with
// arrivals no phase completed abort the run; threads left waiting are the deadlock report.
void named_barrier(int id, int count, bool wait);
// setmaxnreg (cuda_wgmma.cuh): collective over the warpgroup, which must agree on the count
// (24-256, a multiple of 8); registers are not emulated, so the pool's budget is the kernel's
// static_assert.
void set_max_registers(int regs);
// Shared-memory addresses (cvta.to.shared) of the emulated dynamic shared memory begin at
// kSharedBase, not 0: the 16-byte alignment CUDA promises, so a kernel that needs more (a
// 128-byte swizzled tile: 1024) must align its tiles itself, as on a GPU.
constexpr uint32_t kSharedBase = 16;
// Shared-memory barriers (mbarrier, cuda_tma.cuh) at a shared address: init sets the arrival
// count of each phase; a phase completes when that many arrivals came and the transaction bytes
// they announced (expect_tx) have all landed; wait(parity) returns once the phase of that
// parity has completed (blocking the thread; waiting on a barrier never initialised, an arrival
// beyond the count and a tensor copy over a barrier's 8 bytes abort the run; the transaction
// count may go below zero, as on the GPU, when a copy lands before its bytes are announced).
void mbarrier_init(uint32_t addr, uint32_t count);
void mbarrier_arrive(uint32_t addr, uint32_t tx_bytes);  // expect tx_bytes, then arrive
void mbarrier_wait(uint32_t addr, uint32_t parity);
// A tensor copy (cp.async.bulk.tensor, TMA) of the box at coords (innermost first) of the tensor
// map into shared address dst, completing its bytes on the mbarrier at bar. The source is read
// at the issue; the bytes land when a thread waits on bar (or at the issue with
// CTX_EMU_CP_ASYNC=eager), so a tile read before its barrier's wait reads garbage. Elements
// outside the tensor are zeros; 128-byte swizzle places 16-byte chunk c of a 128-byte row at
// c ^ (address bits 7-9), which needs a 1024-byte aligned destination (else abort).
void tma_load(uint32_t dst, const void* tensor_map, uint32_t bar, const int* coords, int rank);
// Emulator internals (emu_tma.cpp): switch to the block's next thread; record that a thread got
// on (the deadlock check); this thread's index in the block; the bytes at a shared address
// (aborting, naming `what`, outside the dynamic shared memory).
void yield_thread();
void note_progress();
int thread_linear();
// CTX_EMU_CP_ASYNC=eager: asynchronous copies (cp.async, TMA) land when issued, not at a wait.
bool eager_copies();
char* shared_at(uint32_t addr, size_t bytes, const char* what);
// Per block: forget the barriers; at its end, abort if a tensor copy never landed.
void async_block_begin();
void async_block_end();
void run_grid(dim3 g, dim3 b, size_t shmem, const std::function<void()>& body);
void check_dyn_shared(const void* kernel, size_t shmem);  // aborts above the kernel's limit
// Dynamic shared memory a kernel may launch with: 48 KiB unless raised (up to 227 KiB, sm_90) by
// cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes), as on a GPU.
void set_dyn_shared_limit(const void* kernel, int bytes);
// The opt-in shared memory per block the emulated GPU has: 227 KiB (sm_90), or
// CTX_EMU_SMEM_OPTIN bytes (101376: an sm_86/89 GPU's 99 KiB).
size_t smem_optin();
// CTX_EMU_DEVICES emulated devices (default 1), the current one (cudaSetDevice / cudaGetDevice).
int device_count();
int current_device();
void set_current_device(int d);
size_t dyn_shared_limit(const void* kernel);
// Stream work (kernels, copies, memsets, cuBLAS, event records) runs at once, or, with
// CTX_EMU_STREAM=deferred, is queued and runs at the next synchronisation (stream, event or
// device synchronize, cudaFree): then a host buffer an asynchronous copy still reads, or host data
// read before the copy that fills it has run, shows as a wrong result, as on a GPU whose queue
// runs behind the host. Copies from pageable host memory take their source at the call (CUDA
// stages it); from page-locked memory when they run.
void enqueue(std::function<void()> job);
// Whether p lies in a device allocation; a range that starts in one must end in it (else abort,
// naming `what`). For the library emulations (emu_blas.cpp).
bool is_dev(const void* p);
void check_range(const void* p, size_t bytes, const char* what);
void flush();
template <class K, class... A>
void launch(K kernel, dim3 g, dim3 b, size_t shmem, cudaStream_t, A... args) {
    check_dyn_shared(reinterpret_cast<const void*>(kernel), shmem);
    enqueue([=] { run_grid(g, b, shmem, [&] { kernel(args...); }); });
}
template <class T>
T shfl_impl(T v, int src) {
    static_assert(sizeof(T) <= 8);
    uint64_t bits = 0;
    std::memcpy(&bits, &v, sizeof(T));
    warp_slot(lane_id()) = bits;
    warp_barrier();
    const uint64_t got = warp_slot(src & 31);
    warp_barrier();
    T r;
    std::memcpy(&r, &got, sizeof(T));
    return r;
}
}  // namespace emu

template <class F>
cudaError_t cudaFuncSetAttribute(F* kernel, cudaFuncAttribute attr, int value) {
    if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize || value < 0 ||
        size_t(value) > emu::smem_optin())
        return cudaErrorInvalidValue;
    emu::set_dyn_shared_limit(reinterpret_cast<const void*>(kernel), value);
    return cudaSuccess;
}

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__  // (libstdc++ spells an attribute __noinline__: empty keeps it valid)
#define __launch_bounds__(...)
#define __grid_constant__
#define __shared__ static
#define threadIdx (::emu::g_tid)
#define blockIdx (::emu::g_bid)
#define blockDim (::emu::g_bdim)
#define gridDim (::emu::g_gdim)
inline void __syncthreads() { emu::syncthreads(); }
inline void __syncwarp(unsigned = 0xffffffffu) { emu::warp_barrier(); }
inline float __log2f(float x) { return std::log2(x); }  // the fast intrinsic; exact here
inline float __fdividef(float x, float y) { return x / y; }  // the fast intrinsic; exact here
// never contracted into an fma: out of line, so no caller's product can fuse with the add
__attribute__((noinline)) inline float __fadd_rn(float x, float y) { return x + y; }
__attribute__((noinline)) inline float __fmul_rn(float x, float y) { return x * y; }
inline float __fmaf_rn(float x, float y, float z) { return std::fma(x, y, z); }
// Blocks run one at a time and threads switch only at barriers, so a read-modify-write is atomic.
inline float atomicAdd(float* p, float v) {
    const float old = *p;
    *p = old + v;
    return old;
}
inline unsigned __float_as_uint(float f) {
    unsigned u;
    std::memcpy(&u, &f, sizeof u);
    return u;
}
inline float __uint_as_float(unsigned u) {
    float f;
    std::memcpy(&f, &u, sizeof f);
    return f;
}
template <class T> T __shfl_xor_sync(unsigned, T v, int o) { return emu::shfl_impl(v, emu::lane_id() ^ o); }
template <class T> T __shfl_sync(unsigned, T v, int src) { return emu::shfl_impl(v, src); }
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }
