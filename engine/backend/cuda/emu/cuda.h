// CPU emulation of the CUDA driver API subset the ctxengine CUDA backend uses: the tensor map
// (TMA descriptor) type and its encoder, which the backend reaches through
// cudaGetDriverEntryPointByVersion as it does on a GPU (engine/backend/cuda/cuda_tma.cpp).
// Not part of any build target (engine/backend/cuda/emu/run_emulated_tests.py). The enum values
// are the driver's; the emulated map keeps its fields in the opaque words (emu_tma.cpp).
#pragma once
#include <cstdint>

#define CUDAAPI

typedef uint32_t cuuint32_t;
typedef uint64_t cuuint64_t;

typedef enum cudaError_enum { CUDA_SUCCESS = 0, CUDA_ERROR_INVALID_VALUE = 1 } CUresult;

#define CU_TENSOR_MAP_NUM_QWORDS 16
typedef struct CUtensorMap_st {
    alignas(64) cuuint64_t opaque[CU_TENSOR_MAP_NUM_QWORDS];
} CUtensorMap;

typedef enum CUtensorMapDataType_enum {
    CU_TENSOR_MAP_DATA_TYPE_UINT8 = 0,
    CU_TENSOR_MAP_DATA_TYPE_UINT16 = 1,
    CU_TENSOR_MAP_DATA_TYPE_FLOAT32 = 7,
    CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 = 9
} CUtensorMapDataType;
typedef enum CUtensorMapInterleave_enum { CU_TENSOR_MAP_INTERLEAVE_NONE = 0 } CUtensorMapInterleave;
typedef enum CUtensorMapSwizzle_enum {
    CU_TENSOR_MAP_SWIZZLE_NONE = 0,
    CU_TENSOR_MAP_SWIZZLE_32B = 1,
    CU_TENSOR_MAP_SWIZZLE_64B = 2,
    CU_TENSOR_MAP_SWIZZLE_128B = 3
} CUtensorMapSwizzle;
typedef enum CUtensorMapL2promotion_enum {
    CU_TENSOR_MAP_L2_PROMOTION_NONE = 0,
    CU_TENSOR_MAP_L2_PROMOTION_L2_64B = 1,
    CU_TENSOR_MAP_L2_PROMOTION_L2_128B = 2,
    CU_TENSOR_MAP_L2_PROMOTION_L2_256B = 3
} CUtensorMapL2promotion;
typedef enum CUtensorMapFloatOOBfill_enum {
    CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE = 0
} CUtensorMapFloatOOBfill;

// The driver's argument rules as its documentation states them (rank 1-5, a 16-byte aligned
// address, dims in [1, 2^32], strides multiples of 16 below 2^40, boxes of 1-256 elements whose
// inner extent is a multiple of 16 bytes and, swizzled, at most the swizzle span; element
// strides 1); anything else is CUDA_ERROR_INVALID_VALUE. Only swizzle none / 128B, no
// interleave, zero fill are emulated (others abort).
CUresult cuTensorMapEncodeTiled(CUtensorMap* tensorMap, CUtensorMapDataType tensorDataType,
                                cuuint32_t tensorRank, void* globalAddress,
                                const cuuint64_t* globalDim, const cuuint64_t* globalStrides,
                                const cuuint32_t* boxDim, const cuuint32_t* elementStrides,
                                CUtensorMapInterleave interleave, CUtensorMapSwizzle swizzle,
                                CUtensorMapL2promotion l2Promotion,
                                CUtensorMapFloatOOBfill oobFill);
