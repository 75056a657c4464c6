// The non-finite step policy of train() (skip_nonfinite): a step whose loss or gradient norm is
// not finite leaves parameters, moments and the optimizer's step as they were, up to N in a row;
// one more stops training with a clear error. NaN is injected through the PE: one row of the
// learned position table is NaN, and only batches at those positions read it.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "model/trainer.h"
#include "model_fixtures.h"

namespace ctx {
namespace {

// Batches of 2 rows x 6 tokens; batch k uses positions 6..11 (the NaN row 11) when poisoned(k).
class ScriptedSource final : public BatchSource {
public:
    explicit ScriptedSource(std::vector<bool> poisoned) : poisoned_(std::move(poisoned)) {}
    void next(BatchBuffers& out, int B, int T) override {
        out.resize(B, T);
        const bool bad = k_ < poisoned_.size() && poisoned_[k_];
        for (int i = 0; i < B * T; ++i) {
            out.tokens[i] = static_cast<int32_t>((i * 5 + 3 * k_) % 13);
            out.targets[i] = static_cast<int32_t>((i * 7 + 1 + k_) % 13);
            out.positions[i] = static_cast<float>(i % T + (bad ? 6 : 0));
            out.mask[i] = 1.0f;
        }
        ++k_;
    }
    void save(TrainingState&, Comm&) const override {}
    void restore(const TrainingState&, Comm&) override {}

private:
    std::vector<bool> poisoned_;
    size_t k_ = 0;
};

struct TrainedModel {
    std::unique_ptr<Model> model;
    std::unique_ptr<Optimizer> opt;
};

TrainedModel make_run() {
    ModelConfig c = test::tiny_config();  // context 12: positions 0..11
    TrainedModel r;
    r.model = std::make_unique<Model>(c, test::cpu(), test::make_pe("learned", c), 3);
    const ParamView& wpe = r.model->layout().view("pe.wpe");  // (12, C)
    float* row11 = r.model->params().at(wpe) + 11 * c.d_model;
    for (int d = 0; d < c.d_model; ++d) row11[d] = std::numeric_limits<float>::quiet_NaN();
    OptimizerConfig oc;
    oc.lr = 1e-2f;
    oc.weight_decay = 0.0f;  // the NaN row stays NaN either way; keep the rest comparable
    r.opt = std::make_unique<Optimizer>(*r.model, oc);
    return r;
}

TrainOptions options(int steps, int skip) {
    TrainOptions o;
    o.steps = steps;
    o.batch_size = 2;
    o.seq_len = 6;
    o.log_every = 0;
    o.skip_nonfinite = skip;
    return o;
}

TEST(TrainNonFinite, SkippedStepsLeaveTheStateAsIfTheirBatchesNeverCame) {
    auto comm = make_single_comm();
    // poisoned batches 1, 3, 4 (two in a row) among 7
    TrainedModel a = make_run();
    ScriptedSource mixed({false, true, false, true, true, false, false});
    const TrainResult r = train(*a.model, *a.opt, mixed, options(7, 2), *comm);
    EXPECT_EQ(r.skipped, 3);
    EXPECT_EQ(a.opt->step(), 4);
    ASSERT_EQ(r.steps.size(), 7u);
    EXPECT_TRUE(r.steps[1].skipped && r.steps[3].skipped && r.steps[4].skipped);
    EXPECT_FALSE(r.steps[0].skipped || r.steps[2].skipped || r.steps[5].skipped);
    EXPECT_EQ(r.steps[1].step, 2);  // the step its batch was for
    EXPECT_TRUE(std::isnan(r.steps[1].loss));

    // The same model trained on the four clean batches alone ends bit-identical (parameters,
    // moments, step): a skipped step changed nothing.
    TrainedModel b = make_run();
    // mixed's clean batches were its batches 0, 2, 5 and 6: replay exactly those
    struct Reindexed final : BatchSource {
        ScriptedSource inner{std::vector<bool>(7, false)};
        std::vector<int> take{0, 2, 5, 6};
        size_t i = 0;
        int drawn = 0;
        void next(BatchBuffers& out, int B, int T) override {
            while (drawn <= take[i]) {
                inner.next(out, B, T);
                ++drawn;
            }
            ++i;
        }
        void save(TrainingState&, Comm&) const override {}
        void restore(const TrainingState&, Comm&) override {}
    } replay;
    train(*b.model, *b.opt, replay, options(4, 0), *comm);
    const size_t P = a.model->layout().total();
    EXPECT_EQ(std::memcmp(a.model->params().data(), b.model->params().data(), P * 4), 0);
    std::vector<float> am, av, bm, bv;
    a.opt->gather_moments(am, av);
    b.opt->gather_moments(bm, bv);
    EXPECT_EQ(std::memcmp(am.data(), bm.data(), P * 4), 0);
    EXPECT_EQ(std::memcmp(av.data(), bv.data(), P * 4), 0);
    EXPECT_EQ(a.opt->step(), b.opt->step());
}

TEST(TrainNonFinite, TooManyInARowStopWithTheReason) {
    auto comm = make_single_comm();
    for (int skip : {0, 1}) {
        TrainedModel a = make_run();
        ScriptedSource src({false, true, true, false});
        try {
            train(*a.model, *a.opt, src, options(4, skip), *comm);
            ADD_FAILURE() << "trained through " << skip + 1 << " non-finite steps";
        } catch (const Error& e) {
            const std::string msg = e.what();
            EXPECT_NE(msg.find(fmt::format("{} non-finite step(s) in a row, skip_nonfinite = {}",
                                           skip + 1, skip)),
                      std::string::npos) << msg;
            EXPECT_NE(msg.find("training diverged"), std::string::npos) << msg;
        }
        EXPECT_EQ(a.opt->step(), 1);  // only the first, clean step updated
    }
}

}  // namespace
}  // namespace ctx
