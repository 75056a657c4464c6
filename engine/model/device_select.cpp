#include "model/device_select.h"

#include "core/error.h"
#include "parallel/grad_reducer.h"

namespace ctx {

DeviceChoice device_choice_from_name(const std::string& name) {
    if (name == "auto") return DeviceChoice::Auto;
    if (name == "cpu") return DeviceChoice::Cpu;
    if (name == "cuda") return DeviceChoice::Cuda;
    fail("unknown device '{}' (expected auto, cpu or cuda)", name);
}

const char* device_choice_name(DeviceChoice c) {
    switch (c) {
        case DeviceChoice::Cpu: return "cpu";
        case DeviceChoice::Cuda: return "cuda";
        default: return "auto";
    }
}

Precision precision_from_name(const std::string& name) {
    if (name == "fp32") return Precision::Fp32;
    if (name == "bf16") return Precision::Bf16;
    fail("unknown precision '{}' (expected fp32 or bf16)", name);
}

DeviceKind resolve_device(DeviceChoice c) {
    if (c == DeviceChoice::Cpu) return DeviceKind::CPU;
    if (c == DeviceChoice::Auto) return cuda_backend_available() ? DeviceKind::CUDA : DeviceKind::CPU;
    if (!cuda_backend_available()) {
        // make_cuda_backend says which: a build without CUDA, or no visible device.
        try {
            (void)make_cuda_backend(0);
        } catch (const Error& e) {
            fail("device = \"cuda\" was asked for but cannot be used: {} (device = \"auto\" "
                 "falls back to the CPU)", e.what());
        }
        fail("device = \"cuda\" was asked for but no CUDA device is visible");
    }
    return DeviceKind::CUDA;
}

int cuda_device_for_this_rank() {
    const int n = cuda_device_count();
    CTX_CHECK(n > 0, "no CUDA device is visible");
    return local_rank_from_env() % n;
}

void check_precision(DeviceKind kind, Precision precision) {
    CTX_CHECK(precision == Precision::Fp32 || kind == DeviceKind::CUDA,
              "precision = \"{}\" needs the CUDA backend (device = \"cuda\"); the CPU backend "
              "computes in fp32", precision_name(precision));
}

}  // namespace ctx
