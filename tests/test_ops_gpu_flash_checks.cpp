// Flash attention on the CUDA backend, its contract: which modes a shape supports and which the
// backend picks (auto), the saved and scratch sizes, the refusals (head dim > 128 in flash mode
// only, missing out or lse, unknown modes, bad options) with messages that name what was wrong,
// and the CTX_FLASH_* switches that choose the tensor-core kernels (FlashTcKernels), shown in the
// backend's name and refused with the values they take. The kernels' numbers are tested in
// test_ops_gpu_flash.cpp.
//
// Only the Backend interface is used, so this compiles in every build; every test skips
// (GTEST_SKIP) when no CUDA device is visible, including builds without CUDA. Label "gpu".
#include <gtest/gtest.h>

#include <cstdlib>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/error.h"
#include "flash_gpu_support.h"  // REQUIRE_GPU
#include "gpu_test_support.h"
#include "op_reference.h"

namespace {

using ctx::AttentionMode;

// ================================================================ the mode contract

TEST(OpsGpuFlashChecks, ModeSupportAndAuto) {
    REQUIRE_GPU();
    // materialised: any head dim; flash: C divisible by H and C / H <= 128
    EXPECT_TRUE(gpu().attention_mode_supported(AttentionMode::Materialised, 512, 2));
    EXPECT_TRUE(gpu().attention_mode_supported(AttentionMode::Materialised, 16, 2));
    EXPECT_TRUE(gpu().attention_mode_supported(AttentionMode::Flash, 256, 2));   // 128
    EXPECT_TRUE(gpu().attention_mode_supported(AttentionMode::Flash, 160, 2));   // 80
    EXPECT_TRUE(gpu().attention_mode_supported(AttentionMode::Flash, 768, 12));  // 64
    EXPECT_TRUE(gpu().attention_mode_supported(AttentionMode::Flash, 18, 3));    // 6
    EXPECT_FALSE(gpu().attention_mode_supported(AttentionMode::Flash, 258, 2));  // 129
    EXPECT_FALSE(gpu().attention_mode_supported(AttentionMode::Flash, 512, 2));  // 256
    EXPECT_FALSE(gpu().attention_mode_supported(AttentionMode::Flash, 10, 3));   // not divisible
    EXPECT_FALSE(gpu().attention_mode_supported(AttentionMode(7), 256, 2));
    // auto: flash wherever the kernels handle the head dim, at every T
    EXPECT_EQ(gpu().attention_mode_auto(1, 256, 2), AttentionMode::Flash);
    EXPECT_EQ(gpu().attention_mode_auto(4096, 768, 12), AttentionMode::Flash);
    EXPECT_EQ(gpu().attention_mode_auto(64, 512, 2), AttentionMode::Materialised);
    EXPECT_EQ(gpu().attention_mode_auto(64, 258, 2), AttentionMode::Materialised);
}

// CTX_FLASH_BACKWARD picks the tensor-core backward's kernels when the backend is made: the
// backend's name says "atomic dq" in bf16 (the fp32 kernels have one form: nothing to say), and
// any other value is refused naming the variable and the value.
TEST(OpsGpuFlashChecks, BackwardKernelsSwitch) {
    REQUIRE_GPU();
    EXPECT_NE(gpu_bf16_atomic_dq().name().find("atomic dq"), std::string::npos)
        << gpu_bf16_atomic_dq().name();
    EXPECT_EQ(gpu_bf16().name().find("atomic dq"), std::string::npos) << gpu_bf16().name();
    setenv("CTX_FLASH_BACKWARD", "atomic", 1);
    const std::string fp32_name = ctx::make_cuda_backend(0)->name();
    setenv("CTX_FLASH_BACKWARD", "split", 1);
    const std::string split_name = ctx::make_cuda_backend(0, ctx::Precision::Bf16)->name();
    setenv("CTX_FLASH_BACKWARD", "fused", 1);
    expect_error([] { (void)ctx::make_cuda_backend(0, ctx::Precision::Bf16); },
                 {"CTX_FLASH_BACKWARD", "fused", "split", "atomic"});
    unsetenv("CTX_FLASH_BACKWARD");
    // the forward's m-tiles per warp likewise (CTX_FLASH_FORWARD_MTILES: 2 or 1)
    EXPECT_NE(gpu_bf16_one_mtile().name().find("1 m-tile forward"), std::string::npos)
        << gpu_bf16_one_mtile().name();
    EXPECT_EQ(gpu_bf16().name().find("m-tile"), std::string::npos) << gpu_bf16().name();
    setenv("CTX_FLASH_FORWARD_MTILES", "3", 1);
    expect_error([] { (void)ctx::make_cuda_backend(0, ctx::Precision::Bf16); },
                 {"CTX_FLASH_FORWARD_MTILES", "'3'", "2", "1"});
    unsetenv("CTX_FLASH_FORWARD_MTILES");
    // and the forward's instruction (CTX_FLASH_FORWARD: mma or wgmma)
    EXPECT_NE(gpu_bf16_wgmma_forward().name().find("wgmma forward"), std::string::npos)
        << gpu_bf16_wgmma_forward().name();
    EXPECT_EQ(gpu_bf16().name().find("wgmma"), std::string::npos) << gpu_bf16().name();
    setenv("CTX_FLASH_FORWARD", "tma", 1);
    expect_error([] { (void)ctx::make_cuda_backend(0, ctx::Precision::Bf16); },
                 {"CTX_FLASH_FORWARD", "'tma'", "mma", "wgmma"});
    unsetenv("CTX_FLASH_FORWARD");
    EXPECT_NE(gpu_bf16_wgmma_dq().name().find("wgmma dq"), std::string::npos)
        << gpu_bf16_wgmma_dq().name();
    setenv("CTX_FLASH_DQ", "1", 1);
    expect_error([] { (void)ctx::make_cuda_backend(0, ctx::Precision::Bf16); },
                 {"CTX_FLASH_DQ", "'1'", "mma", "wgmma"});
    unsetenv("CTX_FLASH_DQ");
    EXPECT_NE(gpu_bf16_wgmma_dkv().name().find("wgmma dk/dv"), std::string::npos)
        << gpu_bf16_wgmma_dkv().name();
    EXPECT_EQ(gpu_bf16_wgmma_dkv().name().find("wgmma dq"), std::string::npos)
        << gpu_bf16_wgmma_dkv().name();
    setenv("CTX_FLASH_DKV", "on", 1);
    expect_error([] { (void)ctx::make_cuda_backend(0, ctx::Precision::Bf16); },
                 {"CTX_FLASH_DKV", "'on'", "mma", "wgmma"});
    unsetenv("CTX_FLASH_DKV");
    EXPECT_NE(gpu_bf16_wgmma_all_one_warpgroup().name().find("1-warpgroup wgmma blocks"),
              std::string::npos)
        << gpu_bf16_wgmma_all_one_warpgroup().name();
    EXPECT_EQ(gpu_bf16_wgmma_all().name().find("warpgroup"), std::string::npos)
        << gpu_bf16_wgmma_all().name();
    setenv("CTX_FLASH_WGMMA_WARPGROUPS", "4", 1);
    expect_error([] { (void)ctx::make_cuda_backend(0, ctx::Precision::Bf16); },
                 {"CTX_FLASH_WGMMA_WARPGROUPS", "'4'", "2", "1"});
    unsetenv("CTX_FLASH_WGMMA_WARPGROUPS");
    EXPECT_NE(gpu_bf16_wgmma_producer(2).name().find("with a producer warpgroup"),
              std::string::npos)
        << gpu_bf16_wgmma_producer(2).name();
    EXPECT_EQ(gpu_bf16_wgmma_all().name().find("producer"), std::string::npos)
        << gpu_bf16_wgmma_all().name();
    EXPECT_NE(gpu_bf16_wgmma_producer(2, true).name().find("(tiles by TMA)"), std::string::npos)
        << gpu_bf16_wgmma_producer(2, true).name();
    EXPECT_EQ(gpu_bf16_wgmma_producer(2).name().find("TMA"), std::string::npos)
        << gpu_bf16_wgmma_producer(2).name();
    setenv("CTX_FLASH_WGMMA_LOADS", "bulk", 1);
    expect_error([] { (void)ctx::make_cuda_backend(0, ctx::Precision::Bf16); },
                 {"CTX_FLASH_WGMMA_LOADS", "'bulk'", "cp.async", "tma"});
    unsetenv("CTX_FLASH_WGMMA_LOADS");
    {  // the wgmma forward's KERPLE-log from tables (the default) or computed
        const auto computed = make_bf16_backend_with(
            {{"CTX_FLASH_FORWARD", "wgmma"}, {"CTX_FLASH_FORWARD_KERPLE", "computed"}});
        EXPECT_NE(computed->name().find("forward's KERPLE-log computed"), std::string::npos)
            << computed->name();
        EXPECT_EQ(gpu_bf16_wgmma_forward().name().find("KERPLE"), std::string::npos)
            << gpu_bf16_wgmma_forward().name();
        setenv("CTX_FLASH_FORWARD_KERPLE", "table", 1);
        expect_error([] { (void)ctx::make_cuda_backend(0, ctx::Precision::Bf16); },
                     {"CTX_FLASH_FORWARD_KERPLE", "'table'", "tables", "computed"});
        unsetenv("CTX_FLASH_FORWARD_KERPLE");
    }
    {  // the one-kernel backward's dq four columns an atomic (the default) or one an entry
        const auto scalar = make_bf16_backend_with(
            {{"CTX_FLASH_BACKWARD", "atomic"}, {"CTX_FLASH_DQ_ATOMICS", "scalar"}});
        EXPECT_NE(scalar->name().find("atomic dq (scalar atomics)"), std::string::npos)
            << scalar->name();
        EXPECT_EQ(gpu_bf16_atomic_dq().name().find("scalar atomics"), std::string::npos)
            << gpu_bf16_atomic_dq().name();
        setenv("CTX_FLASH_DQ_ATOMICS", "vector", 1);
        expect_error([] { (void)ctx::make_cuda_backend(0, ctx::Precision::Bf16); },
                     {"CTX_FLASH_DQ_ATOMICS", "'vector'", "quad", "scalar"});
        unsetenv("CTX_FLASH_DQ_ATOMICS");
    }
    setenv("CTX_FLASH_WGMMA_PIPELINE", "tma", 1);
    expect_error([] { (void)ctx::make_cuda_backend(0, ctx::Precision::Bf16); },
                 {"CTX_FLASH_WGMMA_PIPELINE", "'tma'", "lockstep", "producer"});
    unsetenv("CTX_FLASH_WGMMA_PIPELINE");
    EXPECT_EQ(fp32_name.find("atomic dq"), std::string::npos) << fp32_name;
    EXPECT_EQ(split_name, gpu_bf16().name());
}

// Flash memory grows as T: saved = lse (B, H, T), and in bf16 the packed q, k, v after it (3 x
// B x H x T padded to 128 x the head dim padded to the kernel's, in bf16: 2 per float; 4 floats
// of room to align them); scratch = rowsum(dout * out) (B, H, T) plus the bias-gradient partials
// (B, H, ceil(T / 32), 512); no (T, T) term, unlike the materialised mode. Only the bf16 flash
// backward does without qkv.
TEST(OpsGpuFlashChecks, SavedAndScratchGrowLinearlyInT) {
    REQUIRE_GPU();
    const int B = 4, C = 768, H = 12;
    for (AttentionMode m : {AttentionMode::Materialised, AttentionMode::Flash})
        EXPECT_TRUE(gpu().attention_backward_reads_qkv(m)) << int(m);
    EXPECT_TRUE(gpu_bf16().attention_backward_reads_qkv(AttentionMode::Materialised));
    EXPECT_FALSE(gpu_bf16().attention_backward_reads_qkv(AttentionMode::Flash));
    for (int T : {1, 31, 32, 33, 1024, 8192}) {
        const size_t chunks = size_t(T + 31) / 32, lse = size_t(B) * H * T;
        EXPECT_EQ(ctx::attention_saved_floats(AttentionMode::Flash, B, T, H), lse);
        EXPECT_EQ(gpu().attention_saved_floats(AttentionMode::Flash, B, T, C, H), lse);
        const size_t Tp = (size_t(T) + 127) / 128 * 128;
        EXPECT_EQ(gpu_bf16().attention_saved_floats(AttentionMode::Flash, B, T, C, H),
                  lse + 4 + 3 * size_t(B) * H * Tp * 64 / 2)
            << T;
        EXPECT_EQ(gpu_bf16().attention_saved_floats(AttentionMode::Flash, B, T, 12 * 80, H),
                  lse + 4 + 3 * size_t(B) * H * Tp * 80 / 2)
            << T;
        EXPECT_EQ(gpu_bf16().attention_saved_floats(AttentionMode::Materialised, B, T, C, H),
                  lse * size_t(T));
        EXPECT_EQ(gpu().attention_scratch_floats(B, T, C, H, AttentionMode::Flash),
                  size_t(B) * H * T + size_t(B) * H * chunks * 512)
            << T;
        EXPECT_EQ(gpu().attention_scratch_floats(B, T, C, H, AttentionMode::Materialised),
                  size_t(H) * T * T + size_t(B) * H * chunks * 512)
            << T;
    }
}

TEST(OpsGpuFlashChecks, HeadDimAbove128IsRefusedInFlashModeOnly) {
    REQUIRE_GPU();
    const int B = 1, T = 3, C = 512, H = 2;  // head dim 256
    ref::Rng rng(5);
    const FVec positions = make_positions(rng, B, T, kContiguous);
    const FVec qkv = randn(rng, size_t(B) * T * 3 * C), dout = randn(rng, size_t(B) * T * C);
    Dev gqkv(qkv), gpos(positions), gdout(dout), gout(size_t(B) * T * C), gdqkv(qkv.size()),
        lse(size_t(B) * H * T), scratch(1 << 16);
    ctx::AttentionOptions o;
    o.mode = AttentionMode::Flash;
    const std::initializer_list<const char*> said = {"flash", "head dims up to 128", "head dim 256",
                                                     "materialised"};
    expect_error([&] { gpu().attention_scratch_floats(B, T, C, H, o.mode); }, said);
    expect_error(
        [&] {
            gpu().attention_forward(gout.get(), lse.get(), gqkv.get(), gpos.get(), B, T, C, H, o);
        },
        said);
    expect_error(
        [&] {
            gpu().attention_backward(gdqkv.get(), scratch.get(), gdout.get(), gqkv.get(), lse.get(),
                                     gout.get(), gpos.get(), B, T, C, H, o);
        },
        said);
    EXPECT_EQ(gdqkv.host(), FVec(qkv.size(), 0.0f));  // refused before anything ran

    // the same shape in materialised mode runs and matches the CPU backend
    o.mode = AttentionMode::Materialised;
    FVec out(size_t(B) * T * C), att(size_t(B) * H * T * T), dqkv(qkv.size(), 0.0f);
    cpu().attention_forward(out.data(), att.data(), qkv.data(), positions.data(), B, T, C, H, o);
    FVec cscratch(cpu().attention_scratch_floats(B, T, C, H, o.mode));
    cpu().attention_backward(dqkv.data(), cscratch.data(), dout.data(), qkv.data(), att.data(),
                             nullptr, positions.data(), B, T, C, H, o);
    Dev gatt(att.size()), gscratch(gpu().attention_scratch_floats(B, T, C, H, o.mode));
    gpu().attention_forward(gout.get(), gatt.get(), gqkv.get(), gpos.get(), B, T, C, H, o);
    gpu().attention_backward(gdqkv.get(), gscratch.get(), gdout.get(), gqkv.get(), gatt.get(),
                             nullptr, gpos.get(), B, T, C, H, o);
    EXPECT_CLOSE(gout.host(), out, kFwdTol);
    EXPECT_CLOSE(gdqkv.host(), dqkv, kGradTol);
}

TEST(OpsGpuFlashChecks, BackwardNeedsOutAndLseInFlashMode) {
    REQUIRE_GPU();
    const int B = 1, T = 4, C = 8, H = 2;
    Dev qkv(size_t(B) * T * 3 * C), out(size_t(B) * T * C), lse(size_t(B) * H * T), pos(T),
        dout(size_t(B) * T * C), dqkv(size_t(B) * T * 3 * C),
        scratch(gpu().attention_scratch_floats(B, T, C, H, AttentionMode::Flash));
    ctx::AttentionOptions o;
    o.mode = AttentionMode::Flash;
    gpu().attention_forward(out.get(), lse.get(), qkv.get(), pos.get(), B, T, C, H, o);
    expect_error(
        [&] {
            gpu().attention_backward(dqkv.get(), scratch.get(), dout.get(), qkv.get(), lse.get(),
                                     nullptr, pos.get(), B, T, C, H, o);
        },
        {"attention_backward", "flash", "output `out`"});
    expect_error(
        [&] {
            gpu().attention_backward(dqkv.get(), scratch.get(), dout.get(), qkv.get(), nullptr,
                                     out.get(), pos.get(), B, T, C, H, o);
        },
        {"attention_backward", "flash", "lse"});
    expect_error(
        [&] {  // the fp32 kernels read qkv in the backward
            gpu().attention_backward(dqkv.get(), scratch.get(), dout.get(), nullptr, lse.get(),
                                     out.get(), pos.get(), B, T, C, H, o);
        },
        {"attention_backward", "flash", "qkv"});
}

TEST(OpsGpuFlashChecks, UnknownModeIsRefused) {
    REQUIRE_GPU();
    const int B = 1, T = 2, C = 8, H = 2;
    Dev buf(size_t(B) * T * 3 * C * 4);
    ctx::AttentionOptions o;
    o.mode = AttentionMode(7);
    expect_error([&] { gpu().attention_scratch_floats(B, T, C, H, o.mode); },
                 {"unknown attention mode 7"});
    expect_error(
        [&] { gpu().attention_forward(buf.get(), buf.get(), buf.get(), buf.get(), B, T, C, H, o); },
        {"attention_forward", "unknown attention mode 7"});
    expect_error(
        [&] {
            gpu().attention_backward(buf.get(), buf.get(), buf.get(), buf.get(), buf.get(),
                                     buf.get(), buf.get(), B, T, C, H, o);
        },
        {"attention_backward", "unknown attention mode 7"});
}

// The op contract's argument checks apply in flash mode as in the materialised one.
TEST(OpsGpuFlashChecks, BadOptionsAreRefused) {
    REQUIRE_GPU();
    const int B = 1, T = 3, C = 8, H = 2;
    Dev qkv(size_t(B) * T * 3 * C), out(size_t(B) * T * C), lse(size_t(B) * H * T), pos(T);
    auto forward_shape = [&](const ctx::AttentionOptions& o, int t, int c) {
        gpu().attention_forward(out.get(), lse.get(), qkv.get(), pos.get(), B, t, c, H, o);
    };
    auto forward = [&](const ctx::AttentionOptions& o) { forward_shape(o, T, C); };
    ctx::AttentionOptions opt;
    opt.mode = AttentionMode::Flash;
    expect_error([&] { forward_shape(opt, T, 9); }, {"not divisible"});  // 9 channels, 2 heads
    expect_error([&] { forward_shape(opt, 0, C); }, {"T must be >= 1"});
    opt.window = -1;
    expect_error([&] { forward(opt); }, {"window"});
    opt.window = 0;
    opt.bias.kind = ctx::BiasKind::Table;  // no table
    expect_error([&] { forward(opt); }, {"Table"});
    FVec host_table(size_t(B) * H * T * T);
    opt.bias.table = host_table.data();  // the Table bias must be device memory
    expect_error([&] { forward(opt); }, {"device memory"});
    opt.bias = {};
    opt.bias.kind = ctx::BiasKind::T5;
    Dev a(size_t(H) * 1024);
    opt.bias.a = a.get();
    opt.bias.num_buckets = 1024;  // more than the backends allow
    expect_error([&] { forward(opt); }, {"num_buckets"});
}

}  // namespace
