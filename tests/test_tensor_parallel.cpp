// Tensor parallelism (model/tensor_parallel.h, docs/PARALLEL.md).
//
// Without mpirun: the shard arithmetic (which rows and columns a rank holds, round trips, clear
// refusals) and the vocabulary-parallel ops against the whole-vocabulary ones.
// Under mpirun (tests/CMakeLists.txt: mpi.tensor_parallel_np2 is tp 2, _np4 is dp 2 x tp 2):
// every rank also builds the whole model in-process as the reference, and the parallel model
// (same seed) must give the same loss, the same gradients (gathered to whole tensors) and, after
// AdamW steps, the same parameters, for every model style and every PE plugin; cached
// generation's logits too.
#include <cmath>
#include <numeric>

#include "model/generate.h"
#include "model/optimizer.h"
#include "model_fixtures.h"
#include "mpi_gtest.h"
#include "parallel/grid.h"
#include "remote_backend.h"

namespace ctx {
namespace {

using test::cpu;
using test::PeCase;

// ---------------------------------------------------------------- shards (one process)

TEST(TensorShard, SplitsHeadsHiddenUnitsAndVocabulary) {
    ModelConfig c = test::tiny_config();
    c.n_head = 4;
    c.n_kv_head = 2;
    c.d_model = 16;
    c.ffn_hidden = 24;
    c.vocab_size = 14;
    c.activation = Activation::SwiGLU;
    const TensorShard s = tensor_shard(c, 1, 2);
    EXPECT_EQ(s.H, 2);
    EXPECT_EQ(s.Hkv, 1);
    EXPECT_EQ(s.head0, 2);
    EXPECT_EQ(s.A, 8);
    EXPECT_EQ(s.Q, (2 + 2 * 1) * 4);
    EXPECT_EQ(s.F, 12);
    EXPECT_EQ(s.F2, 24);
    EXPECT_EQ(s.V, 7);
    EXPECT_EQ(s.vocab_begin, 7);
    EXPECT_EQ(s.vocab().total, 14);
    // a vocabulary tp does not divide (GPT-2's 50257): slices of ceil(V / tp), the last shorter
    c.vocab_size = 50257;
    EXPECT_EQ(tensor_shard(c, 0, 2).V, 25129);
    EXPECT_EQ(tensor_shard(c, 1, 2).V, 25128);
    EXPECT_EQ(tensor_shard(c, 1, 2).vocab_begin, 25129);
    const TensorShard whole = tensor_shard(c, 0, 1);
    EXPECT_EQ(whole.A, 16);
    EXPECT_EQ(whole.vocab().total, 0);  // not split: the ops see the whole vocabulary
}

TEST(TensorShard, RefusesWhatTpDoesNotDivide) {
    auto message = [](const ModelConfig& c, int tp) {
        try {
            tensor_shard(c, 0, tp);
        } catch (const Error& e) {
            return std::string(e.what());
        }
        return std::string("no error");
    };
    ModelConfig c = test::tiny_config();  // 2 heads, ffn 24
    EXPECT_NE(message(c, 4).find("does not divide n_head = 2"), std::string::npos);
    c.vocab_size = 12;
    c.n_head = 4;
    c.d_model = 16;
    c.n_kv_head = 1;
    EXPECT_NE(message(c, 2).find("key/value heads"), std::string::npos);
    c.n_kv_head = 2;
    c.ffn_hidden = 25;
    EXPECT_NE(message(c, 2).find("MLP width 25"), std::string::npos);
    c.ffn_hidden = 24;
    c.vocab_size = 1;  // one row for two ranks
    EXPECT_NE(message(c, 2).find("vocab_size = 1 is too small"), std::string::npos);
}

TEST(TensorShard, CopyShardCutsPartsAndRoundTrips) {
    // qkv-like rows [q (4) | k (2) | v (2)] of width 3, split over 2 ranks.
    const std::vector<int64_t> shape = {8, 3};
    std::vector<float> whole(24);
    std::iota(whole.begin(), whole.end(), 0.0f);
    const ShardSpec rows{0, {4, 2, 2}};
    std::vector<float> part(12);
    copy_shard(whole.data(), part.data(), shape, rows, 1, 2, true);
    // rank 1: q rows 2-3, k row 5, v row 7
    const std::vector<float> want = {6, 7, 8, 9, 10, 11, 15, 16, 17, 21, 22, 23};
    EXPECT_EQ(part, want);
    // columns: (2, 4) split along dim 1 into 2 x 2
    const std::vector<int64_t> shape2 = {2, 4};
    std::vector<float> w2 = {0, 1, 2, 3, 4, 5, 6, 7}, p2(4);
    copy_shard(w2.data(), p2.data(), shape2, ShardSpec{1, {4}}, 1, 2, true);
    EXPECT_EQ(p2, (std::vector<float>{2, 3, 6, 7}));
    // round trip: every rank's part back into a zeroed whole
    std::vector<float> back(24, 0.0f);
    for (int r = 0; r < 2; ++r) {
        copy_shard(whole.data(), part.data(), shape, rows, r, 2, true);
        copy_shard(back.data(), part.data(), shape, rows, r, 2, false);
    }
    EXPECT_EQ(back, whole);
}

// The vocabulary-parallel ops, shard by shard in one process, against the whole-vocabulary
// embedding and cross-entropy.
TEST(VocabParallelOps, MatchWholeVocabulary) {
    const int N = 5, V = 12, C = 3, S = 3, Vs = V / S;
    Rng rng(7);
    std::vector<float> logits(N * V), wte(V * C);
    for (float& x : logits) x = static_cast<float>(rng.normal() * 3);
    for (float& x : wte) x = static_cast<float>(rng.normal());
    const std::vector<int32_t> targets = {0, 11, 5, 4, 8}, tokens = {3, 11, 0, 7, 4};
    const std::vector<float> mask = {1, 1, 0, 1, 0.5f};
    Backend& be = cpu();
    std::vector<float> want_loss(N), want_d = logits;
    be.crossentropy_forward_backward(want_d.data(), want_loss.data(), targets.data(), mask.data(),
                                     N, V, 0.25f);
    // per shard: its columns of the logits, stats gathered in shard order
    std::vector<std::vector<float>> cols(S, std::vector<float>(N * Vs));
    std::vector<float> stats(S * N * 3);
    for (int s = 0; s < S; ++s) {
        for (int n = 0; n < N; ++n)
            for (int v = 0; v < Vs; ++v) cols[s][n * Vs + v] = logits[n * V + s * Vs + v];
        be.crossentropy_shard_stats(stats.data() + s * N * 3, cols[s].data(), targets.data(), N,
                                    Vs, VocabShard{s * Vs, V});
    }
    for (int s = 0; s < S; ++s) {
        std::vector<float> loss(N), loss_only(N);
        be.crossentropy_shard_finish(loss_only.data(), nullptr, stats.data(), S, targets.data(),
                                     mask.data(), N, Vs, VocabShard{s * Vs, V}, 0.25f);
        be.crossentropy_shard_finish(loss.data(), cols[s].data(), stats.data(), S,
                                     targets.data(), mask.data(), N, Vs, VocabShard{s * Vs, V},
                                     0.25f);
        for (int n = 0; n < N; ++n) {
            EXPECT_NEAR(loss[n], want_loss[n], 1e-5f * (1 + std::fabs(want_loss[n])));
            EXPECT_EQ(loss[n], loss_only[n]);
            for (int v = 0; v < Vs; ++v)
                EXPECT_NEAR(cols[s][n * Vs + v], want_d[n * V + s * Vs + v], 1e-6f)
                    << "shard " << s << " row " << n << " column " << v;
        }
    }
    // embedding: the shards' rows sum to the whole lookup; the backward scatters to the owner
    std::vector<float> want(N * C), sum(N * C, 0.0f), out(N * C);
    be.embedding_forward(want.data(), tokens.data(), nullptr, wte.data(), nullptr, N, C, V, 0);
    std::vector<float> dout(N * C), dwte_whole(V * C, 0.0f), dwte_parts(V * C, 0.0f);
    for (float& x : dout) x = static_cast<float>(rng.normal());
    be.embedding_backward(dwte_whole.data(), nullptr, dout.data(), tokens.data(), nullptr, N, C,
                          V, 0);
    for (int s = 0; s < S; ++s) {
        be.embedding_forward(out.data(), tokens.data(), nullptr, wte.data() + s * Vs * C, nullptr,
                             N, C, Vs, 0, VocabShard{s * Vs, V});
        for (int i = 0; i < N * C; ++i) sum[i] += out[i];
        be.embedding_backward(dwte_parts.data() + s * Vs * C, nullptr, dout.data(),
                              tokens.data(), nullptr, N, C, Vs, 0, VocabShard{s * Vs, V});
    }
    EXPECT_EQ(sum, want);
    EXPECT_EQ(dwte_parts, dwte_whole);
}

// ---------------------------------------------------------------- under mpirun

Comm& world() {
    static std::unique_ptr<Comm> single = make_single_comm();
    return test::mpi_world() ? *test::mpi_world() : *single;
}

struct TpCase {
    std::string style;
    PeCase pe;
    bool sequence_parallel = false;
};
std::string case_name(const TpCase& c) {
    return c.style + "_" + c.pe.pe + (c.sequence_parallel ? "_sp" : "");
}
void PrintTo(const TpCase& c, std::ostream* os) { *os << case_name(c); }

ModelConfig config_for(const std::string& style) {
    ModelConfig c = test::tiny_config();
    c.n_head = 4;
    c.d_model = 16;
    c.ffn_hidden = 24;
    c.vocab_size = style == "gpt2" || style == "llama" ? 13 : 14;  // 13: uneven vocabulary split
    if (style == "neox") {
        c.parallel_residual = true;
        c.tied_embeddings = false;
    } else if (style == "bloom") {
        c.embedding_layernorm = true;
        c.activation = Activation::GeluErf;
    } else if (style == "llama") {
        test::use_llama_block(c);
        c.n_kv_head = 2;
    }
    return c;
}

// Rows of six tokens, fractional original positions, partly masked; row r of the global batch.
void fill_row(BatchBuffers& b, int dst, int r, int vocab) {
    for (int t = 0; t < 6; ++t) {
        const int i = dst * 6 + t, g = r * 6 + t;
        b.tokens[i] = (g * 7 + 3) % vocab;
        b.targets[i] = (g * 5 + 1) % vocab;
        b.positions[i] = static_cast<float>(t * 1.5 + (r % 3));
        b.mask[i] = (g % 5 == 4) ? 0.0f : 1.0f;
    }
}

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
    double d = 0;
    for (size_t i = 0; i < a.size(); ++i) d = std::max(d, double(std::fabs(a[i] - b[i])));
    return d;
}

// The parallel model's gradients (gathered to whole tensors) against the whole model's, view by
// view, relative to the view's size and, for views whose true gradient is zero (a key bias),
// to the whole gradient's norm.
void expect_same_gradients(const Model& par, const Model& ref, double ref_norm) {
    const std::vector<float> g = par.gather_full(par.grads());
    const std::vector<float> want = test::host_copy(cpu(), ref.grads());
    for (const ParamView& v : ref.layout().views()) {
        double diff = 0, norm = 0;
        for (size_t i = v.offset; i < v.offset + v.numel; ++i) {
            diff += (g[i] - want[i]) * double(g[i] - want[i]);
            norm += double(want[i]) * want[i];
        }
        EXPECT_LE(std::sqrt(diff), 1e-5 * std::sqrt(norm) + 1e-6 * ref_norm) << v.name;
    }
}

class TensorParallelMpi : public ::testing::TestWithParam<TpCase> {};

TEST_P(TensorParallelMpi, TrainsAsOneProcess) {
    if (world().size() < 2 || world().size() % 2) GTEST_SKIP() << "needs mpirun with 2 or 4 ranks";
    const TpCase& tc = GetParam();
    ParallelGrid grid(world(), GridShape{2, 1});
    const ModelConfig c = config_for(tc.style);
    const uint64_t seed = 11;
    Model ref(c, cpu(), test::make_pe(tc.pe.pe, c, tc.pe.opts), seed);
    Model tp(c, cpu(), test::make_pe(tc.pe.pe, c, tc.pe.opts), seed, &grid.tp_group());
    ASSERT_TRUE(tp.tensor_parallel());
    tp.set_sequence_parallel(tc.sequence_parallel);
    EXPECT_EQ(tp.num_params(), ref.num_params());
    EXPECT_LT(tp.layout().total(), ref.layout().total());
    // the same whole model from the same seed
    ASSERT_TRUE(test::bit_equal(tp.gather_full(tp.params()), test::host_copy(cpu(), ref.params())));

    // The global batch: 2 rows per data-parallel rank; the reference runs all of them.
    const int rows = 2, dp = grid.dp();
    BatchBuffers global, local;
    global.resize(rows * dp, 6);
    local.resize(rows, 6);
    for (int r = 0; r < rows * dp; ++r) fill_row(global, r, r, c.vocab_size);
    for (int r = 0; r < rows; ++r) fill_row(local, r, grid.dp_rank() * rows + r, c.vocab_size);
    double count = 0;
    for (float m : global.mask) count += m;

    OptimizerConfig oc;
    oc.lr = 1e-3f;
    oc.warmup_steps = 0;
    // The key bias's true gradient is zero (softmax ignores a shift shared by a row's logits;
    // FIRE's output bias likewise), so what either run computes for it is fp32 rounding
    // (1e-9 .. 1e-8), which AdamW's eps = 1e-8 would turn into +-lr steps of arbitrary sign.
    // eps = 1e-5 keeps such noise from moving a parameter (both runs are still the same math).
    oc.eps = 1e-5f;
    Optimizer ref_opt(ref, oc), tp_opt(tp, oc);
    for (int step = 0; step < 3; ++step) {
        cpu().zero(ref.grads().data(), ref.grads().size());
        cpu().zero(tp.grads().data(), tp.grads().size());
        const double ref_loss = ref.forward_backward(global.batch(), float(1 / count)).loss_sum;
        double tp_loss[1] = {tp.forward_backward(local.batch(), float(1 / count)).loss_sum};
        grid.dp_group().allreduce_sum(tp_loss, 1);
        grid.dp_group().allreduce_sum(tp.grads().data(), tp.grads().size());
        EXPECT_NEAR(tp_loss[0], ref_loss, 1e-5 * std::fabs(ref_loss)) << "step " << step;
        if (step == 0) {
            expect_same_gradients(tp, ref, ref_opt.grad_norm());
            EXPECT_NEAR(tp_opt.grad_norm(), ref_opt.grad_norm(), 1e-5 * ref_opt.grad_norm());
        }
        ref_opt.update(ref_opt.grad_norm());
        tp_opt.update(tp_opt.grad_norm());
    }
    const std::vector<float> p = tp.gather_full(tp.params());
    const std::vector<float> want = test::host_copy(cpu(), ref.params());
    for (const ParamView& v : ref.layout().views()) {
        double d = 0;
        size_t at = 0;
        for (size_t i = v.offset; i < v.offset + v.numel; ++i)
            if (std::fabs(p[i] - want[i]) > d) d = std::fabs(p[i] - want[i]), at = i - v.offset;
        EXPECT_LE(d, 1e-5) << v.name << " [" << at << "]: " << p[v.offset + at] << " vs "
                           << want[v.offset + at];
    }

    // evaluation: the gathered logits, and cached generation's
    ref.forward(local.batch());
    tp.forward(local.batch());
    EXPECT_LE(max_abs_diff(tp.logits(local.batch()), ref.logits(local.batch())), 1e-4);
    KvGenerator gen_ref(ref, 1, 8), gen_tp(tp, 1, 8);
    gen_ref.prefill(0, local.tokens.data(), local.positions.data(), 6);
    gen_tp.prefill(0, local.tokens.data(), local.positions.data(), 6);
    const std::vector<float> a(gen_ref.logits(0), gen_ref.logits(0) + c.vocab_size);
    const std::vector<float> b(gen_tp.logits(0), gen_tp.logits(0) + c.vocab_size);
    EXPECT_LE(max_abs_diff(a, b), 1e-4);
}

std::vector<TpCase> all_cases() {
    const std::vector<PeCase> pes = {
        {"none", {}},         {"learned", {}},      {"sinusoidal", {}},
        {"rope", {}},         {"alibi", {}},        {"kerple_log", {}},
        {"kerple_power", {}}, {"t5_bias", {}},      {"fire", {}}};
    std::vector<TpCase> out;
    for (bool sp : {false, true})
        for (const std::string style : {"gpt2", "neox", "bloom", "llama"})
            for (const PeCase& pe : pes) out.push_back({style, pe, sp});
    return out;
}

INSTANTIATE_TEST_SUITE_P(StylesAndPes, TensorParallelMpi, ::testing::ValuesIn(all_cases()),
                         [](const auto& info) { return case_name(info.param); });

// The device-backend paths under tensor parallelism (the group's collectives staged through the
// host, PE parameters, generic bias tables and input PEs through HostSpan) on a backend whose
// memory the host cannot touch (tests/remote_backend.h): bit-equal to the CPU backend's run.
class TensorParallelDeviceMpi : public ::testing::TestWithParam<PeCase> {};

TEST_P(TensorParallelDeviceMpi, MatchesTheCpuBackendBitForBit) {
    if (world().size() < 2 || world().size() % 2) GTEST_SKIP() << "needs mpirun with 2 or 4 ranks";
    const PeCase& pc = GetParam();
    ParallelGrid grid(world(), GridShape{2, 1});
    const ModelConfig c = config_for("gpt2");  // vocabulary 13: uneven split
    test::RemoteBackend remote(1);
    Model host(c, cpu(), test::make_pe(pc.pe, c, pc.opts), 5, &grid.tp_group());
    Model dev(c, remote, test::make_pe(pc.pe, c, pc.opts), 5, &grid.tp_group());
    BatchBuffers local;
    local.resize(2, 6);
    for (int r = 0; r < 2; ++r) fill_row(local, r, grid.dp_rank() * 2 + r, c.vocab_size);
    OptimizerConfig oc;
    oc.warmup_steps = 0;
    Optimizer host_opt(host, oc), dev_opt(dev, oc);
    for (int step = 0; step < 2; ++step) {
        for (Model* m : {&host, &dev}) m->backend().zero(m->grads().data(), m->grads().size());
        const double a = host.forward_backward(local.batch(), 0.05f).loss_sum;
        const double b = dev.forward_backward(local.batch(), 0.05f).loss_sum;
        EXPECT_EQ(a, b) << "step " << step;
        EXPECT_TRUE(test::bit_equal(host.gather_full(host.grads()), dev.gather_full(dev.grads())))
            << "step " << step;
        host_opt.update(host_opt.grad_norm());
        dev_opt.update(dev_opt.grad_norm());
    }
    EXPECT_TRUE(test::bit_equal(host.gather_full(host.params()), dev.gather_full(dev.params())));
    host.forward(local.batch());
    dev.forward(local.batch());
    EXPECT_TRUE(test::bit_equal(host.logits(local.batch()), dev.logits(local.batch())));
    KvGenerator gh(host, 1, 8), gd(dev, 1, 8);
    gh.prefill(0, local.tokens.data(), local.positions.data(), 6);
    gd.prefill(0, local.tokens.data(), local.positions.data(), 6);
    EXPECT_TRUE(test::bit_equal(std::vector<float>(gh.logits(0), gh.logits(0) + c.vocab_size),
                                std::vector<float>(gd.logits(0), gd.logits(0) + c.vocab_size)));
}

INSTANTIATE_TEST_SUITE_P(Pes, TensorParallelDeviceMpi,
                         ::testing::Values(PeCase{"learned", {}}, PeCase{"sinusoidal", {}},
                                           PeCase{"alibi", {}}, PeCase{"kerple_log", {}},
                                           PeCase{"fire", {}}),
                         [](const auto& info) { return info.param.pe; });

// Context parallelism (ring attention, model/ring_attention.h): cp 2 on 2 ranks, cp 2 x tp 2 on
// 4; every rank of the group takes the same whole batch and runs its zigzag share of each row.
// Loss, gradients (summed over the group), AdamW steps and the gathered logits must equal the
// whole model's in one process, for every style and every PE (FIRE's generic bias through
// per-block tables; bloom's rows are packed: two documents each).
class ContextParallelMpi : public ::testing::TestWithParam<TpCase> {};

TEST_P(ContextParallelMpi, TrainsAsOneProcess) {
    const int W = world().size();
    if (W != 2 && W != 4) GTEST_SKIP() << "needs mpirun with 2 or 4 ranks";
    const TpCase& tc = GetParam();
    ParallelGrid grid(world(), GridShape{W / 2, 2});  // cp 2 (x tp 2 on 4 ranks)
    const ModelConfig c = config_for(tc.style);
    Model ref(c, cpu(), test::make_pe(tc.pe.pe, c, tc.pe.opts), 13);
    Model par(c, cpu(), test::make_pe(tc.pe.pe, c, tc.pe.opts), 13,
              grid.tp() > 1 ? &grid.tp_group() : nullptr);
    par.set_context_parallel(&grid.cp_group());
    ASSERT_TRUE(par.context_parallel());
    if (tc.sequence_parallel) {
        if (grid.tp() == 1) GTEST_SKIP() << "sequence parallelism needs tp 2 (4 ranks)";
        par.set_sequence_parallel(true);
    }
    const int B = 2, T = 8;  // 2 x cp chunks of 2 tokens
    BatchBuffers batch;
    batch.resize(B, T);
    for (int i = 0; i < B * T; ++i) {
        batch.tokens[i] = (i * 7 + 3) % c.vocab_size;
        batch.targets[i] = (i * 5 + 1) % c.vocab_size;
        batch.positions[i] = float((i % T) * 1.25 + (i / T) * 0.5);
        batch.mask[i] = i % 7 == 3 ? 0.0f : 1.0f;
    }
    if (tc.style == "bloom") {  // packed: documents [0, 3) and [3, 8) in each row
        batch.doc_start.assign(B * T, 0);
        for (int i = 0; i < B * T; ++i) batch.doc_start[i] = i % T < 3 ? 0 : 3;
    }
    double count = 0;
    for (float m : batch.mask) count += m;
    OptimizerConfig oc;
    oc.lr = 1e-3f;
    oc.warmup_steps = 0;
    oc.eps = 1e-5f;  // as TrainsAsOneProcess: zero-gradient parameters must not move on noise
    Optimizer ref_opt(ref, oc), par_opt(par, oc);
    for (int step = 0; step < 3; ++step) {
        cpu().zero(ref.grads().data(), ref.grads().size());
        cpu().zero(par.grads().data(), par.grads().size());
        const LossSums a = ref.forward_backward(batch.batch(), float(1 / count));
        const LossSums b = par.forward_backward(batch.batch(), float(1 / count));
        grid.cp_group().allreduce_sum(par.grads().data(), par.grads().size());
        EXPECT_NEAR(b.loss_sum, a.loss_sum, 1e-5 * std::fabs(a.loss_sum)) << "step " << step;
        EXPECT_EQ(b.mask_sum, a.mask_sum);
        if (step == 0) expect_same_gradients(par, ref, ref_opt.grad_norm());
        ref_opt.update(ref_opt.grad_norm());
        par_opt.update(par_opt.grad_norm());
    }
    EXPECT_LE(max_abs_diff(par.gather_full(par.params()), test::host_copy(cpu(), ref.params())),
              1e-5);
    ref.forward(batch.batch());
    par.forward(batch.batch());
    EXPECT_LE(max_abs_diff(par.logits(batch.batch()), ref.logits(batch.batch())), 1e-4);
}

std::vector<TpCase> cp_cases() {
    std::vector<TpCase> out;
    for (const std::string style : {"gpt2", "neox", "bloom", "llama"})
        for (const char* pe : {"none", "learned", "sinusoidal", "rope", "alibi", "kerple_log",
                               "kerple_power", "t5_bias", "fire"})
            out.push_back({style, PeCase{pe, {}}, false});
    // cp 2 x tp 2 with sequence parallelism: this rank's tokens split again over tp
    for (const std::string style : {"gpt2", "neox", "bloom", "llama"})
        for (const char* pe : {"learned", "rope", "alibi", "fire"})
            out.push_back({style, PeCase{pe, {}}, true});
    return out;
}

INSTANTIATE_TEST_SUITE_P(StylesAndPes, ContextParallelMpi, ::testing::ValuesIn(cp_cases()),
                         [](const auto& info) { return case_name(info.param); });

// The ring on a backend whose memory the host cannot touch (tests/remote_backend.h): blocks,
// metadata and generic-bias tables in device memory, the ring staged through the host; bit-equal
// to the CPU backend's ring (cp 2, x tp 2 on 4 ranks; packed rows for bloom).
class ContextParallelDeviceMpi : public ::testing::TestWithParam<TpCase> {};

TEST_P(ContextParallelDeviceMpi, MatchesTheCpuBackendBitForBit) {
    const int W = world().size();
    if (W != 2 && W != 4) GTEST_SKIP() << "needs mpirun with 2 or 4 ranks";
    const TpCase& tc = GetParam();
    ParallelGrid grid(world(), GridShape{W / 2, 2});
    const ModelConfig c = config_for(tc.style);
    Comm* tp = grid.tp() > 1 ? &grid.tp_group() : nullptr;
    test::RemoteBackend remote(1);
    Model host(c, cpu(), test::make_pe(tc.pe.pe, c, tc.pe.opts), 7, tp);
    Model dev(c, remote, test::make_pe(tc.pe.pe, c, tc.pe.opts), 7, tp);
    for (Model* m : {&host, &dev}) m->set_context_parallel(&grid.cp_group());
    const int B = 2, T = 8;
    BatchBuffers batch;
    batch.resize(B, T);
    for (int i = 0; i < B * T; ++i) {
        batch.tokens[i] = (i * 5 + 2) % c.vocab_size;
        batch.targets[i] = (i * 3 + 1) % c.vocab_size;
        batch.positions[i] = float((i % T) * 1.5 + (i / T) * 0.25);
        batch.mask[i] = i % 5 == 2 ? 0.0f : 1.0f;
    }
    if (tc.style == "bloom") {
        batch.doc_start.assign(B * T, 0);
        for (int i = 0; i < B * T; ++i) batch.doc_start[i] = i % T < 5 ? 0 : 5;
    }
    OptimizerConfig oc;
    oc.warmup_steps = 0;
    Optimizer host_opt(host, oc), dev_opt(dev, oc);
    for (int step = 0; step < 2; ++step) {
        for (Model* m : {&host, &dev}) m->backend().zero(m->grads().data(), m->grads().size());
        const double a = host.forward_backward(batch.batch(), 0.05f).loss_sum;
        const double b = dev.forward_backward(batch.batch(), 0.05f).loss_sum;
        EXPECT_EQ(a, b) << "step " << step;
        EXPECT_TRUE(test::bit_equal(host.gather_full(host.grads()), dev.gather_full(dev.grads())))
            << "step " << step;
        host_opt.update(host_opt.grad_norm());
        dev_opt.update(dev_opt.grad_norm());
    }
    EXPECT_TRUE(test::bit_equal(host.gather_full(host.params()), dev.gather_full(dev.params())));
    host.forward(batch.batch());
    dev.forward(batch.batch());
    EXPECT_TRUE(test::bit_equal(host.logits(batch.batch()), dev.logits(batch.batch())));
}

INSTANTIATE_TEST_SUITE_P(
    StylesAndPes, ContextParallelDeviceMpi,
    ::testing::Values(TpCase{"gpt2", PeCase{"learned", {}}, false},
                      TpCase{"neox", PeCase{"rope", {}}, false},
                      TpCase{"bloom", PeCase{"alibi", {}}, false},
                      TpCase{"llama", PeCase{"t5_bias", {}}, false},
                      TpCase{"gpt2", PeCase{"kerple_power", {}}, false},
                      TpCase{"neox", PeCase{"fire", {}}, false}),
    [](const auto& info) { return case_name(info.param); });

// Rows that do not split into 2 x cp chunks (6 tokens over cp 2) are padded at their end: the
// losses, gradients and logits of the real tokens are the whole model's.
TEST(ContextParallelMpi, PadsRowsThatDoNotSplit) {
    if (world().size() != 2 && world().size() != 4) GTEST_SKIP() << "needs 2 or 4 ranks";
    ParallelGrid grid(world(), GridShape{world().size() / 2, 2});
    const ModelConfig c = config_for("bloom");
    Comm* tp = grid.tp() > 1 ? &grid.tp_group() : nullptr;
    Model ref(c, cpu(), test::make_pe("alibi", c), 1);
    Model par(c, cpu(), test::make_pe("alibi", c), 1, tp);
    par.set_context_parallel(&grid.cp_group());
    BatchBuffers b = test::tiny_batch(c.vocab_size);  // rows of 6: padded to 8
    ASSERT_EQ(b.T % 4, 2);
    b.doc_start.assign(b.tokens.size(), 0);  // packed: documents [0, 2) and [2, 6)
    for (size_t i = 0; i < b.doc_start.size(); ++i) b.doc_start[i] = i % b.T < 2 ? 0 : 2;
    cpu().zero(ref.grads().data(), ref.grads().size());
    cpu().zero(par.grads().data(), par.grads().size());
    const LossSums want = ref.forward_backward(b.batch(), 0.1f);
    const LossSums got = par.forward_backward(b.batch(), 0.1f);
    EXPECT_NEAR(got.loss_sum, want.loss_sum, 1e-5 * std::fabs(want.loss_sum));
    EXPECT_EQ(got.mask_sum, want.mask_sum);
    for (size_t i = 0; i < b.tokens.size(); ++i)
        EXPECT_NEAR(par.losses()[i], ref.losses()[i], 1e-5) << "token " << i;
    grid.cp_group().allreduce_sum(par.grads().data(), par.grads().size());
    OptimizerConfig oc;
    Optimizer ref_opt(ref, oc);
    expect_same_gradients(par, ref, ref_opt.grad_norm());
    EXPECT_LE(max_abs_diff(par.logits(b.batch()), ref.logits(b.batch())), 1e-4);
}

TEST(ParallelGridMpi, RefusesAWorldThatDoesNotFactor) {
    const int W = world().size();
    try {
        ParallelGrid bad(world(), GridShape{W + 1, 1});
        FAIL() << "a grid of tp " << W + 1 << " on " << W << " ranks was accepted";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("does not factor as dp x cp 1 x tp"),
                  std::string::npos)
            << e.what();
    }
    EXPECT_THROW(ParallelGrid(world(), GridShape{0, 1}), Error);
}

TEST(ParallelGridMpi, CoordinatesAndGroups) {
    const int W = world().size();
    const int tp = W % 2 == 0 ? 2 : 1;
    ParallelGrid g(world(), GridShape{tp, 1});
    EXPECT_EQ(g.dp() * g.tp(), W);
    EXPECT_EQ(world().rank(), g.dp_rank() * tp + g.tp_rank());
    EXPECT_EQ(g.tp_group().size(), tp);
    EXPECT_EQ(g.tp_group().rank(), g.tp_rank());
    EXPECT_EQ(g.dp_group().size(), g.dp());
    EXPECT_EQ(g.dp_group().rank(), g.dp_rank());
    // a sum over the tensor-parallel group sees exactly its members' world ranks
    double r[1] = {double(world().rank())};
    g.tp_group().allreduce_sum(r, 1);
    const int first = g.dp_rank() * tp;
    EXPECT_EQ(r[0], tp == 2 ? 2 * first + 1 : first);
}

}  // namespace
}  // namespace ctx

int main(int argc, char** argv) { return ctx::test::mpi_gtest_main(argc, argv); }
