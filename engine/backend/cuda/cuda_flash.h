// CUDA backend (private header): flash-style fused causal attention, fp32. CudaBackend owns one
// FlashAttention and runs it from attention_forward / attention_backward when
// AttentionOptions::mode is AttentionMode::Flash (cuda_attention_ops.cpp); docs/CUDA.md ("Flash
// attention") describes the kernels. Kernels: cuda_flash.cu; host side: cuda_flash_ops.cpp.
//
// Semantics are exactly those of attention_forward / attention_backward (backend.h): causal,
// per-token float positions, every BiasKind (incl. the Table), sliding window, accumulate (+=)
// into every gradient. Head dims up to kFlashMaxHeadDim (64, 80 and 128 are the tuned ones).
//
// This header does not include cuda_backend.h (which includes it, for the member): BiasStaging
// is only referred to.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "backend/backend.h"
#include "backend/cuda/cuda_kernels.h"

namespace ctx::cuda {

class BiasStaging;  // cuda_backend.h
template <class T>
class DeviceScratch;  // cuda_backend.h

inline constexpr int kFlashTile = 32;          // queries and keys per tile
inline constexpr int kFlashThreads = 128;      // threads per block (4 per tile row)
inline constexpr int kFlashMaxHeadDim = 128;

// Dynamic shared memory of the kernels for head dim D (bytes).
size_t flash_forward_smem_bytes(int D);
size_t flash_backward_smem_bytes(int D);

// out (B, T, C) (writes), lse (B, H, T) (writes): log-sum-exp of every row's logits.
cudaError_t launch_flash_forward(float* out, float* lse, const float* qkv, const float* positions,
                                 int B, int T, int C, int H, KeyMask mask, const BiasArgs& bias,
                                 cudaStream_t s);
// dqkv (B, T, 3C) +=; dvec (B, H, T) scratch (rowsum(dout * out)); partials: null (no bias
// parameter gradients) or (B, H, ceil(T / 32), kMaxT5Buckets) per-query-tile partial sums, to be
// reduced by launch_attention_bias_grad_reduce; dtable (B, H, T, T) += dlogits inside the mask,
// or null.
cudaError_t launch_flash_backward(float* dqkv, float* dvec, float* partials, float* dtable,
                                  const float* dout, const float* qkv, const float* out,
                                  const float* lse, const float* positions, int B, int T, int C,
                                  int H, KeyMask mask, const BiasArgs& bias, cudaStream_t s);

// dvec (B, H, T) = rowsum(dout * out) per head, fp32 (the D_i of both backward paths).
// zero_dq: null, or dqkv (B, T, 3C) whose dq columns are zeroed on the way (the atomic dq
// backward under GradStore::Overwrite).
cudaError_t launch_flash_dvec(float* dvec, const float* dout, const float* out, int B, int T,
                              int C, int H, cudaStream_t s, float* zero_dq = nullptr);
// The same with out in bf16 (Backend::attention_backward_bf16).
cudaError_t launch_flash_dvec(float* dvec, const float* dout, const uint16_t* out16, int B, int T,
                              int C, int H, cudaStream_t s, float* zero_dq = nullptr);

// The tensor-core kernels (cuda_flash_tc.cu): the same contract as launch_flash_forward /
// launch_flash_backward, with q, k, v, dout and the probabilities / dlogits entering each product
// rounded to bf16 (fp32 accumulation, fp32 softmax statistics). Their operands are bf16 rows per
// head, (B, H, Tp, kD), flash_tc_operand_elems each (T padded to whole query blocks, the head dim
// to the kernel's). The forward packs q, k, v into qkv16 (3 operands, 16-byte aligned), which the
// backward reads as they are: the caller keeps them from one to the other (the backend keeps them
// in `saved`), so the backward reads no fp32 qkv. packed: flash_tc_backward_packed_elems bf16 of
// scratch (any contents, 16-byte aligned) for the backward's packed dout and, with KERPLE-log
// (bias_kind, BiasArgs::kind), its per-distance tables (H x 64k distances x 2 floats).
// launch_flash_tc_backward computes dvec itself, like launch_flash_backward.

// How the tensor-core backward is split into kernels (CTX_FLASH_BACKWARD, cuda_backend.cpp):
//   Split     a dq kernel per query tile and a dk / dv kernel per key tile (7 products per
//             tile pair); every entry owned by one thread: bit-for-bit repeatable. The default.
//   AtomicDq  FlashAttention-2's one kernel per key tile (5 products), dq added with fp32
//             atomics, so the last bits of dq (and of the bias-parameter gradients) vary from
//             run to run; T5's gradients keep Split. For timing against Split on a GPU.
//             With wgmma_dkv, on wgmma where it serves (kernel head dim 64, no bias-parameter
//             gradients; cuda_flash_wg_dkv.cuh's kDqAtomic).
enum class FlashBackward { Split, AtomicDq };

// Which tensor-core kernels the calls run: the A/B switches of cuda_backend.cpp (CTX_FLASH_*), so
// that a GPU can time one layout against another. The wgmma kernels (cuda_flash_wg_sm90a.cu) run
// where they apply: a compute capability 9.0 GPU, head dims 33-64 and 81-128 (kernel head dims 64
// and 128), bias none / ALiBi / KERPLE-log; the mma.sync kernels run the rest.
struct FlashTcKernels {
    int forward_mtiles = 2;      // CTX_FLASH_FORWARD_MTILES: the mma.sync forward's m-tiles a warp
    bool wgmma_forward = false;  // CTX_FLASH_FORWARD=wgmma
    FlashBackward backward = FlashBackward::Split;  // CTX_FLASH_BACKWARD
    // Split only. dq: also with the bias-parameter gradients (ALiBi, KERPLE-log).
    bool wgmma_dq = false;   // CTX_FLASH_DQ=wgmma
    bool wgmma_dkv = false;  // CTX_FLASH_DKV=wgmma
    // CTX_FLASH_WGMMA_WARPGROUPS: a wgmma kernel's block is 2 warpgroups (the default) or 1, each
    // of 64 queries (forward, dq) or keys (dk / dv), sharing the block's K, V (Q, dO) tiles: 2
    // halves the shared-memory fills and the L2 reads a product needs (FlashAttention-3's layout)
    int wgmma_warpgroups = 2;
    // CTX_FLASH_WGMMA_PIPELINE=producer: the three wgmma kernels' blocks gain a
    // producer warpgroup that stages the tiles while the others compute, meeting them at named
    // barriers instead of the block barrier, the two computing warpgroups taking turns at the
    // tensor core (FlashAttention-3's warp specialisation and ping-pong); lockstep (false) is
    // the default
    bool wgmma_producer = false;
    // CTX_FLASH_WGMMA_LOADS=tma (with the producer pipeline): the producer kernels' tiles come
    // by TMA into 128-byte swizzled tiles, each stage signalled by an mbarrier (cuda_tma.cuh);
    // cp.async by the producer's threads (false) is the default.
    bool wgmma_tma = false;
    // CTX_FLASH_FORWARD_KERPLE=tables (the default) or computed: whether the wgmma forward looks
    // KERPLE-log's terms up in the backward's per-distance tables when the positions allow (one
    // MUFU op a logit fewer, for more registers: at D 64 with two warpgroups 175 instead of 128)
    bool wgmma_forward_kerple_tables = true;
    // CTX_FLASH_DQ_ATOMICS=quad (the default) or scalar: whether a one-kernel backward adds dq's
    // terms four columns an atomic on sm_90 where the rows allow (cuda_mma.cuh
    // atomic_add_c_quads), or one an entry as before 2026-12-06
    bool dq_quad_atomics = true;
};

size_t flash_tc_operand_elems(int B, int T, int C, int H);
size_t flash_tc_backward_packed_elems(int B, int T, int C, int H, int bias_kind = 0);
// Shared memory per block (dynamic and static bytes) the tensor-core kernels need at head dim D:
// the forward, and the backward's largest kernel (the dq kernel with its T5 staging when t5).
// mtiles: the forward's m-tiles per warp (FlashTcKernels::forward_mtiles): 2 or 1. These are the
// mma.sync kernels' needs: the wgmma kernels run only on compute capability 9.0 (227 KiB a block).
size_t flash_tc_forward_smem_bytes(int D, int mtiles = 2);
size_t flash_tc_backward_smem_bytes(int D, bool t5);
// out (fp32) or out16 (bf16, rounded as written): one of them, the other null.
// rot (a table, or none): q and k are rotated as they are packed (qkv is the product's output
// before rotary; the packed q, k the rotated ones the logits read). kerple_space: room for the
// KERPLE-log tables the wgmma forward looks its terms up in (flash_tc_forward_kerple_elems bf16
// elements; null: it computes them, as the mma.sync forward always does).
cudaError_t launch_flash_tc_forward(float* out, uint16_t* out16, float* lse, uint16_t* qkv16,
                                    const float* qkv, const float* positions, int B, int T, int C,
                                    int H, KeyMask mask, const BiasArgs& bias,
                                    const RotationTable& rot, cudaStream_t s,
                                    const FlashTcKernels& kernels = FlashTcKernels{},
                                    uint16_t* kerple_space = nullptr);
// bf16 elements of that room: the tables' when the wgmma forward serves a KERPLE-log call at C,
// H on this GPU, else 0.
size_t flash_tc_forward_kerple_elems(int C, int H, int bias_kind, const FlashTcKernels& kernels);
// accumulate: dqkv += the gradient, else dqkv = (each entry of the B x T rows written once).
// rot (a table, or none; Split only): dq and dk leave the kernels rotated back (the transpose of
// the forward's rotation), before they are added to dqkv. Its layout Half needs dr / 2 a
// multiple of 8 (each pair's two entries in one thread's accumulators).
cudaError_t launch_flash_tc_backward(float* dqkv, float* dvec, float* partials, float* dtable,
                                     const uint16_t* qkv16, uint16_t* packed, const float* dout,
                                     const float* out, const uint16_t* out16, const float* lse,
                                     const float* positions, int B, int T, int C, int H,
                                     KeyMask mask, const BiasArgs& bias, bool accumulate,
                                     const RotationTable& rot, cudaStream_t s,
                                     const FlashTcKernels& kernels = FlashTcKernels{});

// Host side: argument checks, bias parameters staged on the device through the backend's
// BiasStaging (host ALiBi slopes, the T5 bucket table; shared with the materialised path, so one
// table serves both), launches on the stream each call names (the backend's stream_: calls are
// ordered with the backend's other ops, no device-wide synchronisation). Enqueues and returns.
class FlashAttention {
public:
    // packed: null for the fp32 kernels; for the bf16 tensor-core kernels (the backend's
    // Precision::Bf16), the grow-only scratch the backward's packed dout lives in.
    FlashAttention(BiasStaging& bias, DeviceScratch<uint16_t>* packed)
        : bias_(bias), packed_(packed) {}
    // The tensor-core kernels the calls run (FlashTcKernels); the fp32 kernels have one layout.
    void set_kernels(const FlashTcKernels& k) { kernels_ = k; }

