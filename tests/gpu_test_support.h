// Helpers shared by the CUDA backend tests (test_ops_gpu_*): the two backends, device buffers,
// random data, the relative-error check, position styles and random bias parameters. Only the
// Backend interface is used, so this compiles in builds without CUDA too (gpu() then throws).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "core/error.h"
#include "op_reference.h"

namespace {

using FVec = std::vector<float>;

inline bool have_gpu() { return ctx::cuda_device_count() > 0; }

inline ctx::Backend& cpu() {
    static std::unique_ptr<ctx::Backend> be = ctx::make_cpu_backend(2);
    return *be;
}

inline ctx::Backend& gpu() {
    static std::unique_ptr<ctx::Backend> be = ctx::make_cuda_backend(0);
    return *be;
}

// The CUDA backend in bf16 mixed precision (bf16 tensor-core products and flash attention).
inline ctx::Backend& gpu_bf16() {
    static std::unique_ptr<ctx::Backend> be = ctx::make_cuda_backend(0, ctx::Precision::Bf16);
    return *be;
}

// A bf16 CUDA backend on `device` made while the environment variables of `vars` (name, value)
// are set (unset again after).
inline std::unique_ptr<ctx::Backend> make_bf16_backend_with(
    const std::vector<std::pair<const char*, const char*>>& vars, int device = 0) {
    for (const auto& [var, value] : vars) setenv(var, value, 1);
    std::unique_ptr<ctx::Backend> made;
    try {
        made = ctx::make_cuda_backend(device, ctx::Precision::Bf16);
    } catch (...) {
        for (const auto& v : vars) unsetenv(v.first);
        throw;
    }
    for (const auto& v : vars) unsetenv(v.first);
    return made;
}
inline std::unique_ptr<ctx::Backend> make_bf16_backend_with(const char* var, const char* value) {
    return make_bf16_backend_with({{var, value}});
}

// The same with the one-kernel tensor-core attention backward (CTX_FLASH_BACKWARD=atomic: dq by
// fp32 atomic adds; cuda_flash.h FlashBackward).
inline ctx::Backend& gpu_bf16_atomic_dq() {
    static std::unique_ptr<ctx::Backend> be =
        make_bf16_backend_with("CTX_FLASH_BACKWARD", "atomic");
    return *be;
}

// The same with the tensor-core forward at one m-tile per warp (CTX_FLASH_FORWARD_MTILES=1).
inline ctx::Backend& gpu_bf16_one_mtile() {
    static std::unique_ptr<ctx::Backend> be =
        make_bf16_backend_with("CTX_FLASH_FORWARD_MTILES", "1");
    return *be;
}

// The same with the tensor-core forward on wgmma where it applies (CTX_FLASH_FORWARD=wgmma: an
// sm_90 GPU, head dims 64 and 128, the inline bias families; the mma.sync forward elsewhere).
inline ctx::Backend& gpu_bf16_wgmma_forward() {
    static std::unique_ptr<ctx::Backend> be = make_bf16_backend_with("CTX_FLASH_FORWARD", "wgmma");
    return *be;
}

// Every wgmma kernel with a producer warpgroup (CTX_FLASH_WGMMA_PIPELINE=producer), their
// blocks' computing warpgroups two (the default) or one; with tma, their tiles by TMA into
// 128-byte swizzled tiles (CTX_FLASH_WGMMA_LOADS=tma).
inline ctx::Backend& gpu_bf16_wgmma_producer(int warpgroups, bool tma = false) {
    auto make = [](const char* warpgroups_value, const char* loads) {
        return make_bf16_backend_with({{"CTX_FLASH_FORWARD", "wgmma"},
                                       {"CTX_FLASH_DQ", "wgmma"},
                                       {"CTX_FLASH_DKV", "wgmma"},
                                       {"CTX_FLASH_WGMMA_PIPELINE", "producer"},
                                       {"CTX_FLASH_WGMMA_WARPGROUPS", warpgroups_value},
                                       {"CTX_FLASH_WGMMA_LOADS", loads}});
    };
    static std::unique_ptr<ctx::Backend> two = make("2", "cp.async"), one = make("1", "cp.async"),
                                         two_tma = make("2", "tma"), one_tma = make("1", "tma");
    if (tma) return warpgroups == 1 ? *one_tma : *two_tma;
    return warpgroups == 1 ? *one : *two;
}

// The same with the backward's dq kernel on wgmma where it applies (CTX_FLASH_DQ=wgmma: an sm_90
// GPU, head dims 64 and 128, the inline families without parameter gradients, no table, T5 or
// rotation; the mma.sync dq kernel elsewhere).
inline ctx::Backend& gpu_bf16_wgmma_dq() {
    static std::unique_ptr<ctx::Backend> be = make_bf16_backend_with("CTX_FLASH_DQ", "wgmma");
    return *be;
}

// The same with the backward's dk / dv kernel on wgmma where it applies (CTX_FLASH_DKV=wgmma: an
// sm_90 GPU, head dims 64 and 128, the inline families; the mma.sync kernel elsewhere).
inline ctx::Backend& gpu_bf16_wgmma_dkv() {
    static std::unique_ptr<ctx::Backend> be = make_bf16_backend_with("CTX_FLASH_DKV", "wgmma");
    return *be;
}

// The one-kernel backward (CTX_FLASH_BACKWARD=atomic) with the dk / dv kernel on wgmma: on wgmma
// where it serves (an sm_90 GPU, kernel head dims 64 and 128, the inline families without
// parameter gradients), in blocks of two warpgroups or of one, lock-step or with a producer
// warpgroup (CTX_FLASH_WGMMA_PIPELINE=producer); the mma.sync one-kernel backward elsewhere.
inline ctx::Backend& gpu_bf16_wgmma_atomic_dq(int warpgroups, bool producer = false) {
    auto make = [](int wgs, bool prod) {
        return make_bf16_backend_with(
            {{"CTX_FLASH_BACKWARD", "atomic"},
             {"CTX_FLASH_DKV", "wgmma"},
             {"CTX_FLASH_WGMMA_WARPGROUPS", wgs == 1 ? "1" : "2"},
             {"CTX_FLASH_WGMMA_PIPELINE", prod ? "producer" : "lockstep"}});
    };
    static std::unique_ptr<ctx::Backend> two = make(2, false), one = make(1, false),
                                         two_producer = make(2, true), one_producer = make(1, true);
    if (producer) return warpgroups == 1 ? *one_producer : *two_producer;
    return warpgroups == 1 ? *one : *two;
}

// The same with every tensor-core attention kernel on wgmma where it applies (the forward, the dq
// and the dk / dv kernels), in blocks of two warpgroups (the default), or of one
// (CTX_FLASH_WGMMA_WARPGROUPS=1).
inline ctx::Backend& gpu_bf16_wgmma_all() {
    static std::unique_ptr<ctx::Backend> be = make_bf16_backend_with(
        {{"CTX_FLASH_FORWARD", "wgmma"}, {"CTX_FLASH_DQ", "wgmma"}, {"CTX_FLASH_DKV", "wgmma"}});
    return *be;
}
inline ctx::Backend& gpu_bf16_wgmma_all_one_warpgroup() {
    static std::unique_ptr<ctx::Backend> be =
        make_bf16_backend_with({{"CTX_FLASH_FORWARD", "wgmma"},
                                {"CTX_FLASH_DQ", "wgmma"},
                                {"CTX_FLASH_DKV", "wgmma"},
                                {"CTX_FLASH_WGMMA_WARPGROUPS", "1"}});
    return *be;
}

// A device buffer of a CUDA backend (gpu() unless named), filled from / read back to host
// vectors through that backend, so copies are ordered with the ops it runs.
class Dev {
public:
    explicit Dev(size_t n, ctx::Backend& be = gpu()) : n_(n), be_(&be), p_(be.alloc_floats(n)) {}
    explicit Dev(const FVec& h, ctx::Backend& be = gpu()) : Dev(h.size(), be) {
        be_->copy_to_device(p_, h.data(), h.size());
    }
    Dev(const Dev&) = delete;
    Dev& operator=(const Dev&) = delete;
    ~Dev() { be_->free_floats(p_); }
    float* get() { return p_; }
    FVec host() const { return host(n_); }
    FVec host(size_t n) const {  // the first n floats
        FVec h(std::min(n, n_));
        be_->copy_to_host(h.data(), p_, h.size());
        return h;
    }
    size_t size() const { return n_; }

private:
    size_t n_;
    ctx::Backend* be_;
    float* p_;
};

// A device buffer of n bf16 values (n / 2 floats rounded up), written from and read back to
// fp32 host vectors whose values are bf16 (the upper halves of the floats).
class Dev16 {
public:
    explicit Dev16(size_t n, ctx::Backend& be = gpu_bf16()) : n_(n), buf_((n + 1) / 2, be) {}
    explicit Dev16(const FVec& values, ctx::Backend& be = gpu_bf16()) : Dev16(values.size(), be) {
        std::vector<uint16_t> bits((n_ + 1) / 2 * 2, 0);
        for (size_t i = 0; i < n_; i++) {
            uint32_t u;
            std::memcpy(&u, &values[i], sizeof u);
            EXPECT_EQ(u & 0xffffu, 0u) << "entry " << i << " is not a bf16 value";
            bits[i] = uint16_t(u >> 16);
        }
        FVec words(bits.size() / 2);
        std::memcpy(words.data(), bits.data(), bits.size() * sizeof(uint16_t));
        be.copy_to_device(buf_.get(), words.data(), words.size());
    }
    ctx::Bf16* get() { return reinterpret_cast<ctx::Bf16*>(buf_.get()); }
    FVec host() const {
        const FVec words = buf_.host();
        std::vector<uint16_t> bits(words.size() * 2);
        std::memcpy(bits.data(), words.data(), words.size() * sizeof(float));
        FVec out(n_);
        for (size_t i = 0; i < n_; i++) {
            const uint32_t u = uint32_t(bits[i]) << 16;
            std::memcpy(&out[i], &u, sizeof u);
        }
        return out;
    }

private:
    size_t n_;
    Dev buf_;
};

// A device copy of int32 data (the backend's float allocator holds the same 4-byte words).
class DevInts {
public:
    explicit DevInts(const std::vector<int32_t>& h) : buf_(h.size()) {
        FVec bits(h.size());
        std::memcpy(bits.data(), h.data(), h.size() * sizeof(int32_t));
        gpu().copy_to_device(buf_.get(), bits.data(), bits.size());
    }
    const int32_t* get() { return reinterpret_cast<const int32_t*>(buf_.get()); }

private:
    Dev buf_;
};

inline FVec randn(ref::Rng& rng, size_t n, double sd = 1.0) { return ref::to_float(rng.normals(n, sd)); }
inline FVec randu(ref::Rng& rng, size_t n, double lo, double hi) {
    return ref::to_float(rng.uniforms(n, lo, hi));
}

// max |got - want| / max |want| (0 when both are 0): fp32 rounding differences of a few ulps of
// the largest entry pass; a wrong entry anywhere does not.
inline double rel_err(const FVec& got, const FVec& want) {
    EXPECT_EQ(got.size(), want.size());
    double err = 0.0, mag = 0.0;
    for (size_t i = 0; i < std::min(got.size(), want.size()); i++) {
        if (std::isnan(got[i]) != std::isnan(want[i])) return INFINITY;
        err = std::max(err, std::fabs(double(got[i]) - double(want[i])));
        mag = std::max(mag, std::fabs(double(want[i])));
    }
    if (err == 0.0) return 0.0;
    return mag > 0.0 ? err / mag : INFINITY;
}

// Bits equal, entry by entry (a NaN equals a NaN of the same bits).
inline void expect_same_bits(const FVec& got, const FVec& want, const char* what) {
    ASSERT_EQ(got.size(), want.size()) << what;
    size_t differ = 0, first = 0;
    for (size_t i = 0; i < got.size(); i++)
        if (std::memcmp(&got[i], &want[i], sizeof(float)) != 0 && differ++ == 0) first = i;
    EXPECT_EQ(differ, 0u) << what << ": first at " << first << ": " << got[first] << " vs "
                          << want[first];
}

// f() throws ctx::Error and its message contains every one of `parts` (what the caller is told).
template <class F>
void expect_error(F&& f, std::initializer_list<const char*> parts) {
    try {
        f();
        ADD_FAILURE() << "expected a ctx::Error";
    } catch (const ctx::Error& e) {
        const std::string msg = e.what();
        for (const char* p : parts)
            EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' not in: " << msg;
    }
}

// fp32 -> bf16 -> fp32, round to nearest, ties to even (NaN stays NaN; overflow gives +-inf):
// keep the upper 16 bits and round up when the dropped half is above 0x8000, or exactly 0x8000
// with an odd kept part (a carry into the exponent is the correct next binade / infinity). The
// tests' own model of the backend's bf16 rounding.
inline float round_bf16(float f) {
    if (std::isnan(f)) return f;
    uint32_t u;
    std::memcpy(&u, &f, sizeof u);
    uint32_t kept = u & 0xffff0000u;
    const uint32_t dropped = u & 0x0000ffffu;
    if (dropped > 0x8000u || (dropped == 0x8000u && (kept & 0x00010000u) != 0)) kept += 0x00010000u;
    float r;
    std::memcpy(&r, &kept, sizeof r);
    return r;
}

inline FVec rounded(const FVec& x) {
    FVec r(x.size());
    for (size_t i = 0; i < x.size(); i++) r[i] = round_bf16(x[i]);
    return r;
}

// |got - round(want)| within one bf16 step of the value (8 significant bits) at every entry, or
// within 1e-5 of the largest |want| (two backends' fp32 results differ by that much where they
// nearly cancel, e.g. GELU's tail: -1.5e-7 against -0).
inline void expect_within_bf16_step(const FVec& got, const FVec& want, const char* what) {
    ASSERT_EQ(got.size(), want.size()) << what;
    float largest = 0.0f;
    for (float w : want) largest = std::max(largest, std::fabs(w));
    size_t bad = 0;
    for (size_t i = 0; i < got.size(); i++) {
        const float r = round_bf16(want[i]);
        const float step = std::ldexp(1.0f, std::ilogb(std::fabs(r) + 1e-30f) - 7);
        if (std::fabs(got[i] - r) > std::max(step, 1e-5f * largest) && bad++ < 3)
            ADD_FAILURE() << what << " entry " << i << ": " << got[i] << " vs " << r;
    }
    EXPECT_EQ(bad, 0u) << what;
}

constexpr double kFwdTol = 2e-5;
constexpr double kGradTol = 1e-4;

#define EXPECT_CLOSE(got, want, tol) EXPECT_LT(rel_err(got, want), tol) << #got

// Position styles: contiguous, with gaps, wide fractional, unsorted, integers with gaps (the
// original positions of sampled chunks: what KERPLE-log's tables serve, cuda_flash_tc.cuh).
enum PosStyle { kContiguous = 0, kGaps = 1, kWide = 2, kUnsorted = 3, kIntGaps = 4 };

inline FVec make_positions(ref::Rng& rng, int B, int T, PosStyle style) {
    FVec pos(size_t(B) * T);
    for (int b = 0; b < B; b++) {
        double p = style == kGaps ? 3.25 + 7 * b : style == kIntGaps ? 2.0 + 9 * b : 0.0;
        for (int t = 0; t < T; t++) {
            float& x = pos[size_t(b) * T + t];
            switch (style) {
                case kContiguous: x = float(t); break;
                case kGaps:  // steps of 1 and occasional jumps, quarter offsets
                    x = float(p);
                    p += (t % 4 == 3) ? 5.5 : 1.0;
                    break;
                case kWide:  // sorted, fractional, spanning several hundred
                    p += rng.uniform(0.0, 600.0 / T);
                    x = float(p);
                    break;
                case kUnsorted: x = float(rng.uniform(0.0, 40.0)); break;
                case kIntGaps:  // steps of 1 and a jump of 6 every fifth token
                    x = float(p);
                    p += (t % 5 == 4) ? 6.0 : 1.0;
                    break;
            }
        }
    }
    return pos;
}

// A rotation as the rope plugin makes one: frequencies 10000^(-2k/dr) (GPT-NeoX's and Llama's
// base), xPos amplitudes (2k/dr + 0.4) / 1.4 where asked, base 512. Holds the host arrays the
// RotarySpec points into (so it is not copied).
struct TestRotation {
    FVec inv_freq, amp;
    ctx::RotarySpec spec;
    TestRotation(int dr, ctx::RotaryLayout layout, float position_scale, float attention_factor,
                 bool xpos) {
        for (int k = 0; k < dr / 2; k++) {
            inv_freq.push_back(float(std::pow(10000.0, -2.0 * k / dr)));
            amp.push_back(float((2.0 * k / dr + 0.4) / 1.4));
        }
        spec.rotary_dims = dr;
        spec.layout = layout;
        spec.inv_freq = inv_freq.data();
        spec.position_scale = position_scale;
        spec.attention_factor = attention_factor;
        spec.amp_base = xpos ? amp.data() : nullptr;
        spec.amp_scale_base = 512.0f;
    }
    TestRotation(const TestRotation&) = delete;
    TestRotation& operator=(const TestRotation&) = delete;
};

// A case's bias parameters (host values; gradients pre-filled with noise so accumulation shows).
struct BiasData {
    FVec a, b, da, db, table, dtable;
};

inline BiasData make_bias_data(ref::Rng& rng, ctx::BiasKind kind, int B, int H, int T,
                               int num_buckets) {
    BiasData d;
    switch (kind) {
        case ctx::BiasKind::None: break;
        case ctx::BiasKind::Linear: d.a = randu(rng, H, 0.02, 0.3); break;
        case ctx::BiasKind::KerpleLog:
            d.a = randu(rng, H, 0.2, 2.0);
            d.b = randu(rng, H, 0.05, 1.0);
            break;
        case ctx::BiasKind::KerplePower:
            d.a = randu(rng, H, 0.1, 1.0);
            d.b = randu(rng, H, 0.2, 1.5);
            break;
        case ctx::BiasKind::T5: d.a = randn(rng, size_t(H) * num_buckets); break;
        case ctx::BiasKind::Table:
            d.table = randn(rng, size_t(B) * H * T * T);
            d.dtable = randn(rng, d.table.size());
            break;
    }
    d.da = randn(rng, d.a.size(), 0.5);
    d.db = randn(rng, d.b.size(), 0.5);
    return d;
}

}  // namespace
