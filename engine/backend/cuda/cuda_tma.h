// CUDA backend (private header, host side): tensor maps for the TMA copies of cuda_tma.cuh,
// encoded through the driver's cuTensorMapEncodeTiled, reached with
// cudaGetDriverEntryPointByVersion so the backend links no libcuda (the driver has it).
#pragma once

#include <cuda.h>

#include <cstdint>

namespace ctx::cuda {

// A bf16 tensor of rank 2 or 3 as TMA sees it: dims innermost first (elements), the byte
// strides of dims 1 and 2 (dim 0 is contiguous), the box one copy moves (elements per dim), and
// whether the box lands with the 128-byte swizzle (its inner extent must then be 64 values).
struct TmaBf16Tensor {
    const void* base = nullptr;
    int rank = 2;
    uint64_t dims[3] = {1, 1, 1};
    uint64_t strides[2] = {0, 0};
    uint32_t box[3] = {1, 1, 1};
    bool swizzle_128b = true;
};

// Encodes *map for t, out-of-bounds elements read as zeros. Throws ctx::Error naming `what`, the
// shape and the driver's code if the driver has no encoder or refuses the arguments.
void encode_tma_map(CUtensorMap* map, const TmaBf16Tensor& t, const char* what);

}  // namespace ctx::cuda