    // True when the kernels handle this shape (C divisible by H, head dim C / H <=
    // kFlashMaxHeadDim).
    static bool supports(int C, int H);
    // Throws ctx::Error naming `op` and the head-dim limit unless supports(C, H).
    static void check_supported(int C, int H, const char* op);
    // Whether backward in `mode` writes dqkv itself under GradStore::Overwrite (the tensor-core
    // kernels store each entry once; the fp32 kernels add).
    bool writes_dqkv(AttentionMode mode) const {
        return mode == AttentionMode::Flash && packed_ != nullptr;
    }
    // Whether forward keeps q, k, v in `saved` for backward (the tensor-core kernels: packed
    // bf16), so that backward does not read qkv.
    bool keeps_qkv(AttentionMode mode) const { return writes_dqkv(mode); }
    // Floats of `saved`: lse (B, H, T), then (keeps_qkv) the packed q, k, v at the first
    // 16-byte boundary after it.
    size_t saved_floats(int B, int T, int C, int H) const;
    // Whether forward and backward in `mode` rotate q and k themselves by `spec`
    // (AttentionOptions::rotary, with a RotationTable): the tensor-core kernels with the Split
    // backward, a layout whose pairs the backward's threads hold whole (Interleaved, or Half
    // with dr / 2 a multiple of 8), unless set_rotary_fusion(false) (CTX_FLASH_ROTARY=separate).
    bool fuses_rotary(AttentionMode mode, int C, int H, const RotarySpec& spec) const;
    void set_rotary_fusion(bool on) { rotary_fusion_ = on; }

