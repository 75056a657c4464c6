// `ctxengine bench`: training throughput (tokens/s), achieved GFLOP/s and MFU for named configs.
#pragma once

#include <string>
#include <vector>

#include "plugin/registry.h"

namespace ctx {

// Runs `ctxengine bench ARGS...`; returns the process exit code.
int run_bench(const std::vector<std::string>& args, PluginRegistry& registry, int threads);

// Theoretical peak FP32 FLOP/s of `threads` cores of this CPU: cores x clock x FLOPs/cycle
// (64 with AVX-512, 32 with AVX2 FMA: two FMA pipes). `note` says how it was derived. The clock
// is /proc/cpuinfo's current value; pass --peak-gflops when the true peak is known.
double cpu_peak_flops(int threads, std::string* note);

}  // namespace ctx
