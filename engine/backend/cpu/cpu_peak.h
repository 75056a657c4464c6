// The CPU's fp32 FMA throughput, measured rather than derived from a nominal clock: /proc/cpuinfo
// gives the base clock (2100 MHz on this project's Emerald Rapids VMs), while the cores run FMA
// chains at about 2.7 GHz, so a clock-based peak makes MFU look a third better than it is.
#pragma once

#include <string>

namespace ctx::cpu {

struct FmaPeak {
    double flops = 0;         // FLOP/s of all threads (0: no AVX2/AVX-512 FMA to measure)
    double per_thread = 0;    // FLOP/s of one thread while all run
    int flops_per_cycle = 0;  // per core: two FMA pipes x lanes x 2 (64 AVX-512, 32 AVX2)
    double ghz = 0;           // per_thread / flops_per_cycle
    std::string isa;          // "AVX-512" or "AVX2 FMA"
};

// Runs independent FMA chains (12 vector accumulators: enough to cover two pipes of 4-cycle
// latency) on `threads` OpenMP threads at once for about 0.1 s, best of 3; the widest ISA the CPU
// has. Not bit-for-bit repeatable (it is a timing).
FmaPeak measure_fma_peak(int threads);

}  // namespace ctx::cpu