    // out (B, T, C) (writes; fp32 in out, or bf16 in out16 where keeps_qkv: one of them),
    // saved (writes): lse (B, H, T), and the packed q, k, v where keeps_qkv. Logit(i, j) as
    // attention_forward.
    // rot: the table of opt.rotary (null table when opt.rotary is null).
    void forward(cudaStream_t stream, float* out, uint16_t* out16, float* saved, const float* qkv,
                 const float* positions, int B, int T, int C, int H, const AttentionOptions& opt,
                 const RotationTable& rot);

    // Scratch floats of backward: dvec (B, H, T) + bias partials (B, H, ceil(T/32), 512).
    static size_t backward_scratch_floats(int B, int T, int C, int H);

    // dqkv (B, T, 3C) +=, da / db / dtable += as attention_backward; out and saved from
    // forward (qkv not read where keeps_qkv). scratch: backward_scratch_floats floats, any
    // contents. opt.dqkv_store Overwrite is done by the kernels where writes_dqkv(), else the
    // caller zeroes dqkv first.
    void backward(cudaStream_t stream, float* dqkv, float* scratch, const float* dout,
                  const float* qkv, const float* out, const uint16_t* out16, const float* saved,
                  const float* positions, int B, int T, int C, int H, const AttentionOptions& opt,
                  const RotationTable& rot);

private:
    // Throws a clear ctx::Error when this GPU's shared memory per block (its opt-in limit) is
    // below `need` bytes: the tensor-core kernels at large head dims on sm_86/89 GPUs.
    void check_tc_smem(size_t need, int D, const char* op);

    BiasStaging& bias_;
    DeviceScratch<uint16_t>* packed_;
    size_t smem_limit_ = 0;  // the device's opt-in shared memory per block, once read
    FlashTcKernels kernels_;
    bool rotary_fusion_ = true;
};

}  // namespace ctx::cuda
