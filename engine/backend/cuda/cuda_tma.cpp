// Tensor maps for the TMA copies (cuda_tma.h).
#include "backend/cuda/cuda_tma.h"

#include <cuda_runtime_api.h>

#include "core/error.h"

namespace ctx::cuda {

namespace {

using EncodeTiled = decltype(&cuTensorMapEncodeTiled);

// The driver's encoder, looked up once: by the ABI of CUDA 12.0, where it appeared.
EncodeTiled encoder() {
    static const EncodeTiled fn = [] {
        void* p = nullptr;
        cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
        const cudaError_t e = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000,
                                                               cudaEnableDefault, &q);
        if (e != cudaSuccess || q != cudaDriverEntryPointSuccess) {
            cudaGetLastError();
            return EncodeTiled(nullptr);
        }
        return reinterpret_cast<EncodeTiled>(p);
    }();
    return fn;
}

}  // namespace

void encode_tma_map(CUtensorMap* map, const TmaBf16Tensor& t, const char* what) {
    CTX_CHECK(t.rank == 2 || t.rank == 3, "{}: tensor map of rank {} (2 or 3)", what, t.rank);
    const EncodeTiled fn = encoder();
    CTX_CHECK(fn != nullptr,
              "{}: the CUDA driver has no cuTensorMapEncodeTiled (TMA needs a driver of CUDA "
              "12.0 or later)",
              what);
    const cuuint32_t element_strides[3] = {1, 1, 1};
    const CUresult r =
        fn(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, cuuint32_t(t.rank), const_cast<void*>(t.base),
           t.dims, t.strides, t.box, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
           t.swizzle_128b ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_NONE,
           CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    CTX_CHECK(r == CUDA_SUCCESS,
              "{}: cuTensorMapEncodeTiled refused a bf16 tensor of rank {}, dims {} x {} x {}, "
              "byte strides {} / {}, box {} x {} x {} (CUresult {})",
              what, t.rank, t.dims[0], t.dims[1], t.dims[2], t.strides[0], t.strides[1], t.box[0],
              t.box[1], t.box[2], int(r));
}

}  // namespace ctx::cuda
