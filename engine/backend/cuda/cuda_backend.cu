// CUDA backend: build wiring and device discovery. The op set lands with the CUDA-backend issue;
// until then make_cuda_backend() refuses with a clear message even where a GPU is present.
#include <cuda_runtime.h>

#include "backend/backend.h"
#include "core/error.h"

namespace ctx {

int cuda_device_count() {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError();  // clear the sticky "no device" error
        return 0;
    }
    return n;
}

bool cuda_backend_available() { return false; }

std::unique_ptr<Backend> make_cuda_backend(int device) {
    const int n = cuda_device_count();
    if (n == 0) fail("no CUDA device is visible (cudaGetDeviceCount found none)");
    if (device < 0 || device >= n) fail("CUDA device {} does not exist ({} visible)", device, n);
    fail("the CUDA backend's ops are not implemented in this version; use backend = \"cpu\"");
}

}  // namespace ctx
