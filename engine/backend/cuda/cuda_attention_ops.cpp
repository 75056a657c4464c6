// CUDA backend, host side: rotary position embedding and causal multi-head attention with
// per-token float positions and an additive per-head bias (backend.h). Two modes
// (AttentionOptions::mode):
//
// Flash (attention_mode_auto's choice whenever the head dim C / H <= 128): the fused tiled
// kernels of cuda_flash.cu through the backend's FlashAttention, on stream_. Forward writes out
// and saves lse (B, H, T); backward recomputes the probabilities from q, k, the bias, lse and the
// forward's out. Memory grows as T.
//
// Materialised (any head dim; the CPU backend's path), kernels in cuda_attention.cu. Forward, per
// batch row b (cuBLAS strided-batched over the H heads, straight out of the (B, T, 3C) layout:
// head h of q is qkv[b, :, h*D : h*D + D] with leading dimension 3C, k and v the same at offsets
// C and 2C):
//   att_b (H, T, T) = q k^T / sqrt(D)                  cublasSgemmStridedBatched
//   then for all rows at once: + bias, causal/window mask, softmax    attention_softmax_kernel
//   out_b (T, C) = P v                                 cublasSgemmStridedBatched
// Backward, per batch row b, with dS in the caller's scratch (H, T, T):
//   dS = dout v^T;  dv += P^T dout;  dS = P (dS - rowsum(P dS)) (+ dtable);  dq += dS k / sqrt(D);
//   dk += dS^T q / sqrt(D);  bias parameter partial sums per (b, h, chunk of rows)
// and, after the loop, one fixed-order reduction of the partials into da / db. The products run
// over the full (T, T) square (the masked half is computed and discarded).
#include <algorithm>
#include <cmath>

#include "backend/cuda/cuda_backend.h"
#include "backend/op_common.h"
#include "core/error.h"

