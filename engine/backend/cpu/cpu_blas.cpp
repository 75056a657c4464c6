// OpenBLAS kernel choice (cpu_blas.h).
#include "backend/cpu/cpu_blas.h"

#include <cstdlib>
#include <mutex>
#include <set>

#include <spdlog/spdlog.h>

// OpenBLAS's own entry points. Weak, so that a BLAS without them (a build for one CPU, which has
// no runtime choice to correct) links and simply keeps its kernels.
extern "C" {
char* openblas_get_corename(void) __attribute__((weak));
void gotoblas_dynamic_init(void) __attribute__((weak));
void gotoblas_dynamic_quit(void) __attribute__((weak));
}

namespace ctx::cpu {

CpuFeatures cpu_features() {
    CpuFeatures f;
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    f.avx2_fma = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    f.avx512 = f.avx2_fma && __builtin_cpu_supports("avx512f") &&
               __builtin_cpu_supports("avx512cd") && __builtin_cpu_supports("avx512bw") &&
               __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
#endif
    return f;
}

std::string blas_core_override(const std::string& detected, const CpuFeatures& cpu) {
    // OpenBLAS's x86-64 core names whose kernels stop at SSE/AVX1: its fallbacks for CPUs it does
    // not know, and the genuinely old cores (on which the features below are absent anyway).
    static const std::set<std::string> kPreAvx2 = {
        "Katmai", "Coppermine", "Northwood", "Prescott", "Banias", "Atom", "Core2", "Penryn",
        "Dunnington", "Nehalem", "Athlon", "Opteron", "Opteron_SSE3", "Barcelona", "Nano",
        "Sandybridge", "Bobcat", "Bulldozer", "Piledriver", "Steamroller", "Excavator"};
    // Its AVX2 cores on a CPU with AVX-512 use half the vector width: on an AMD Zen 5 the
    // Haswell sgemm ran at 0.5-0.6x the SkylakeX/Cooperlake one (docs/BENCHMARKS.md).
    static const std::set<std::string> kAvx2 = {"Haswell", "Zen"};
    if (cpu.avx512 && (kPreAvx2.count(detected) != 0 || kAvx2.count(detected) != 0))
        return "SkylakeX";
    if (cpu.avx2_fma && kPreAvx2.count(detected) != 0) return "Haswell";
    return "";
}

namespace {

std::string corename() {
    const char* n = openblas_get_corename != nullptr ? openblas_get_corename() : nullptr;
    return n != nullptr ? std::string(n) : std::string("unknown");
}

BlasKernels choose_kernels() {
    BlasKernels k;
    k.detected = k.active = corename();
    const std::string want = blas_core_override(k.detected, cpu_features());
    if (want.empty()) return k;
    if (const char* user = std::getenv("OPENBLAS_CORETYPE"); user != nullptr && *user != '\0') {
        k.note = "OPENBLAS_CORETYPE=" + std::string(user) + " set in the environment: kept";
        spdlog::warn("OPENBLAS_CORETYPE={} in the environment keeps OpenBLAS's '{}' kernels; this "
                     "CPU runs its '{}' kernels (matrix products up to 2x faster); unset it to let "
                     "ctxengine choose", user, k.detected, want);
        return k;
    }
    if (gotoblas_dynamic_init == nullptr || gotoblas_dynamic_quit == nullptr) {
        k.note = "this OpenBLAS cannot change its kernels at run time";
        spdlog::warn("OpenBLAS uses its '{}' kernels on a CPU that has {} ({}); products "
                     "will run several times below the CPU's speed",
                     k.detected, want == "SkylakeX" ? "AVX-512" : "AVX2", k.note);
        return k;
    }
    // The documented switch, read by the library's own initialisation, which re-runs here.
    gotoblas_dynamic_quit();
    setenv("OPENBLAS_CORETYPE", want.c_str(), 1);
    gotoblas_dynamic_init();
    unsetenv("OPENBLAS_CORETYPE");
    k.active = corename();
    k.note = "OpenBLAS took its '" + k.detected + "' kernels (it does not know this CPU's model); "
             "the CPU has " + (want == "SkylakeX" ? "AVX-512" : "AVX2") + ", so its '" +
             k.active + "' kernels run (OPENBLAS_CORETYPE overrides)";
    spdlog::info("{}", k.note);
    return k;
}

}  // namespace

const BlasKernels& ensure_blas_kernels() {
    static std::once_flag once;
    static BlasKernels kernels;
    std::call_once(once, [] { kernels = choose_kernels(); });
    return kernels;
}

}  // namespace ctx::cpu
