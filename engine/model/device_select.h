// Which backend a run uses: `--device` / `--precision` on the command line set the defaults,
// recipes may name their own (ctx.model{device = ..., precision = ...}). "auto" is the GPU when
// one is visible, else the CPU; under mpirun each rank takes the GPU of its local rank.
#pragma once

#include <string>

#include "backend/backend.h"

namespace ctx {

enum class DeviceChoice { Auto = 0, Cpu = 1, Cuda = 2 };
DeviceChoice device_choice_from_name(const std::string& name);  // auto | cpu | cuda
const char* device_choice_name(DeviceChoice c);
Precision precision_from_name(const std::string& name);  // fp32 | bf16

// Auto -> Cuda when a CUDA device is visible (and the build has CUDA), else Cpu. Cuda without a
// usable device throws, saying why (no CUDA in the build, or no device visible).
DeviceKind resolve_device(DeviceChoice c);
// The CUDA device index of this process: its local rank (OMPI_COMM_WORLD_LOCAL_RANK, ...)
// modulo the number of visible devices.
int cuda_device_for_this_rank();
// Throws unless `precision` runs on `kind` (bf16 needs the CUDA backend).
void check_precision(DeviceKind kind, Precision precision);

}  // namespace ctx
