// CPU backend: construction, memory and elementwise ops. The other ops live in cpu_dense.cpp
// (embedding, layernorm, matmul, activation), cpu_attention.cpp (rotary, attention) and
// cpu_loss.cpp (cross-entropy, AdamW).
#include "backend/cpu/cpu_backend.h"

#include <cblas.h>
#include <omp.h>

#include <atomic>
#include <cstdlib>
#include <cstring>

#include "backend/cpu/cpu_blas.h"
#include "core/error.h"

namespace ctx {
namespace cpu {

namespace {
// Below this many floats an elementwise op runs on one thread (a parallel region costs more).
constexpr size_t kParallelMin = size_t(1) << 15;
}  // namespace

CpuBackend::CpuBackend(int threads) {
    ensure_blas_kernels();
    if (threads > 0) {
        omp_set_num_threads(threads);
        openblas_set_num_threads(threads);
    }
    threads_ = omp_get_max_threads();
}

std::string CpuBackend::name() const {
    return "cpu (" + std::to_string(threads_) + " threads, OpenBLAS " +
           ensure_blas_kernels().active + ")";
}

// ---------------------------------------------------------------- memory

namespace {
std::atomic<size_t> g_limit{0}, g_in_use{0};
constexpr size_t kHeader = 64;  // each block's size, kept in front of it (alignment kept)
}  // namespace


float* CpuBackend::alloc_floats(size_t n) {
    // aligned_alloc wants a size that is a multiple of the alignment; never 0.
    size_t bytes = (n * sizeof(float) + 63) / 64 * 64;
    if (bytes == 0) bytes = 64;
    const size_t limit = g_limit, in_use = g_in_use;
    if (limit > 0 && in_use + bytes > limit)
        fail("cpu backend: allocating {:.1f} MiB would exceed the memory limit of {:.1f} MiB "
             "(--backend-memory-limit; {:.1f} MiB in use)", double(bytes) / (1 << 20),
             double(limit) / (1 << 20), double(in_use) / (1 << 20));
    char* p = static_cast<char*>(std::aligned_alloc(64, bytes + kHeader));
    if (p == nullptr) fail("cpu backend: out of memory allocating {} floats", n);
    std::memcpy(p, &bytes, sizeof bytes);
    g_in_use += bytes;
    std::memset(p + kHeader, 0, bytes);
    return reinterpret_cast<float*>(p + kHeader);
}

void CpuBackend::free_floats(float* p) {
    if (p == nullptr) return;
    char* base = reinterpret_cast<char*>(p) - kHeader;
    size_t bytes = 0;
    std::memcpy(&bytes, base, sizeof bytes);
    g_in_use -= bytes;
    std::free(base);
}

void CpuBackend::copy_to_device(float* dst, const float* host_src, size_t n) {
    if (n > 0 && dst != host_src) std::memcpy(dst, host_src, n * sizeof(float));
}

void CpuBackend::copy_to_host(float* host_dst, const float* src, size_t n) {
    if (n > 0 && host_dst != src) std::memcpy(host_dst, src, n * sizeof(float));
}

void CpuBackend::zero(float* p, size_t n) {
    if (n > 0) std::memset(p, 0, n * sizeof(float));
}

// ---------------------------------------------------------------- elementwise

void CpuBackend::add(float* out, const float* a, const float* b, size_t n) {
    // out may alias a or b: each element is read before it is written, no restrict.
#pragma omp parallel for simd schedule(static) if (n >= kParallelMin)
    for (size_t i = 0; i < n; i++) out[i] = a[i] + b[i];
}

void CpuBackend::accumulate(float* y, const float* x, size_t n) {
#pragma omp parallel for simd schedule(static) if (n >= kParallelMin)
    for (size_t i = 0; i < n; i++) y[i] += x[i];
}

void CpuBackend::scale(float* x, float s, size_t n) {
#pragma omp parallel for simd schedule(static) if (n >= kParallelMin)
    for (size_t i = 0; i < n; i++) x[i] *= s;
}

double CpuBackend::sum_squares(const float* x, size_t n) {
    double total = 0.0;
#pragma omp parallel for simd schedule(static) reduction(+ : total) if (n >= kParallelMin)
    for (size_t i = 0; i < n; i++) total += double(x[i]) * double(x[i]);
    return total;
}

}  // namespace cpu

void set_cpu_memory_limit(size_t bytes) { cpu::g_limit = bytes; }
size_t cpu_memory_in_use() { return cpu::g_in_use; }

std::unique_ptr<Backend> make_cpu_backend(int threads) {
    return std::make_unique<cpu::CpuBackend>(threads);
}

}  // namespace ctx
