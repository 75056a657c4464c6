// Optimizer, schedule, clipping and the training loop: closed forms, determinism, a loss curve.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstring>

#include "model/config_json.h"
#include "model/optimizer.h"
#include "model/trainer.h"
#include "model_fixtures.h"

namespace ctx {
namespace {

using test::cpu;
using test::make_pe;
using test::tiny_batch;
using test::tiny_config;

TEST(LearningRate, WarmupThenCosineToMinimum) {
    OptimizerConfig c;
    c.lr = 1.0f;
    c.min_lr = 0.1f;
    c.warmup_steps = 10;
    c.total_steps = 110;
    EXPECT_DOUBLE_EQ(learning_rate(c, 0), 0.1);   // (0+1)/10
    EXPECT_DOUBLE_EQ(learning_rate(c, 4), 0.5);
    EXPECT_DOUBLE_EQ(learning_rate(c, 9), 1.0);
    EXPECT_NEAR(learning_rate(c, 10), 1.0, 1e-7);  // cosine starts at the peak
    EXPECT_NEAR(learning_rate(c, 60), 0.1 + 0.45 * (1 + std::cos(M_PI * 0.5)), 1e-6);
    EXPECT_NEAR(learning_rate(c, 110), 0.1f, 1e-6);
    EXPECT_NEAR(learning_rate(c, 500), 0.1f, 1e-6);  // clamped after the end
    c.schedule = LrSchedule::Linear;
    EXPECT_NEAR(learning_rate(c, 35), 1.0 + (0.1 - 1.0) * 0.25, 1e-6);
    c.schedule = LrSchedule::Constant;
    EXPECT_DOUBLE_EQ(learning_rate(c, 77), 1.0);
}

TEST(OptimizerConfig, RejectsBadValuesByName) {
    OptimizerConfig c;
    c.beta2 = 1.0f;
    try {
        c.validate();
        FAIL();
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("beta2"), std::string::npos);
    }
}

// Found by tests/fuzz/checkpoint_config_fuzz: eps = 1e39 read as inf passed validate(), and the
// checkpoint then held "eps": null, which no longer loaded.
TEST(OptimizerConfig, RefusesNonFiniteValues) {
    for (const char* key : {"eps", "weight_decay", "grad_clip"}) {
        try {
            optimizer_config_from_json(nlohmann::json{{key, 1e39}});
            ADD_FAILURE() << key << " = 1e39 accepted";
        } catch (const Error& e) {
            EXPECT_NE(std::string(e.what()).find(std::string(key) + " must be "),
                      std::string::npos) << e.what();
            EXPECT_NE(std::string(e.what()).find("finite"), std::string::npos) << e.what();
        }
    }
}

// The first AdamW step from zero moments has a closed form: mhat = g, vhat = g^2, so
// p1 = p0 - lr * (g / (|g| + eps) + wd * p0)  (weight decay only on decayed views).
TEST(Optimizer, FirstStepMatchesClosedForm) {
    ModelConfig c = tiny_config();
    Model m(c, cpu(), make_pe("learned", c), 3);
    OptimizerConfig oc;
    oc.lr = 0.01f;
    oc.weight_decay = 0.1f;
    oc.grad_clip = 0.0f;
    oc.eps = 1e-8f;
    Optimizer opt(m, oc);
    BatchBuffers buf = tiny_batch(c.vocab_size);
    cpu().zero(m.grads().data(), m.grads().size());
    m.forward_backward(buf.batch(), 0.1f);
    std::vector<float> p0(m.params().data(), m.params().data() + m.params().size());
    std::vector<float> g(m.grads().data(), m.grads().data() + m.grads().size());
    opt.update();
    int checked = 0;
    for (const ParamView& v : m.layout().views()) {
        const double wd = v.weight_decay ? 0.1 : 0.0;
        for (size_t i = 0; i < v.numel; i += 7) {
            const size_t k = v.offset + i;
            const double expect = p0[k] - 0.01 * (g[k] / (std::fabs(g[k]) + 1e-8) + wd * p0[k]);
            EXPECT_NEAR(m.params().data()[k], expect, 1e-6) << v.name << "[" << i << "]";
            ++checked;
        }
    }
    EXPECT_GT(checked, 100);
    EXPECT_EQ(opt.step(), 1);
}

TEST(Optimizer, ClipsTheGlobalNormToTheLimit) {
    ModelConfig c = tiny_config();
    Model m(c, cpu(), make_pe("rope", c), 3);
    OptimizerConfig oc;
    oc.grad_clip = 0.05f;
    Optimizer opt(m, oc);
    cpu().zero(m.grads().data(), m.grads().size());
    m.forward_backward(tiny_batch(c.vocab_size).batch(), 0.1f);
    double sq = 0;  // independent norm
    for (size_t i = 0; i < m.grads().size(); ++i) sq += double(m.grads().data()[i]) * m.grads().data()[i];
    ASSERT_GT(std::sqrt(sq), 0.05);
    EXPECT_NEAR(opt.grad_norm(), std::sqrt(sq), 1e-5 * std::sqrt(sq));
    // the same model and batch, its gradients scaled in place by the clipping factor and
    // updated without clipping: the clipped update must be that one, bit for bit (the factor
    // is applied inside AdamW, AdamWParams::grad_scale, and the gradients are left as they are)
    Model ref(c, cpu(), make_pe("rope", c), 3);
    OptimizerConfig oc_ref = oc;
    oc_ref.grad_clip = 0.0f;
    Optimizer opt_ref(ref, oc_ref);
    cpu().zero(ref.grads().data(), ref.grads().size());
    ref.forward_backward(tiny_batch(c.vocab_size).batch(), 0.1f);
    const double norm = opt_ref.grad_norm();
    ASSERT_EQ(norm, opt.grad_norm());
    cpu().scale(ref.grads().data(), static_cast<float>(0.05 / (norm + 1e-6)), ref.grads().size());
    const std::vector<float> before(m.params().data(), m.params().data() + m.params().size());
    const auto info = opt.update();
    opt_ref.update();
    EXPECT_NEAR(info.grad_norm, std::sqrt(sq), 1e-5 * std::sqrt(sq));
    EXPECT_EQ(opt.grad_norm(), norm);  // the gradients themselves are not scaled
    const float *got = m.params().data(), *want = ref.params().data();
    size_t differ = 0;
    for (size_t i = 0; i < m.params().size(); ++i) differ += got[i] != want[i];
    EXPECT_EQ(differ, 0u) << "of " << m.params().size() << " parameters";
    size_t moved = 0;  // and the update did something
    for (size_t i = 0; i < before.size(); ++i) moved += got[i] != before[i];
    EXPECT_GT(moved, before.size() / 2);
}

std::vector<double> train_losses(uint64_t seed, int steps, std::vector<float>* params_out,
                                 Backend& be = cpu(), const char* pe = "learned") {
    ModelConfig c = tiny_config();
    c.vocab_size = 32;
    c.init_std = 0.02f;
    c.context_length = 32;
    c.d_model = 32;
    c.ffn_hidden = 64;
    Model m(c, be, make_pe(pe, c), seed);
    OptimizerConfig oc;
    oc.lr = 1e-2f;
    oc.warmup_steps = 5;
    oc.total_steps = steps;
    oc.weight_decay = 0.0f;
    Optimizer opt(m, oc);
    Rng data_rng(11);
    std::vector<int32_t> cycle(12), stream(2048);
    for (auto& t : cycle) t = static_cast<int32_t>(data_rng.below(32));
    for (size_t i = 0; i < stream.size(); ++i) stream[i] = cycle[i % cycle.size()];
    TokenStream batches(std::make_shared<TokenSource>(stream, 32), seed, 0);
    TrainOptions t;
    t.steps = steps;
    t.batch_size = 4;
    t.seq_len = 32;
    t.log_every = 0;
    auto comm = make_single_comm();
    const TrainResult r = train(m, opt, batches, t, *comm);
    if (params_out) params_out->assign(m.params().data(), m.params().data() + m.params().size());
    std::vector<double> losses;
    for (const auto& s : r.steps) losses.push_back(s.loss);
    return losses;
}

TEST(Training, SameSeedGivesBitIdenticalLossesAndParameters) {
    std::vector<float> pa, pb;
    const auto a = train_losses(7, 12, &pa);
    const auto b = train_losses(7, 12, &pb);
    ASSERT_EQ(a.size(), 12u);
    for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i], b[i]) << "step " << i + 1;
    ASSERT_EQ(pa.size(), pb.size());
    EXPECT_EQ(0, std::memcmp(pa.data(), pb.data(), pa.size() * sizeof(float)));
    const auto c = train_losses(8, 12, nullptr);
    EXPECT_NE(a.back(), c.back());  // another seed, another run
}

