// The model in flash attention mode (saves the (B, H, T) log-sum-exp, recomputes probabilities
// in backward) against the materialised mode (saves the (B, H, T, T) probabilities) on the CPU
// backend: the same losses and gradients for every PE family, with and without the windowed
// control; the mode choice and its refusals; and the backward pass's grad-ready ranges, which
// data-parallel reducers start summing early.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "model_fixtures.h"
#include "remote_backend.h"

namespace ctx {
namespace {

using test::OptionValue;

using test::PeCase;

using test::host_copy;

ModelConfig config() {
    ModelConfig c = test::tiny_config();
    c.d_model = 32;
    c.n_head = 2;  // head dim 16
    c.context_length = 128;  // the learned table covers the batch's positions
    return c;
}

// Rows of 70 tokens: more than one 64-row block of the CPU kernels, gapped positions.
BatchBuffers long_batch(int vocab) {
    BatchBuffers b;
    const int B = 2, T = 70;
    b.resize(B, T);
    for (int i = 0; i < B * T; ++i) {
        const int t = i % T;
        b.tokens[i] = (i * 7 + 3) % vocab;
        b.targets[i] = (i * 5 + 1) % vocab;
        b.positions[i] = i < T ? 0.5f * float(t) + (t > 30 ? 4.25f : 0.0f) : float(t);
        b.mask[i] = (i % 11 == 4) ? 0.0f : 1.0f;
    }
    return b;
}

// max |got - want| per parameter view, relative to the view's largest |want| (at least 1e-3:
// some gradients are zero in exact arithmetic, e.g. FIRE's output bias under the softmax).
void expect_views_close(const Model& m, const std::vector<float>& got,
                        const std::vector<float>& want, double tol) {
    for (const ParamView& v : m.layout().views()) {
        double err = 0, mag = 0;
        for (size_t i = v.offset; i < v.offset + v.numel; ++i) {
            err = std::max(err, std::fabs(double(got[i]) - double(want[i])));
            mag = std::max(mag, std::fabs(double(want[i])));
        }
        EXPECT_LE(err, tol * std::max(mag, 1e-3)) << v.name;
    }
}

class FlashModel : public ::testing::TestWithParam<std::pair<PeCase, int>> {};

TEST_P(FlashModel, LossesAndGradientsMatchMaterialised) {
    const auto& [pc, window] = GetParam();
    const ModelConfig c = config();
    Backend& cpu = test::cpu();
    Model mat(c, cpu, test::make_pe(pc.pe, c, pc.opts), 5);
    Model fl(c, cpu, test::make_pe(pc.pe, c, pc.opts), 5);
    mat.set_attention_choice(AttentionChoice::Materialised);
    fl.set_attention_choice(AttentionChoice::Flash);
    ASSERT_EQ(mat.attention_mode(), AttentionMode::Materialised);
    ASSERT_EQ(fl.attention_mode(), AttentionMode::Flash);
    mat.set_attention_window(window);
    fl.set_attention_window(window);

    const BatchBuffers buf = long_batch(c.vocab_size);
    const LossSums f_mat = mat.forward(buf.batch()), f_fl = fl.forward(buf.batch());
    EXPECT_NEAR(f_fl.loss_sum, f_mat.loss_sum, 1e-5 * std::fabs(f_mat.loss_sum));

    cpu.zero(mat.grads().data(), mat.grads().size());
    cpu.zero(fl.grads().data(), fl.grads().size());
    const LossSums b_mat = mat.forward_backward(buf.batch(), 0.01f);
    const LossSums b_fl = fl.forward_backward(buf.batch(), 0.01f);
    EXPECT_NEAR(b_fl.loss_sum, b_mat.loss_sum, 1e-5 * std::fabs(b_mat.loss_sum));
    for (size_t i = 0; i < buf.mask.size(); ++i)
        EXPECT_NEAR(fl.losses()[i], mat.losses()[i], 1e-5) << "token " << i;
    expect_views_close(mat, host_copy(cpu, fl.grads()), host_copy(cpu, mat.grads()), 1e-4);
}

const std::vector<PeCase> kPes = {
    {"none", {}},           {"learned", {}},      {"sinusoidal", {}},
    {"rope", {}},           {"alibi", {}},        {"kerple_log", {}},
    {"kerple_power", {}},   {"t5_bias", {}},      {"fire", {}},  // fire: the generic Table bias
};

std::vector<std::pair<PeCase, int>> cases() {
    std::vector<std::pair<PeCase, int>> out;
    for (const PeCase& p : kPes) out.emplace_back(p, 0);
    for (const char* pe : {"rope", "alibi", "fire"}) out.emplace_back(PeCase{pe, {}}, 24);
    return out;
}

INSTANTIATE_TEST_SUITE_P(Pes, FlashModel, ::testing::ValuesIn(cases()), [](const auto& info) {
    return info.param.first.pe + (info.param.second ? "_window" : "");
});

TEST(AttentionChoice, NamesAndAuto) {
    EXPECT_EQ(attention_choice_from_name("flash"), AttentionChoice::Flash);
    EXPECT_EQ(attention_choice_from_name("materialised"), AttentionChoice::Materialised);
    EXPECT_EQ(attention_choice_from_name("auto"), AttentionChoice::Auto);
    EXPECT_THROW(attention_choice_from_name("fast"), Error);
    const ModelConfig c = config();
    Model m(c, test::cpu(), nullptr, 1);
    // The CPU backend's preference is the materialised (BLAS) path.
    EXPECT_EQ(m.attention_choice(), AttentionChoice::Auto);
    EXPECT_EQ(m.attention_mode(), test::cpu().attention_mode_auto(c.context_length, c.d_model,
                                                                  c.n_head));
}

// A backend without flash attention: asking for it names the backend, the mode and the head dim.
class NoFlashBackend : public test::RemoteBackend {
public:
    bool attention_mode_supported(AttentionMode m, int, int) const override {
        return m == AttentionMode::Materialised;
    }
};

TEST(AttentionChoice, RefusesAModeTheBackendLacks) {
    NoFlashBackend be;
    const ModelConfig c = config();
    Model m(c, be, nullptr, 1);
    try {
        m.set_attention_choice(AttentionChoice::Flash);
        FAIL() << "flash was accepted";
    } catch (const Error& e) {
        const std::string msg = e.what();
        EXPECT_NE(msg.find("flash"), std::string::npos) << msg;
        EXPECT_NE(msg.find("head dim 16"), std::string::npos) << msg;
        EXPECT_NE(msg.find("remote(cpu)"), std::string::npos) << msg;
    }
    EXPECT_EQ(m.attention_mode(), AttentionMode::Materialised);  // unchanged
}

// The ranges the backward pass announces tile the gradient arena exactly once, layers first
// (last to first), and hold their final values when announced.
TEST(GradReadyHook, RangesAreFinalDisjointAndCoverTheArena) {
    for (const char* pe : {"learned", "alibi", "fire"}) {
        const ModelConfig c = config();
        Backend& cpu = test::cpu();
        Model m(c, cpu, test::make_pe(pe, c), 3);
        struct Seen {
            size_t begin, n;
            std::vector<float> values;
        };
        std::vector<Seen> seen;
        const float* base = m.grads().data();
        m.set_grad_ready_hook([&](float* g, size_t n) {
            seen.push_back({static_cast<size_t>(g - base), n, std::vector<float>(g, g + n)});
        });
        const BatchBuffers buf = test::tiny_batch(c.vocab_size);
        cpu.zero(m.grads().data(), m.grads().size());
        m.forward_backward(buf.batch(), 0.1f);
        ASSERT_EQ(seen.size(), static_cast<size_t>(c.n_layer) + 2) << pe;
        // layers L-1 .. 0 first, in that order
        for (int k = 0; k < c.n_layer; ++k) {
            const int l = c.n_layer - 1 - k;
            EXPECT_EQ(seen[k].begin, m.layout().view(fmt::format("layers.{}.ln1.weight", l)).offset);
        }
        std::vector<int> covered(m.grads().size(), 0);
        const std::vector<float> final_grads = host_copy(cpu, m.grads());
        for (const Seen& s : seen)
            for (size_t i = 0; i < s.n; ++i) {
                ++covered[s.begin + i];
                EXPECT_EQ(s.values[i], final_grads[s.begin + i]) << pe << " entry " << s.begin + i;
            }
        EXPECT_TRUE(std::all_of(covered.begin(), covered.end(), [](int x) { return x == 1; }))
            << pe << ": every gradient entry is announced exactly once";
        // No hook: nothing is called (and nothing breaks).
        m.set_grad_ready_hook({});
        const size_t before = seen.size();
        m.forward_backward(buf.batch(), 0.1f);
        EXPECT_EQ(seen.size(), before);
    }
}

}  // namespace
}  // namespace ctx
