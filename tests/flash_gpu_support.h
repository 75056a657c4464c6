// The flash attention GPU tests' cases and helpers (test_ops_gpu_flash.cpp; for any further
// flash test file): the cases, one forward + backward through a backend on device copies of a
// case, the bf16 cases with the CPU's result on the rounded operands, and the comparisons they
// share.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <ostream>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "gpu_test_support.h"
#include "op_reference.h"

namespace {

using ctx::AttentionMode;

#define REQUIRE_GPU()                                                                       \
    do {                                                                                    \
        if (!have_gpu())                                                                    \
            GTEST_SKIP() << "no CUDA device visible (cuda_device_count() == 0): the flash " \
                            "attention tests need a GPU";                                   \
    } while (0)

struct FlashCase {
    std::string name;
    int B, T, C, H;
    ctx::BiasKind kind;
    int window;
    PosStyle pos;
    int num_buckets = 32, max_distance = 128;
    bool learn = true;    // da/db (or dtable) non-null
    bool host_a = false;  // a in host memory (fixed ALiBi slopes come from the plugin)
    int docs = 0;         // packed rows: documents per row (doc_start); 0: one
};
inline void PrintTo(const FlashCase& c, std::ostream* os) { *os << c.name; }

// The case's packed-row layout (AttentionOptions::doc_start), or empty.
inline std::vector<int32_t> case_docs(const FlashCase& fc) {
    if (fc.docs == 0) return {};
    ref::Rng rng(fc.T * 31 + fc.docs);
    return ref::doc_starts(rng, fc.B, fc.T, fc.docs);
}

// Device buffers of one case's inputs and gradients (gradients pre-filled from BiasData).
struct DevCase {
    Dev pos, qkv, a, b, da, db, table, dtable;
    std::vector<int32_t> docs_host;
    DevInts docs;
    DevCase(const FVec& positions, const FVec& q, const BiasData& bd, const FlashCase& fc,
            ctx::Backend& be)
        : pos(positions, be),
          qkv(q, be),
          a(bd.a, be),
          b(bd.b, be),
          da(bd.da, be),
          db(bd.db, be),
          table(bd.table, be),
          dtable(bd.dtable, be),
          docs_host(case_docs(fc)),
          docs(docs_host) {}
};

// The case's options in `mode`: host pointers into bd (CPU) or the device buffers of dc.
// host_docs: case_docs(fc) for the CPU side (dc null).
inline ctx::AttentionOptions options(const FlashCase& fc, BiasData& bd, DevCase* dc,
                                     AttentionMode mode,
                                     const std::vector<int32_t>* host_docs = nullptr) {
    ctx::AttentionOptions o;
    o.mode = mode;
    o.window = fc.window;
    if (fc.docs > 0) o.doc_start = dc ? dc->docs.get() : host_docs->data();
    o.bias.kind = fc.kind;
    o.bias.num_buckets = fc.num_buckets;
    o.bias.max_distance = fc.max_distance;
    if (fc.kind == ctx::BiasKind::Table) {
        o.bias.table = dc ? dc->table.get() : bd.table.data();
        if (fc.learn) o.bias.dtable = dc ? dc->dtable.get() : bd.dtable.data();
    } else if (fc.kind != ctx::BiasKind::None) {
        o.bias.a = dc && !fc.host_a ? dc->a.get() : bd.a.data();
        o.bias.b = bd.b.empty() ? nullptr : (dc ? dc->b.get() : bd.b.data());
        if (fc.learn) {
            o.bias.da = dc ? dc->da.get() : bd.da.data();
            if (!bd.b.empty()) o.bias.db = dc ? dc->db.get() : bd.db.data();
        }
    }
    return o;
}

// Log-sum-exp of every row's logits in double (backend.h, AttentionMode::Flash):
// lse[(b H + h) T + i] = log sum_j exp(q_i.k_j / sqrt(D) + bias_h(p_i - p_j)) over the keys j of
// query i inside the causal mask and the window.
inline FVec reference_lse(const FlashCase& fc, const FVec& qkv, const FVec& positions,
                          const BiasData& bd) {
    const int B = fc.B, T = fc.T, C = fc.C, H = fc.H, D = C / H;
    ref::Bias bias;
    if (fc.kind != ctx::BiasKind::Table) bias.kind = int(fc.kind);  // same values below Table
    bias.a = ref::to_double(bd.a);
    bias.b = ref::to_double(bd.b);
    bias.num_buckets = fc.num_buckets;
    bias.max_distance = fc.max_distance;
    FVec lse(size_t(B) * H * T);
    const std::vector<int32_t> docs = case_docs(fc);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++)
            for (int i = 0; i < T; i++) {
                int lo = fc.window > 0 ? std::max(0, i - fc.window + 1) : 0;
                if (!docs.empty()) lo = std::max(lo, int(docs[size_t(b) * T + i]));
                std::vector<double> s;
                for (int j = lo; j <= i; j++) {
                    double dot = 0.0;
                    for (int d = 0; d < D; d++)
                        dot += double(qkv[(size_t(b) * T + i) * 3 * C + size_t(h) * D + d]) *
                               double(qkv[(size_t(b) * T + j) * 3 * C + C + size_t(h) * D + d]);
                    const double dist =
                        double(positions[size_t(b) * T + i]) - double(positions[size_t(b) * T + j]);
                    double x = dot / std::sqrt(double(D)) + ref::bias_value(bias, h, dist);
                    if (fc.kind == ctx::BiasKind::Table)
                        x += bd.table[((size_t(b) * H + h) * T + i) * T + j];
                    s.push_back(x);
                }
                const double mx = *std::max_element(s.begin(), s.end());
                double sum = 0.0;
                for (double x : s) sum += std::exp(x - mx);
                lse[(size_t(b) * H + h) * T + i] = float(mx + std::log(sum));
            }
    return lse;
}

