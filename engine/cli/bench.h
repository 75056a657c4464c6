// `ctxengine bench`: training throughput (tokens/s, TFLOP/s, MFU) of named configs on the CPU or a
// GPU (`bench`), the attention ops alone (`bench attention`, bench_attention.cpp) and the peak
// table MFU is measured against (`bench peak`). docs/BENCHMARKS.md describes all three.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "model/device_select.h"
#include "parallel/comm.h"
#include "plugin/registry.h"

namespace ctx {

// Runs `ctxengine bench ARGS...`; returns the process exit code (2 for a bad command line).
// The training benchmark runs data parallel over `world` (mpirun -np N); the others on each rank.
int run_bench(const std::vector<std::string>& args, PluginRegistry& registry, int threads,
              Comm& world);
// `ctxengine bench attention ARGS...` (bench_attention.cpp).
int run_bench_attention(const std::vector<std::string>& args, PluginRegistry& registry,
                        int threads);

// Peak FP32 FLOP/s of `threads` cores of this CPU: the FMA throughput measured on that many
// threads at once (backend/cpu/cpu_peak.h), or where there is no AVX2/AVX-512 FMA to measure,
// cores x /proc/cpuinfo's clock x FLOPs/cycle. `note` says which; --peak-gflops overrides.
double cpu_peak_flops(int threads, std::string* note);

// Dense peak throughput of a device, FLOP/s (0 = unknown).
struct DevicePeak {
    double bf16 = 0;  // bf16 tensor cores, dense (no sparsity), fp32 accumulation
    double fp32 = 0;  // fp32 FMA pipes (no tensor cores, no TF32)
    std::string source;  // where the numbers come from ("datasheet: H100 SXM", "estimated ...")
    bool estimated = false;
};

// The datasheet table by GPU name (as cudaDeviceProp::name spells it, e.g. "NVIDIA H100 80GB
// HBM3"); source is empty when the name is not in the table.
DevicePeak gpu_peak_from_table(const std::string& gpu_name);
// Estimate from the SM count, the boost clock and compute capability major.minor (per-SM dense
// FLOP/clock of that architecture); source is empty when the architecture is not known.
DevicePeak gpu_peak_estimate(int cc_major, int cc_minor, int sm_count, double clock_mhz);

// What a CUDA backend's name() says about its GPU: "cuda:0 (NAME, sm_XY, N GiB, ...)".
struct GpuIdentity {
    std::string name;
    int cc_major = 0, cc_minor = 0;
};
GpuIdentity parse_cuda_backend_name(const std::string& backend_name);

// The peak of the device `backend` runs on: the CPU estimate of cpu_peak_flops (fp32 only) or the
// GPU table. (An estimate for GPUs missing from the table needs the SM count and clock, which the
// Backend interface does not expose.)
DevicePeak device_peak(const Backend& backend, int threads);

// The backend of --device / --precision (CUDA: the device of this process's local rank).
std::unique_ptr<Backend> open_bench_backend(DeviceChoice device, Precision precision,
                                            int threads);

// Process peak resident set size in MiB (host memory; what the CPU backend uses), 0 if unknown.
double peak_rss_mib();

// Command-line values, with errors that name the flag.
int64_t bench_parse_int(const std::string& flag, const std::string& v);
double bench_parse_double(const std::string& flag, const std::string& v);
std::vector<std::string> bench_split_list(const std::string& v);  // "a,b,c"

}  // namespace ctx