// The CPU backend's results do not depend on its thread count (OpenMP loops own disjoint
// outputs, reductions run in a fixed order, OpenBLAS splits products without splitting their
// sums): RoPE as well, whose rotation tables the backend caches across layers.
TEST(Training, OneAndTwoThreadsGiveBitIdenticalLossesAndParameters) {
    const int team = omp_get_max_threads();
    std::vector<float> p1, p2;
    std::vector<double> a, b;
    {
        auto one = make_cpu_backend(1);
        a = train_losses(5, 6, &p1, *one, "rope");
    }
    {
        auto two = make_cpu_backend(2);
        b = train_losses(5, 6, &p2, *two, "rope");
    }
    make_cpu_backend(team);  // back to the team the other tests use
    ASSERT_EQ(a.size(), 6u);
    for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i], b[i]) << "step " << i + 1;
    ASSERT_EQ(p1.size(), p2.size());
    EXPECT_EQ(0, std::memcmp(p1.data(), p2.data(), p1.size() * sizeof(float)));
}

TEST(Training, LossCurveFallsFromUniformOnAPeriodicSequence) {
    const auto losses = train_losses(3, 80, nullptr);
    // Starts at the uniform loss ln 32 = 3.466 and must learn the 12-token cycle.
    EXPECT_NEAR(losses.front(), std::log(32.0), 0.1);
    double first10 = 0, last10 = 0;
    for (int i = 0; i < 10; ++i) {
        first10 += losses[i] / 10;
        last10 += losses[losses.size() - 1 - i] / 10;
    }
    EXPECT_LT(last10, 0.3 * first10) << "first " << first10 << " last " << last10;
    for (double l : losses) EXPECT_TRUE(std::isfinite(l));
}

}  // namespace
}  // namespace ctx

namespace ctx {
namespace {

TEST(LearningRate, ScheduleStartsWhereTheOptimizerStands) {
    OptimizerConfig c;
    c.lr = 1.0f;
    c.min_lr = 0.0f;
    c.warmup_steps = 4;
    c.total_steps = 20;
    c.schedule_start = 500;  // a second training phase after 500 steps
    EXPECT_DOUBLE_EQ(learning_rate(c, 500), 0.25);
    EXPECT_DOUBLE_EQ(learning_rate(c, 503), 1.0);
    EXPECT_NEAR(learning_rate(c, 512), 0.5, 1e-12);  // cosine midpoint: (512-500-4)/16 = 0.5
    EXPECT_NEAR(learning_rate(c, 520), 0.0, 1e-12);
}

}  // namespace
}  // namespace ctx
