// Linked when ctxengine is built without CUDA (MLX's no_gpu pattern): the symbols exist, and
// using them says clearly why they cannot work.
#include "backend/backend.h"
#include "core/error.h"

namespace ctx {

std::unique_ptr<Backend> make_cuda_backend(int /*device*/, Precision /*precision*/) {
    fail("ctxengine was built without CUDA (nvcc was not found at configure time); "
         "rebuild with CUDA or use the CPU backend");
}

bool cuda_backend_available() { return false; }

int cuda_device_count() { return 0; }

bool cuda_has_wgmma(int /*device*/) { return false; }

void cuda_wgmma_gemm(float*, const uint16_t*, const uint16_t*, int, int, int,
                     const WgmmaGemmOptions&) {
    fail("ctxengine was built without CUDA: no wgmma");
}

}  // namespace ctx