// One forward + backward through gpu() in `mode` on fresh device copies of the case; backward's
// scratch is exactly attention_scratch_floats and starts as noise (the op may not rely on it
// being zero), `saved` exactly the backend's attention_saved_floats. Where the backend says its
// backward does not read qkv (the bf16 flash kernels keep their packed q, k, v in `saved`), qkv
// is overwritten with NaN between the two calls, so a backward that read it would give NaN.
// GpuRun::saved is the probabilities or lse (ctx::attention_saved_floats of them).
struct GpuRun {
    FVec out, saved, dqkv, da, db, dtable;
};
inline GpuRun run_gpu(const FlashCase& fc, AttentionMode mode, const FVec& positions,
                      const FVec& qkv, BiasData bd, const FVec& dout, const FVec& dqkv0, bool learn,
                      ctx::Backend& be = gpu()) {
    const int B = fc.B, T = fc.T, C = fc.C, H = fc.H;
    FlashCase c = fc;
    c.learn = learn;
    DevCase dc(positions, qkv, bd, fc, be);
    const ctx::AttentionOptions o = options(c, bd, &dc, mode);
    ref::Rng noise(7);
    Dev out(size_t(B) * T * C, be), saved(be.attention_saved_floats(mode, B, T, C, H), be),
        gdout(dout, be), dqkv(dqkv0, be),
        scratch(randn(noise, be.attention_scratch_floats(B, T, C, H, mode)), be);
    be.attention_forward(out.get(), saved.get(), dc.qkv.get(), dc.pos.get(), B, T, C, H, o);
    if (!be.attention_backward_reads_qkv(mode)) {
        const FVec nan(qkv.size(), std::numeric_limits<float>::quiet_NaN());
        be.copy_to_device(dc.qkv.get(), nan.data(), nan.size());
    }
    be.attention_backward(dqkv.get(), scratch.get(), gdout.get(), dc.qkv.get(), saved.get(),
                          out.get(), dc.pos.get(), B, T, C, H, o);
    const FVec kept = saved.host(ctx::attention_saved_floats(mode, B, T, H));
    return {out.host(), kept, dqkv.host(), dc.da.host(), dc.db.host(), dc.dtable.host()};
}

// The bf16 backend's flash attention (the tensor-core kernels of cuda_flash_tc.cu) against the
// CPU backend in fp32 on the same bf16-rounded q, k, v and dout: what remains is the rounding of
// the probabilities and dlogits entering the products (2^-9 relative each) and the summation
// order, so outputs and gradients agree to kBf16Tol of their largest entry, while a wrong
// fragment layout, mask or bias is off by O(1). The bias-parameter gradients are sums over every
// logit of dlogits that cancel (each row's sum to zero), and dlogit carries the bf16 forward's
// error through D_i = rowsum(dout * out): they get kBf16BiasTol of their largest entry.
inline FVec round_bf16(FVec x) {
    for (float& v : x) {  // round to nearest even on the upper 16 bits (finite inputs)
        uint32_t u;
        std::memcpy(&u, &v, sizeof u);
        u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
        std::memcpy(&v, &u, sizeof u);
    }
    return x;
}

inline FVec minus(FVec a, const FVec& b) {
    for (size_t i = 0; i < a.size(); i++) a[i] -= b[i];
    return a;
}

