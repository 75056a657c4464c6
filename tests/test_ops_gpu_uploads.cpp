// Host-to-device copies through the CUDA backend's page-locked upload ring (cuda_upload.h): many
// uploads with no synchronisation between them, more than the ring holds, each from a host
// buffer that is overwritten right after the call, arrive intact; so does one too large for the
// ring (pageable path). Under the emulator's CTX_EMU_STREAM=deferred the copies run only at the
// final synchronisation, so a ring span reused before its copy had run would arrive with a later
// upload's data (the test fails if the ring's wait is removed); run_emulated_tests.py runs it in
// both stream modes.
//
// Skipped without a CUDA device.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "gpu_test_support.h"

namespace {

TEST(OpsGpuUploads, ManyUploadsWithoutASyncArriveIntact) {
    if (!have_gpu()) GTEST_SKIP() << "no CUDA device visible (cuda_device_count() == 0)";
    ctx::Backend& be = gpu();
    // 40 uploads of 96 KiB: 3.75 MiB, past the ring's first 1 MiB (it grows to 4x an upload,
    // so spans are reused within this loop), plus one of 17 MiB (over the ring's 16 MiB limit).
    const size_t n = 24 * 1024, count = 40, big = size_t(17) << 18;
    std::vector<float*> dev;
    for (size_t i = 0; i <= count; ++i) dev.push_back(be.alloc_floats(i < count ? n : big));
    std::vector<float> host(big);
    auto fill = [&](size_t i, size_t len) {
        for (size_t j = 0; j < len; ++j) host[j] = float(i * 1000003 + j % 65521);
    };
    for (size_t i = 0; i < count; ++i) {
        fill(i, n);
        be.copy_to_device(dev[i], host.data(), n);
    }
    fill(count, big);
    be.copy_to_device(dev[count], host.data(), big);
    host.assign(big, -1.0f);  // the source is reused at once (the ring copied it)
    std::vector<float> got(big);
    for (size_t i = 0; i <= count; ++i) {
        const size_t len = i < count ? n : big;
        be.copy_to_host(got.data(), dev[i], len);
        size_t bad = 0;
        for (size_t j = 0; j < len; ++j) bad += got[j] != float(i * 1000003 + j % 65521);
        EXPECT_EQ(bad, 0u) << "upload " << i << " of " << len << " floats";
    }
    for (float* p : dev) be.free_floats(p);
}

}  // namespace
