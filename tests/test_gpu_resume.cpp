// Deterministic mode on the GPU (issue 8): with no atomics in any kernel and cuBLAS on one stream,
// training on the CUDA backend is bit-for-bit repeatable, and a run resumed from its saved state
// (parameters, AdamW moments, step) continues exactly as the uninterrupted run, in fp32 and in
// bf16 mixed precision, with flash and materialised attention. Skipped without a CUDA device.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "model/optimizer.h"
#include "model_fixtures.h"

namespace ctx {
namespace {

struct ResumeCase {
    Precision precision;
    AttentionChoice attention;
    std::string pe;
};
void PrintTo(const ResumeCase& c, std::ostream* os) {
    *os << precision_name(c.precision) << "_" << attention_choice_name(c.attention) << "_" << c.pe;
}

Backend& gpu(Precision p) {
    static std::unique_ptr<Backend> fp32, bf16;
    std::unique_ptr<Backend>& be = p == Precision::Bf16 ? bf16 : fp32;
    if (!be) be = make_cuda_backend(0, p);
    return *be;
}

using test::host_copy;

using test::bit_equal;

ModelConfig config() {
    ModelConfig c = test::tiny_config();
    c.d_model = 64;
    c.n_head = 2;
    c.vocab_size = 67;
    c.context_length = 64;
    return c;
}

// Step s's rows: the tiny batch with tokens shifted by s, so every step differs.
BatchBuffers batch_for_step(int s, int vocab) {
    BatchBuffers b = test::tiny_batch(vocab);
    for (auto& t : b.tokens) t = (t + 3 * s) % vocab;
    return b;
}

void run_steps(Model& m, Optimizer& opt, int from, int to) {
    for (int s = from; s < to; ++s) {
        const BatchBuffers buf = batch_for_step(s, m.config().vocab_size);
        m.backend().zero(m.grads().data(), m.grads().size());
        m.forward_backward(buf.batch(), 0.05f);
        opt.update();
    }
}

OptimizerConfig adamw() {
    OptimizerConfig oc;
    oc.lr = 1e-2f;
    oc.warmup_steps = 2;
    oc.total_steps = 6;
    return oc;
}

class OpsGpuResume : public ::testing::TestWithParam<ResumeCase> {};

TEST_P(OpsGpuResume, RepeatsAndResumesBitForBit) {
    if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device visible (cuda_device_count() == 0)";
    const ResumeCase& rc = GetParam();
    Backend& be = gpu(rc.precision);
    const ModelConfig c = config();
    auto make = [&](uint64_t seed) {
        auto m = std::make_unique<Model>(c, be, test::make_pe(rc.pe, c), seed);
        m->set_attention_choice(rc.attention);
        return m;
    };

    // The uninterrupted run, twice.
    auto a = make(11), a2 = make(11);
    Optimizer opt_a(*a, adamw()), opt_a2(*a2, adamw());
    run_steps(*a, opt_a, 0, 6);
    run_steps(*a2, opt_a2, 0, 6);
    EXPECT_TRUE(bit_equal(host_copy(be, a->params()), host_copy(be, a2->params())))
        << "two identical runs differ";

    // Interrupted after 3 steps; the state moves (through host memory, as a checkpoint does)
    // into a model initialised differently, which continues.
    auto b = make(11);
    Optimizer opt_b(*b, adamw());
    run_steps(*b, opt_b, 0, 3);
    const std::vector<float> p = host_copy(be, b->params()), m = host_copy(be, opt_b.m()),
                             v = host_copy(be, opt_b.v());
    auto r = make(99);
    Optimizer opt_r(*r, adamw());
    be.copy_to_device(r->params().data(), p.data(), p.size());
    be.copy_to_device(opt_r.m().data(), m.data(), m.size());
    be.copy_to_device(opt_r.v().data(), v.data(), v.size());
    opt_r.set_step(opt_b.step());
    run_steps(*r, opt_r, 3, 6);
    EXPECT_TRUE(bit_equal(host_copy(be, r->params()), host_copy(be, a->params())))
        << "the resumed run's parameters differ from the uninterrupted run's";
    EXPECT_TRUE(bit_equal(host_copy(be, opt_r.m()), host_copy(be, opt_a.m())));
    EXPECT_TRUE(bit_equal(host_copy(be, opt_r.v()), host_copy(be, opt_a.v())));
}

std::vector<ResumeCase> cases() {
    std::vector<ResumeCase> out;
    for (Precision p : {Precision::Fp32, Precision::Bf16})
        for (AttentionChoice a : {AttentionChoice::Flash, AttentionChoice::Materialised})
            for (const char* pe : {"rope", "alibi", "kerple_log"}) out.push_back({p, a, pe});
    return out;
}

INSTANTIATE_TEST_SUITE_P(Modes, OpsGpuResume, ::testing::ValuesIn(cases()), [](const auto& info) {
    const ResumeCase& c = info.param;
    return std::string(precision_name(c.precision)) + "_" + attention_choice_name(c.attention) +
           "_" + c.pe;
});

}  // namespace
}  // namespace ctx
