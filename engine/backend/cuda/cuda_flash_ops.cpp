// CUDA backend, host side of the flash attention kernels (cuda_flash.h, cuda_flash.cu):
// argument checks (the same as attention_forward / attention_backward plus the head-dim limit),
// bias parameters as device views through the backend's BiasStaging (host ALiBi slopes staged,
// the T5 bucket lookup table built on the host in double exactly as the CPU backend and the
// materialised path do), launches on the caller's stream.
//
// The tensor-core forward packs q, k, v in bf16 into `saved` after lse, and the backward reads
// them from there (it packs only dout): qkv is not read by the backward.
//
// Backward flow: dvec = rowsum(dout * out) (B, H, T) in the caller's scratch; dq, dtable and the
// bias-parameter partials per (b, h, query tile); dk, dv per (b, h, key tile); then the
// materialised path's fixed-order reduction of the partials into da / db (same layout, since a
// query tile is its 32-row chunk).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_flash.h"
#include "backend/op_common.h"
#include "core/error.h"

namespace ctx::cuda {

namespace {

inline int query_tiles(int T) { return (T + kFlashTile - 1) / kFlashTile; }

// The packed q, k, v in `saved`: the first 16-byte boundary after lse (B, H, T) (cp.async
// copies 16 bytes; saved_floats leaves the room to round up).
template <class F>
auto kept_qkv(F* saved, int B, int T, int H) {
    using U = std::conditional_t<std::is_const_v<F>, const uint16_t, uint16_t>;
    const uintptr_t p = reinterpret_cast<uintptr_t>(saved + size_t(B) * H * T);
    return reinterpret_cast<U*>((p + 15) / 16 * 16);
}

}  // namespace

size_t FlashAttention::saved_floats(int B, int T, int C, int H) const {
    const size_t lse = size_t(std::max(B, 0)) * std::max(H, 0) * std::max(T, 0);
    if (packed_ == nullptr || lse == 0) return lse;
    return lse + 4 + (3 * flash_tc_operand_elems(B, T, C, H) + 1) / 2;
}

bool FlashAttention::fuses_rotary(AttentionMode mode, int C, int H, const RotarySpec& spec) const {
    const int dr = spec.rotary_dims;
    const bool whole_pairs = spec.layout == RotaryLayout::Interleaved || (dr / 2) % 8 == 0;
    return rotary_fusion_ && keeps_qkv(mode) && supports(C, H) &&
           kernels_.backward == FlashBackward::Split && dr > 0 && dr <= C / H && whole_pairs;
}

bool FlashAttention::supports(int C, int H) {
    return H > 0 && C > 0 && C % H == 0 && C / H <= kFlashMaxHeadDim;
}

void FlashAttention::check_supported(int C, int H, const char* op) {
    CTX_CHECK(supports(C, H),
              "{}: flash attention supports head dims up to {} (C = {}, H = {}: head dim {}); "
              "use the materialised attention mode for this model",
              op, kFlashMaxHeadDim, C, H, H > 0 ? C / H : 0);
}

void FlashAttention::check_tc_smem(size_t need, int D, const char* op) {
    if (smem_limit_ == 0) {
        int device = 0;
        cudaDeviceProp prop{};
        if (cudaGetDevice(&device) == cudaSuccess &&
            cudaGetDeviceProperties(&prop, device) == cudaSuccess)
            smem_limit_ = prop.sharedMemPerBlockOptin;
        cudaGetLastError();
    }
    CTX_CHECK(smem_limit_ == 0 || need <= smem_limit_,
              "{}: the bf16 tensor-core flash kernels at head dim {} need {} bytes of shared "
              "memory per block, and this GPU allows {} (sm_86/89 GPUs have 99 KiB; A100 and "
              "H100 are enough); use --precision fp32 or the materialised attention mode",
              op, D, need, smem_limit_);
}

size_t FlashAttention::backward_scratch_floats(int B, int T, int /*C*/, int H) {
    return size_t(B) * H * T + size_t(B) * H * query_tiles(T) * kMaxT5Buckets;
}

void FlashAttention::forward(cudaStream_t stream, float* out, uint16_t* out16, float* saved,
                             const float* qkv, const float* positions, int B, int T, int C, int H,
                             const AttentionOptions& opt, const RotationTable& rot) {
    static constexpr const char* op = "flash_attention_forward";
    check_attention(T, C, H, opt, true);  // opt.rotary: checked against rot below
    check_supported(C, H, op);
    CTX_CHECK((out == nullptr) != (out16 == nullptr) && (out16 == nullptr || packed_ != nullptr),
              "internal: {}: out in fp32, or in bf16 on the tensor-core kernels", op);
    CTX_CHECK((opt.rotary != nullptr) == (rot.table != nullptr) &&
                  (opt.rotary == nullptr || fuses_rotary(opt.mode, C, H, *opt.rotary)),
              "internal: {}: a rotation table exactly when the kernels rotate (fuses_rotary)", op);
    if (B <= 0) return;
    const BiasArgs ba = bias_.stage(opt.bias, H, stream, op);
    float* lse = saved;  // (B, H, T)
    if (packed_ != nullptr) {
        check_tc_smem(flash_tc_forward_smem_bytes(C / H, kernels_.forward_mtiles), C / H, op);
        // the wgmma forward's KERPLE-log tables in the backward's scratch (free until then)
        const size_t kerple = flash_tc_forward_kerple_elems(C, H, ba.kind, kernels_);
        uint16_t* kerple_space = kerple > 0 ? packed_->ensure(kerple, op) : nullptr;
        check_cuda(launch_flash_tc_forward(
                       out, out16, lse, kept_qkv(saved, B, T, H), qkv, positions, B, T, C, H,
                       KeyMask{opt.window, opt.doc_start}, ba, rot, stream, kernels_, kerple_space),
                   op);
        return;
    }
    check_cuda(launch_flash_forward(out, lse, qkv, positions, B, T, C, H,
                                    KeyMask{opt.window, opt.doc_start}, ba, stream),
               op);
}

void FlashAttention::backward(cudaStream_t stream, float* dqkv, float* scratch, const float* dout,
                              const float* qkv, const float* out, const uint16_t* out16,
                              const float* saved, const float* positions, int B, int T, int C,
                              int H, const AttentionOptions& opt, const RotationTable& rot) {
    static constexpr const char* op = "flash_attention_backward";
    const float* lse = saved;  // (B, H, T)
    check_attention(T, C, H, opt, true);  // opt.rotary: checked against rot below
    check_supported(C, H, op);
    CTX_CHECK((out == nullptr) != (out16 == nullptr) && (out16 == nullptr || packed_ != nullptr),
              "internal: {}: out in fp32, or in bf16 on the tensor-core kernels", op);
    CTX_CHECK((opt.rotary != nullptr) == (rot.table != nullptr) &&
                  (opt.rotary == nullptr || fuses_rotary(opt.mode, C, H, *opt.rotary)),
              "internal: {}: a rotation table exactly when the kernels rotate (fuses_rotary)", op);
    if (B <= 0) return;
    const BiasSpec& bs = opt.bias;
    const BiasArgs ba = bias_.stage(bs, H, stream, op);
    const bool bias_grads = bs.kind != BiasKind::None && bs.kind != BiasKind::Table &&
                            (bs.da != nullptr || bs.db != nullptr);
    float* dtable = bs.kind == BiasKind::Table ? bs.dtable : nullptr;
    float* dvec = scratch;                          // (B, H, T)
    float* partials = scratch + size_t(B) * H * T;  // (B, H, tiles, kMaxT5Buckets)
    float* parts = bias_grads ? partials : nullptr;
    if (packed_ != nullptr) {
        check_tc_smem(flash_tc_backward_smem_bytes(C / H, bias_grads && bs.kind == BiasKind::T5),
                      C / H, op);
        uint16_t* packed = packed_->ensure(flash_tc_backward_packed_elems(B, T, C, H, ba.kind), op);
        check_cuda(launch_flash_tc_backward(
                       dqkv, dvec, parts, dtable, kept_qkv(saved, B, T, H), packed, dout, out,
                       out16, lse, positions, B, T, C, H, KeyMask{opt.window, opt.doc_start}, ba,
                       opt.dqkv_store == GradStore::Accumulate, rot, stream, kernels_),
                   op);
    } else {
        check_cuda(launch_flash_backward(dqkv, dvec, parts, dtable, dout, qkv, out, lse, positions,
                                         B, T, C, H, KeyMask{opt.window, opt.doc_start}, ba,
                                         stream),
                   op);
    }
    if (bias_grads)
        check_cuda(launch_attention_bias_grad_reduce(bs.da, bs.db, partials, B, H, T, ba.kind,
                                                     ba.nb, stream),
                   op);
}

}  // namespace ctx::cuda
