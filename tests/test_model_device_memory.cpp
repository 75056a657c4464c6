// The model on a backend whose memory the host cannot read (tests/remote_backend.h): every path
// where host code (PE plugins: generic input and bias hooks, after_update, extend_params; the
// generator's generic bias) meets backend memory must stage it, or these tests fault. With the
// same arithmetic underneath, training, extension and generation must equal the CPU backend's
// bit for bit.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "model/generate.h"
#include "model/optimizer.h"
#include "model_fixtures.h"
#include "remote_backend.h"

namespace ctx {
namespace {

using test::OptionValue;

using test::PeCase;

using test::host_copy;

using test::bit_equal;

ModelConfig config() {
    ModelConfig c = test::tiny_config();
    c.context_length = 16;
    return c;
}

// n AdamW steps on the tiny batch; after_update (KERPLE's clamp) runs inside update().
void train_steps(Model& m, Optimizer& opt, int n) {
    const BatchBuffers buf = test::tiny_batch(m.config().vocab_size);
    for (int s = 0; s < n; ++s) {
        m.backend().zero(m.grads().data(), m.grads().size());
        m.forward_backward(buf.batch(), 0.1f);
        opt.update();
    }
}

// Sets every PE parameter to v (negative values make KERPLE's after_update clamp engage).
void set_pe_params(Model& m, float v) {
    for (const ParamView& pv : m.layout().views()) {
        if (pv.name.rfind("pe.", 0) != 0) continue;
        const std::vector<float> x(pv.numel, v);
        m.backend().copy_to_device(m.params().at(pv), x.data(), pv.numel);
    }
}

float min_pe_param(Model& m) {
    const std::vector<float> p = host_copy(m.backend(), m.params());
    float lo = 1e30f;
    for (const ParamView& pv : m.layout().views())
        if (pv.name.rfind("pe.", 0) == 0)
            for (size_t i = 0; i < pv.numel; ++i) lo = std::min(lo, p[pv.offset + i]);
    return lo;
}

OptimizerConfig adamw() {
    OptimizerConfig oc;
    oc.lr = 3e-2f;  // large: parameters move visibly, clamps engage
    oc.weight_decay = 0.1f;
    return oc;
}

class DeviceMemoryModel : public ::testing::TestWithParam<PeCase> {};

TEST_P(DeviceMemoryModel, TrainingAndGenerationEqualCpu) {
    const PeCase& pc = GetParam();
    const ModelConfig c = config();
    std::unique_ptr<Backend> cpu = make_cpu_backend(1);
    test::RemoteBackend remote(1);
    Model ref(c, *cpu, test::make_pe(pc.pe, c, pc.opts), 7);
    Model dev(c, remote, test::make_pe(pc.pe, c, pc.opts), 7);
    ASSERT_TRUE(bit_equal(host_copy(remote, dev.params()), host_copy(*cpu, ref.params())));

    const bool kerple = pc.pe.rfind("kerple", 0) == 0;
    if (kerple) {  // out of range, so the clamp in after_update has work to do
        set_pe_params(ref, -0.5f);
        set_pe_params(dev, -0.5f);
        ref.after_update();
        dev.after_update();
        // the clamp ran on the host copy of the device memory and was written back
        EXPECT_GT(min_pe_param(ref), 0.0f);
        EXPECT_GT(min_pe_param(dev), 0.0f);
        EXPECT_TRUE(bit_equal(host_copy(remote, dev.params()), host_copy(*cpu, ref.params())));
    }
    Optimizer opt_ref(ref, adamw()), opt_dev(dev, adamw());
    const int stages = remote.stages();
    train_steps(ref, opt_ref, 3);
    train_steps(dev, opt_dev, 3);
    EXPECT_EQ(remote.stages() - stages, 3) << "one batch upload per training pass";
    EXPECT_TRUE(bit_equal(host_copy(remote, dev.params()), host_copy(*cpu, ref.params())))
        << "parameters after 3 AdamW steps differ";
    EXPECT_TRUE(bit_equal(host_copy(remote, dev.grads()), host_copy(*cpu, ref.grads())))
        << "gradients of the last step differ";


    // Extension (learned tables are interpolated by extend_params) and more training.
    ref.extend(2 * c.context_length, &opt_ref.m(), &opt_ref.v());
    dev.extend(2 * c.context_length, &opt_dev.m(), &opt_dev.v());
    ASSERT_EQ(dev.layout().total(), ref.layout().total());
    EXPECT_TRUE(bit_equal(host_copy(remote, dev.params()), host_copy(*cpu, ref.params())))
        << "parameters after extend differ";
    train_steps(ref, opt_ref, 1);
    train_steps(dev, opt_dev, 1);
    EXPECT_TRUE(bit_equal(host_copy(remote, dev.params()), host_copy(*cpu, ref.params())))
        << "parameters after extend + 1 step differ";

    // Generation with a KV cache: prefill then decode, logits identical.
    KvGenerator g_ref(ref, 1, 12), g_dev(dev, 1, 12);
    const int32_t prompt[5] = {3, 1, 4, 1, 5};
    g_ref.prefill(0, prompt, nullptr, 5);
    g_dev.prefill(0, prompt, nullptr, 5);
    for (int step = 0; step < 3; ++step) {
        const int V = c.vocab_size;
        EXPECT_EQ(std::memcmp(g_ref.logits(0), g_dev.logits(0), V * sizeof(float)), 0)
            << "generation step " << step;
        const int32_t tok = static_cast<int32_t>(2 + step);
        const float pos = g_ref.last_position(0) + 1.0f;
        g_ref.decode(&tok, &pos);
        g_dev.decode(&tok, &pos);
    }
}

INSTANTIATE_TEST_SUITE_P(
    Pes, DeviceMemoryModel,
    ::testing::Values(PeCase{"none", {}}, PeCase{"learned", {}},
                      PeCase{"sinusoidal", {}},  // generic input hook
                      PeCase{"rope", {}}, PeCase{"alibi", {}},  // host slopes
                      PeCase{"kerple_log", {}}, PeCase{"kerple_power", {}},  // after_update
                      PeCase{"t5_bias", {}}, PeCase{"fire", {}}),  // generic bias
    [](const auto& info) { return info.param.pe; });

// The backend really does refuse host access: a model on it that skipped staging would fault,
// and an op handed host memory where the contract asks for device memory is an error.
TEST(DeviceMemoryBackend, RefusesHostPointersForDeviceArguments) {
    test::RemoteBackend remote(1);
    std::vector<float> host(8, 1.0f);
    EXPECT_THROW(remote.scale(host.data(), 2.0f, host.size()), Error);
    float* d = remote.alloc_floats(8);
    EXPECT_THROW(remote.copy_to_host(d, d, 8), Error);
    remote.copy_to_device(d, host.data(), 8);
    remote.scale(d, 2.0f, 8);
    std::vector<float> back(8);
    remote.copy_to_host(back.data(), d, 8);
    EXPECT_EQ(back[3], 2.0f);
    remote.free_floats(d);
}

}  // namespace
}  // namespace ctx
