// The CPU backend's matrix library: OpenBLAS, and the choice of its kernels.
//
// Debian's OpenBLAS (0.3.21, DYNAMIC_ARCH) picks its kernels from the CPU's family/model numbers.
// A CPU newer than the library (Emerald Rapids, family 6 model 207, on this project's pool) is not
// in its table and gets the generic "Prescott" SSE3 kernels: sgemm at 27-31 GFLOP/s where the
// SkylakeX kernels reach 190-270 on the same 2 cores; on an AMD Zen 5 (family 26, AVX-512) its
// AVX2 "Haswell" kernels, which an OPENBLAS_CORETYPE=Haswell in the environment selects, run at
// about half the speed of the Cooperlake ones it picks itself (docs/BENCHMARKS.md). The library offers no
// API to choose, only the OPENBLAS_CORETYPE variable read when it is loaded; its exported
// gotoblas_dynamic_quit/init pair re-runs that choice, so the backend re-runs it once, before the
// first product, with the kernels the CPU's features call for.
#pragma once

#include <string>

namespace ctx::cpu {

// What the CPU can run, from CPUID (the feature bits, never the model number).
struct CpuFeatures {
    bool avx2_fma = false;  // AVX2 and FMA3: OpenBLAS's Haswell kernels
    bool avx512 = false;    // AVX-512 F, CD, BW, DQ, VL: its SkylakeX kernels
};
CpuFeatures cpu_features();

// The OpenBLAS core type to force when the library's own choice `detected` wastes the CPU, or ""
// to keep it: fallbacks that predate AVX2 are replaced by the widest kernels the CPU runs, and
// AVX2 kernels (Haswell, Zen) on a CPU with AVX-512 by SkylakeX; any other choice (SkylakeX,
// Cooperlake, ...) stands.
std::string blas_core_override(const std::string& detected, const CpuFeatures& cpu);

struct BlasKernels {
    std::string detected;  // the library's choice at load time
    std::string active;    // the kernels in use now
    std::string note;      // why they differ ("" when they do not)
};

// Runs once per process (later calls return the first result): applies blas_core_override unless
// OPENBLAS_CORETYPE is set (kept, with a warning naming the faster kernels) or the library cannot
// re-run its choice (a non-DYNAMIC_ARCH build); logs one line when it changes the kernels.
const BlasKernels& ensure_blas_kernels();

}  // namespace ctx::cpu