constexpr double kBf16Tol = 1e-2;
constexpr double kBf16BiasTol = 3e-2;

// A case's inputs with q, k, v and dout rounded to bf16, and the CPU backend's fp32 result on
// them (materialised): out, dqkv (from dqkv0) and the bias data's gradients.
struct Bf16Case {
    FVec positions, qkv, dout, dqkv0;
    BiasData bd;  // inputs, gradients as pre-filled
    FVec out, dqkv;
    BiasData cb;  // the CPU's gradients
};
inline Bf16Case bf16_case(const FlashCase& fc, uint64_t seed) {
    const int B = fc.B, T = fc.T, C = fc.C, H = fc.H;
    ref::Rng rng(seed);
    Bf16Case k;
    k.positions = make_positions(rng, B, T, fc.pos);
    k.qkv = round_bf16(randn(rng, size_t(B) * T * 3 * C));
    k.bd = make_bias_data(rng, fc.kind, fc.B, fc.H, fc.T, fc.num_buckets);
    k.dout = round_bf16(randn(rng, size_t(B) * T * C));
    k.dqkv0 = randn(rng, k.qkv.size());
    k.cb = k.bd;
    const std::vector<int32_t> docs = case_docs(fc);
    const ctx::AttentionOptions copt =
        options(fc, k.cb, nullptr, AttentionMode::Materialised, &docs);
    FVec att(size_t(B) * H * T * T);
    k.out.resize(size_t(B) * T * C);
    k.dqkv = k.dqkv0;
    cpu().attention_forward(k.out.data(), att.data(), k.qkv.data(), k.positions.data(), B, T, C, H,
                            copt);
    FVec cscratch(cpu().attention_scratch_floats(B, T, C, H, AttentionMode::Materialised));
    cpu().attention_backward(k.dqkv.data(), cscratch.data(), k.dout.data(), k.qkv.data(),
                             att.data(), nullptr, k.positions.data(), B, T, C, H, copt);
    return k;
}

// Columns [c0, c0 + n) of each row of dqkv (B, T, 3C): dq, dk or dv of every row.
inline FVec dqkv_cols(const FVec& x, int C, int c0, int n) {
    FVec r;
    for (size_t o = 0; o < x.size(); o += size_t(3) * C)
        r.insert(r.end(), x.begin() + o + c0, x.begin() + o + c0 + n);
    return r;
}

// A bf16 tensor-core run's gradients against the CPU's on the rounded operands (what each added
// to its pre-filled buffers); nothing written where the parameters are fixed.
inline void expect_bf16_grads_match_cpu(const GpuRun& f, const Bf16Case& k, bool learn) {
    EXPECT_CLOSE(minus(f.dqkv, k.dqkv0), minus(k.dqkv, k.dqkv0), kBf16Tol);
    const BiasData& bd = k.bd;
    if (!bd.da.empty()) {
        EXPECT_CLOSE(minus(f.da, bd.da), minus(k.cb.da, bd.da), kBf16BiasTol);
    }
    if (!bd.db.empty()) {
        EXPECT_CLOSE(minus(f.db, bd.db), minus(k.cb.db, bd.db), kBf16BiasTol);
    }
    if (!bd.dtable.empty()) {
        EXPECT_CLOSE(minus(f.dtable, bd.dtable), minus(k.cb.dtable, bd.dtable), kBf16Tol);
    }
    if (!learn) {
        EXPECT_EQ(f.da, bd.da);
        EXPECT_EQ(f.db, bd.db);
        EXPECT_EQ(f.dtable, bd.dtable);
    }
}

// dq and the bias-parameter gradients of run x against ref's where the two sum the same terms in
// another order (what each added to the pre-filled buffers): dq within 1e-5 of its largest
// entry, the bias gradients within 1e-4 (sums that cancel).
inline void expect_dq_and_bias_grads_close(const GpuRun& x, const GpuRun& ref, const Bf16Case& k,
                                           int C) {
    const FVec dq0 = dqkv_cols(k.dqkv0, C, 0, C);
    EXPECT_CLOSE(minus(dqkv_cols(x.dqkv, C, 0, C), dq0), minus(dqkv_cols(ref.dqkv, C, 0, C), dq0),
                 1e-5);
    if (!k.bd.da.empty()) {
        EXPECT_CLOSE(minus(x.da, k.bd.da), minus(ref.da, k.bd.da), 1e-4);
    }
    if (!k.bd.db.empty()) {
        EXPECT_CLOSE(minus(x.db, k.bd.db), minus(ref.db, k.bd.db), 1e-4);
    }
}

}  // namespace