namespace ctx::cuda {

namespace {

inline int bias_grad_chunks(int T) { return (T + kBiasGradRows - 1) / kBiasGradRows; }

}  // namespace

// ================================================================ bias parameters on the device

const float* BiasStaging::device_view(const float* p, size_t n, DeviceScratch<float>& buf,
                                      cudaStream_t stream, const char* op) {
    if (p == nullptr || is_device_memory(p)) return p;
    float* d = buf.ensure(n, op);
    uploads_.upload(d, p, n * sizeof(float), stream, op);
    return d;
}

void BiasStaging::release() {
    a_.release();
    b_.release();
    lut_.release();
    lut_nb_ = lut_md_ = -1;
}

BiasArgs BiasStaging::stage(const BiasSpec& bs, int H, cudaStream_t stream, const char* op) {
    BiasArgs ba;
    ba.kind = int(bs.kind);
    switch (bs.kind) {
        case BiasKind::None:
            break;
        case BiasKind::Table:
            CTX_CHECK(is_device_memory(bs.table), "{}: the Table bias must be device memory", op);
            CTX_CHECK(bs.dtable == nullptr || is_device_memory(bs.dtable),
                      "{}: dtable must be device memory", op);
            ba.table = bs.table;
            break;
        case BiasKind::Linear:
        case BiasKind::KerpleLog:
        case BiasKind::KerplePower:
            ba.a = device_view(bs.a, size_t(H), a_, stream, op);  // fixed ALiBi slopes: host
            if (bs.kind != BiasKind::Linear) ba.b = device_view(bs.b, size_t(H), b_, stream, op);
            break;
        case BiasKind::T5: {
            ba.a = device_view(bs.a, size_t(H) * bs.num_buckets, a_, stream, op);
            ba.nb = bs.num_buckets;
            ba.md = bs.max_distance;
            if (bs.max_distance <= kT5LutSize) {
                if (lut_nb_ != bs.num_buckets || lut_md_ != bs.max_distance) {
                    h_lut_.resize(size_t(bs.max_distance) + 1);
                    for (int n = 0; n <= bs.max_distance; n++)
                        h_lut_[size_t(n)] = t5_bucket(n, bs.num_buckets, bs.max_distance);
                    int32_t* d = lut_.ensure(h_lut_.size(), op);
                    uploads_.upload(d, h_lut_.data(), h_lut_.size() * sizeof(int32_t), stream, op);
                    lut_nb_ = bs.num_buckets;
                    lut_md_ = bs.max_distance;
                }
                ba.lut = lut_.ensure(size_t(bs.max_distance) + 1, op);
            }
            break;
        }
    }
    // Gradients accumulate on the device: host pointers would be a caller error.
    CTX_CHECK(bs.da == nullptr || bs.kind == BiasKind::None || bs.kind == BiasKind::Table ||
                  is_device_memory(bs.da),
              "{}: bias gradient da must be device memory", op);
    CTX_CHECK(bs.db == nullptr || bs.kind == BiasKind::None || bs.kind == BiasKind::Table ||
                  is_device_memory(bs.db),
              "{}: bias gradient db must be device memory", op);
    return ba;
}

// ================================================================ rotary

// sign +1: the forward rotation of q, k in x (qkv); sign -1: its transpose on x (dqkv), since the
// forward map per pair is s R(a) and its transpose s R(-a).
void CudaBackend::rotary_apply(float* x, const float* positions, int B, int T, int C, int H,
                               const RotarySpec& spec, float sign, const char* op) {
    check_rotary(C, H, spec);
    if (spec.rotary_dims == 0 || B * T == 0) return;
    activate();
    done(launch_rotary(x, positions, B * T, C, H, stage_rotary(spec, op), sign, stream_), op);
}

RotaryArgs CudaBackend::stage_rotary(const RotarySpec& spec, const char* op) {
    const int half = spec.rotary_dims / 2;
    // inv_freq and amp_base are host memory (backend.h): [inv_freq | amp_base] in one upload
    h_rotary_.assign(spec.inv_freq, spec.inv_freq + half);
    if (spec.amp_base != nullptr)
        h_rotary_.insert(h_rotary_.end(), spec.amp_base, spec.amp_base + half);
    float* d = d_rotary_.ensure(h_rotary_.size(), op);
    upload(d, h_rotary_.data(), h_rotary_.size() * sizeof(float), op);
    RotaryArgs r;
    r.dr = spec.rotary_dims;
    r.layout = int(spec.layout);
    r.inv_freq = d;
    r.position_scale = spec.position_scale;
    r.attention_factor = spec.attention_factor;
    r.amp_base = spec.amp_base != nullptr ? d + half : nullptr;
    r.amp_scale_base = spec.amp_scale_base;
    return r;
}

RotationTable CudaBackend::flash_rotation(const float* positions, int B, int T, int C, int H,
                                          const AttentionOptions& opt, const char* op) {
    RotationTable rot;
    if (opt.rotary == nullptr || B <= 0) return rot;
    CTX_CHECK(flash_.fuses_rotary(opt.mode, C, H, *opt.rotary),
              "{}: {} does not rotate q and k inside flash attention for this call (it does on "
              "the bf16 kernels with the split backward, for rotary dims whose pairs fit a "
              "thread: Interleaved, or Half with rotary_dims a multiple of 16)",
              op, name_);
    const RotaryArgs r = stage_rotary(*opt.rotary, op);
    float* table = d_rotation_.ensure(size_t(B) * T * size_t(r.dr / 2) * 4, op);
    check(launch_rotary_table(table, positions, B * T, r, stream_), op);
    rot.table = table;
    rot.dr = r.dr;
    rot.layout = r.layout;
    return rot;
}

bool CudaBackend::attention_fuses_rotary(AttentionMode mode, int C, int H,
                                         const RotarySpec& spec) const {
    return flash_.fuses_rotary(mode, C, H, spec);
}

void CudaBackend::rotary_forward(float* qkv, const float* positions, int B, int T, int C, int H,
                                 const RotarySpec& spec) {
    rotary_apply(qkv, positions, B, T, C, H, spec, +1.0f, "rotary_forward");
}

void CudaBackend::rotary_backward(float* dqkv, const float* positions, int B, int T, int C, int H,
                                  const RotarySpec& spec) {
    rotary_apply(dqkv, positions, B, T, C, H, spec, -1.0f, "rotary_backward");
}

// ================================================================ attention

bool CudaBackend::attention_mode_supported(AttentionMode mode, int C, int H) const {
    switch (mode) {
        case AttentionMode::Materialised: return true;
        case AttentionMode::Flash: return FlashAttention::supports(C, H);
    }
    return false;
}

// Flash whenever the kernels handle the head dim: it never stores the (B, H, T, T) probabilities
// and skips the masked half of the products.
AttentionMode CudaBackend::attention_mode_auto(int /*T*/, int C, int H) const {
    return attention_mode_supported(AttentionMode::Flash, C, H) ? AttentionMode::Flash
                                                                : AttentionMode::Materialised;
}

namespace {

// A known mode that this backend implements for head dim C / H (flash: <= kFlashMaxHeadDim).
void check_mode(AttentionMode mode, int C, int H, const char* op) {
    CTX_CHECK(mode == AttentionMode::Materialised || mode == AttentionMode::Flash,
              "{}: unknown attention mode {} (expected materialised or flash)", op, int(mode));
    if (mode == AttentionMode::Flash) FlashAttention::check_supported(C, H, op);
}

}  // namespace

size_t CudaBackend::attention_scratch_floats(int B, int T, int C, int H,
                                             AttentionMode mode) const {
    check_mode(mode, C, H, "attention_scratch_floats");
    // flash: [dvec (B, H, T)][bias-gradient partials (B, H, ceil(T/32), kMaxT5Buckets)]
    if (mode == AttentionMode::Flash) return FlashAttention::backward_scratch_floats(B, T, C, H);
    // materialised: [dS of one batch row (H, T, T)][bias-gradient partials as above]
    return size_t(H) * T * T + size_t(B) * H * bias_grad_chunks(T) * kMaxT5Buckets;
}

size_t CudaBackend::attention_saved_floats(AttentionMode mode, int B, int T, int C, int H) const {
    check_mode(mode, C, H, "attention_saved_floats");
    if (mode == AttentionMode::Flash) return flash_.saved_floats(B, T, C, H);
    return ctx::attention_saved_floats(mode, B, T, H);
}

bool CudaBackend::attention_backward_reads_qkv(AttentionMode mode) const {
    return !flash_.keeps_qkv(mode);
}

bool CudaBackend::attention_out_bf16(AttentionMode mode) const {
    return bf16_activations_ && flash_.keeps_qkv(mode);
}

// The argument checks of attention_forward / attention_backward, and that this backend keeps the
// attention output in bf16 in opt.mode.
void CudaBackend::check_attention_bf16(const char* op, int T, int C, int H,
                                       const AttentionOptions& opt) const {
    require_bf16_activations(op);
    check_attention(T, C, H, opt, opt.rotary != nullptr);  // flash_rotation checks the fusion
    check_mode(opt.mode, C, H, op);
    CTX_CHECK(attention_out_bf16(opt.mode),
              "{}: {} keeps the attention output in bf16 in flash mode only, not {}", op, name_,
              attention_mode_name(opt.mode));
}

void CudaBackend::attention_forward_bf16(Bf16* out, float* saved, const float* qkv,
                                         const float* positions, int B, int T, int C, int H,
                                         const AttentionOptions& opt) {
    static constexpr const char* op = "attention_forward_bf16";
    check_attention_bf16(op, T, C, H, opt);
    if (B <= 0) return;
    activate();
    const RotationTable rot = flash_rotation(positions, B, T, C, H, opt, op);
    flash_.forward(stream_, nullptr, reinterpret_cast<uint16_t*>(out), saved, qkv, positions, B, T,
                   C, H, opt, rot);
    if (sync_each_op_) sync(op);
}

void CudaBackend::attention_backward_bf16(float* dqkv, float* scratch, const float* dout,
                                          const float* qkv, const float* saved, const Bf16* out,
                                          const float* positions, int B, int T, int C, int H,
                                          const AttentionOptions& opt) {
    static constexpr const char* op = "attention_backward_bf16";
    check_attention_bf16(op, T, C, H, opt);
    if (B <= 0) return;
    flash_backward(dqkv, scratch, dout, qkv, saved, nullptr, reinterpret_cast<const uint16_t*>(out),
                   positions, B, T, C, H, opt, op);
}

// The flash backward with out in fp32 or (out16) bf16. GradStore::Overwrite: the tensor-core
// kernels write dqkv themselves; the caller zeroed it for the others.
void CudaBackend::flash_backward(float* dqkv, float* scratch, const float* dout, const float* qkv,
                                 const float* saved, const float* out, const uint16_t* out16,
                                 const float* positions, int B, int T, int C, int H,
                                 const AttentionOptions& opt, const char* op) {
    CTX_CHECK(out != nullptr || out16 != nullptr,
              "{}: flash mode needs the forward's output `out` (B, T, C) (it recomputes the "
              "probabilities from it and the saved log-sum-exp); got null",
              op);
    CTX_CHECK(saved != nullptr, "{}: flash mode needs the forward's saved lse (B, H, T); got null",
              op);
    CTX_CHECK(qkv != nullptr || flash_.keeps_qkv(opt.mode),
              "{}: {} needs the forward's qkv (B, T, 3C) for the flash backward; got null", op,
              name_);
    activate();
    const RotationTable rot = flash_rotation(positions, B, T, C, H, opt, op);
    flash_.backward(stream_, dqkv, scratch, dout, qkv, out, out16, saved, positions, B, T, C, H,
                    opt, rot);
    if (sync_each_op_) sync(op);
}

void CudaBackend::attention_forward(float* out, float* saved, const float* qkv,
                                    const float* positions, int B, int T, int C, int H,
                                    const AttentionOptions& opt) {
    static constexpr const char* op = "attention_forward";
    // opt.rotary: flash mode only, where flash_rotation checks that the kernels fuse it
    check_attention(T, C, H, opt, opt.mode == AttentionMode::Flash);
    check_mode(opt.mode, C, H, op);
    if (B <= 0) return;
    activate();
    if (opt.mode == AttentionMode::Flash) {
        // saved = lse (B, H, T) [+ the tensor-core kernels' packed q, k, v]
        const RotationTable rot = flash_rotation(positions, B, T, C, H, opt, op);
        flash_.forward(stream_, out, nullptr, saved, qkv, positions, B, T, C, H, opt, rot);
        if (sync_each_op_) sync(op);
        return;
    }
    float* att = saved;  // (B, H, T, T) probabilities
    const BiasArgs ba = bias_args(opt.bias, H, op);
    const int D = C / H, C3 = 3 * C;
    const float scale = 1.0f / std::sqrt(float(D));
    const long long TT = (long long)T * T;
    for (int b = 0; b < B; b++) {
        const float* q = qkv + size_t(b) * T * C3;  // head h at + h*D, (T, D) ld 3C
        const float* k = q + C;
        float* att_b = att + size_t(b) * H * TT;    // (H, T, T)
        // logits (T, T) = q k^T / sqrt(D), per head
        gemm_batched(op, false, true, T, T, D, scale, q, C3, D, k, C3, D, 0.0f, att_b, T, TT, H);
    }
    check(launch_attention_softmax(att, positions, B, H, T, KeyMask{opt.window, opt.doc_start}, ba,
                                   stream_),
          op);
    for (int b = 0; b < B; b++) {
        const float* v = qkv + size_t(b) * T * C3 + 2 * C;
        const float* att_b = att + size_t(b) * H * TT;
        float* out_b = out + size_t(b) * T * C;  // head h at + h*D, (T, D) ld C
        // out (T, D) = P (T, T) v (T, D), per head
        gemm_batched(op, false, false, T, D, T, 1.0f, att_b, T, TT, v, C3, D, 0.0f, out_b, C, D,
                     H);
    }
    if (sync_each_op_) sync(op);
}

void CudaBackend::attention_backward(float* dqkv, float* scratch, const float* dout,
                                     const float* qkv, const float* saved, const float* out,
                                     const float* positions, int B, int T, int C, int H,
                                     const AttentionOptions& opt) {
    static constexpr const char* op = "attention_backward";
    check_attention(T, C, H, opt, opt.mode == AttentionMode::Flash);  // as attention_forward
    check_mode(opt.mode, C, H, op);
    if (B <= 0) return;
    // Overwrite: the tensor-core flash kernels write dqkv themselves; every other path adds its
    // sums, so it starts from zeros
    if (opt.dqkv_store == GradStore::Overwrite && !flash_.writes_dqkv(opt.mode))
        zero(dqkv, size_t(B) * T * 3 * C);
    if (opt.mode == AttentionMode::Flash) {
        flash_backward(dqkv, scratch, dout, qkv, saved, out, nullptr, positions, B, T, C, H, opt,
                       op);
        return;
    }
    activate();
    const float* att = saved;  // (B, H, T, T) probabilities
    const BiasSpec& bs = opt.bias;
    const BiasArgs ba = bias_args(bs, H, op);
    const bool bias_grads = bs.kind != BiasKind::None && bs.kind != BiasKind::Table &&
                            (bs.da != nullptr || bs.db != nullptr);
    float* dtable = bs.kind == BiasKind::Table ? bs.dtable : nullptr;
    const int D = C / H, C3 = 3 * C;
    const float scale = 1.0f / std::sqrt(float(D));
    const long long TT = (long long)T * T;
    float* ds = scratch;                              // (H, T, T) of the current batch row
    float* partials = scratch + size_t(H) * size_t(TT);  // (B, H, chunks, kMaxT5Buckets)
    for (int b = 0; b < B; b++) {
        const size_t head0 = size_t(b) * T * C3;
        const float* q = qkv + head0;        // (T, D) per head, ld 3C
        const float* k = q + C;
        const float* v = q + 2 * C;
        float* dq = dqkv + head0;
        float* dk = dq + C;
        float* dv = dq + 2 * C;
        const float* dout_b = dout + size_t(b) * T * C;  // (T, D) per head, ld C
        const float* att_b = att + size_t(b) * H * TT;   // (H, T, T)
        // dP (T, T) = dout v^T
        gemm_batched(op, false, true, T, T, D, 1.0f, dout_b, C, D, v, C3, D, 0.0f, ds, T, TT, H);
        // dv (T, D) += P^T dout
        gemm_batched(op, true, false, T, D, T, 1.0f, att_b, T, TT, dout_b, C, D, 1.0f, dv, C3, D,
                     H);
        // dS = P (dP - rowsum(P dP)); dtable += dS
        const KeyMask mask_b{opt.window, opt.doc_start ? opt.doc_start + size_t(b) * T : nullptr};
        check(launch_attention_dlogits(ds, att_b, dtable ? dtable + size_t(b) * H * TT : nullptr,
                                       H, T, mask_b, stream_),
              op);
        // dq += dS k / sqrt(D);  dk += dS^T q / sqrt(D)
        gemm_batched(op, false, false, T, D, T, scale, ds, T, TT, k, C3, D, 1.0f, dq, C3, D, H);
        gemm_batched(op, true, false, T, D, T, scale, ds, T, TT, q, C3, D, 1.0f, dk, C3, D, H);
        if (bias_grads)
            check(launch_attention_bias_grad_partials(partials, ds, positions + size_t(b) * T, b,
                                                      H, T, mask_b, ba, stream_),
                  op);
    }
    if (bias_grads)
        check(launch_attention_bias_grad_reduce(bs.da, bs.db, partials, B, H, T, ba.kind, ba.nb,
                                                stream_),
              op);
    if (sync_each_op_) sync(op);
}

// ================================================================ attention over a KV cache

size_t CudaBackend::attention_cached_scratch_floats(int /*S*/) const {
    return 0;  // online softmax over key tiles in shared memory: no scratch
}

void CudaBackend::attention_cached_forward(float* out, float* /*scratch*/, const float* qkv,
                                           const float* kc, const float* vc, const float* kpos,
                                           const int32_t* lens, int B, int Tq, int S, int C, int H,
                                           const AttentionOptions& opt) {
    static constexpr const char* op = "attention_cached_forward";
    check_attention_cached(S, C, H, opt);
    CTX_CHECK(Tq >= 1 && Tq <= S, "cached attention: need 1 <= Tq ({}) <= S ({})", Tq, S);
    if (B <= 0) return;
    activate();
    const int32_t* h_lens = host_view(lens, size_t(B), h_ints_, op);  // host by contract
    for (int b = 0; b < B; b++)
        CTX_CHECK(h_lens[b] >= Tq && h_lens[b] <= S, "cached attention: row {} holds {} entries; "
                  "need Tq ({}) <= entries <= S ({})", b, h_lens[b], Tq, S);
    const int32_t* d_lens = device_view(lens, size_t(B), d_lens_, op);
    const BiasArgs ba = bias_args(opt.bias, H, op);
    done(launch_attention_cached(out, qkv, kc, vc, kpos, d_lens, B, Tq, S, C, H, opt.window, ba,
                                 opt.heads, opt.heads ? opt.heads_k : H, stream_),
         op);
}

}  // namespace ctx::cuda
