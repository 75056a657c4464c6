// Context parallelism on the CUDA backend (model/ring_attention.h, docs/PARALLEL.md): under
// mpirun with 2 ranks, cp 2 on each rank's GPU must train as the whole model does in one process
// on the CPU (loss, gradients, AdamW steps, logits), for the bias families of the block kernels
// (cuda_attention_block.cu): none, rotary, ALiBi with packed rows, T5, KERPLE, and FIRE's
// generic tables. Skips without a GPU per rank or without mpirun. Several ranks on one GPU:
// CTX_GROUP_COLLECTIVES=host (the ring staged through host memory; NCCL refuses a shared GPU).
// Under the CUDA emulation: run_emulated_tests.py --model --mpi=2. Not named test_gpu_*: the GPU
// bundle carries no MPI, so it would only skip there (mpi.gpu_context_parallel_np2 labels it gpu).
// Also in bf16 (the activations stored in bf16) against the whole model on the same backend.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>

#include "gpu_test_support.h"
#include "model/optimizer.h"
#include "model_fixtures.h"
#include "mpi_gtest.h"
#include "parallel/grad_reducer.h"  // local_rank_from_env
#include "parallel/grid.h"

namespace ctx {
namespace {

using test::PeCase;

struct CpCase {
    std::string style;
    PeCase pe;
};
std::string case_name(const CpCase& c) { return c.style + "_" + c.pe.pe; }
void PrintTo(const CpCase& c, std::ostream* os) { *os << case_name(c); }

ModelConfig config_for(const std::string& style) {
    ModelConfig c = test::tiny_config();
    c.n_head = 2;
    c.d_model = 16;
    c.ffn_hidden = 24;
    c.vocab_size = 11;
    c.context_length = 16;  // learned table: positions up to 11 x 1.25 + 0.5
    if (style == "neox") {
        c.parallel_residual = true;
        c.tied_embeddings = false;
    } else if (style == "bloom") {
        c.embedding_layernorm = true;
        c.activation = Activation::GeluErf;
    }
    return c;
}

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
    EXPECT_EQ(a.size(), b.size());
    double m = 0;
    for (size_t i = 0; i < std::min(a.size(), b.size()); ++i)
        m = std::max(m, std::fabs(double(a[i]) - double(b[i])));
    return m;
}

// Why this rank cannot run a 2-rank CUDA case ("" when it can).
std::string skip_reason(Comm* world) {
    if (world == nullptr || world->size() != 2) return "needs mpirun -np 2";
    if (!have_gpu()) return "no CUDA device";
    const char* ls = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
    const char* host_path = std::getenv("CTX_GROUP_COLLECTIVES");
    const bool host_groups = host_path != nullptr && std::string(host_path) == "host";
    if (ls != nullptr && std::atoi(ls) > cuda_device_count() && !host_groups)
        return "ranks share a GPU: set CTX_GROUP_COLLECTIVES=host";
    return "";
}

// Two rows of 12 tokens (2 x cp chunks of 3) at fractional positions; BLOOM's rows are packed
// (documents [0, 5) and [5, 12)).
BatchBuffers cp_batch(const ModelConfig& c, const std::string& style) {
    const int B = 2, T = 12;
    BatchBuffers batch;
    batch.resize(B, T);
    for (int i = 0; i < B * T; ++i) {
        batch.tokens[i] = (i * 7 + 3) % c.vocab_size;
        batch.targets[i] = (i * 5 + 1) % c.vocab_size;
        batch.positions[i] = float((i % T) * 1.25 + (i / T) * 0.5);
        batch.mask[i] = i % 7 == 3 ? 0.0f : 1.0f;
    }
    if (style == "bloom") {
        batch.doc_start.assign(B * T, 0);
        for (int i = 0; i < B * T; ++i) batch.doc_start[i] = i % T < 5 ? 0 : 5;
    }
    return batch;
}

class GpuContextParallelMpi : public ::testing::TestWithParam<CpCase> {};

TEST_P(GpuContextParallelMpi, TrainsAsTheWholeModelOnTheCpu) {
    Comm* world = test::mpi_world();
    if (const std::string why = skip_reason(world); !why.empty()) GTEST_SKIP() << why;
    const int device = local_rank_from_env() % cuda_device_count();
    const CpCase& tc = GetParam();
    ParallelGrid grid(*world, GridShape{1, 2});  // cp 2
    auto gpu_be = make_cuda_backend(device);
    const ModelConfig c = config_for(tc.style);
    Model ref(c, test::cpu(), test::make_pe(tc.pe.pe, c, tc.pe.opts), 13);
    Model par(c, *gpu_be, test::make_pe(tc.pe.pe, c, tc.pe.opts), 13);
    par.set_context_parallel(&grid.cp_group());
    ASSERT_TRUE(par.context_parallel());
    const BatchBuffers batch = cp_batch(c, tc.style);
    double count = 0;
    for (float m : batch.mask) count += m;
    OptimizerConfig oc;
    oc.lr = 1e-3f;
    oc.warmup_steps = 0;
    oc.eps = 1e-5f;  // zero-gradient parameters must not move on rounding noise
    Optimizer ref_opt(ref, oc), par_opt(par, oc);
    try {
        for (int step = 0; step < 3; ++step) {
            test::cpu().zero(ref.grads().data(), ref.grads().size());
            gpu_be->zero(par.grads().data(), par.grads().size());
            const LossSums a = ref.forward_backward(batch.batch(), float(1 / count));
            const LossSums b = par.forward_backward(batch.batch(), float(1 / count));
            // the two ranks' gradient shares summed (host: the reducer needs NCCL on GPUs)
            std::vector<float> g = test::host_copy(*gpu_be, par.grads());
            grid.cp_group().allreduce_sum(g.data(), g.size());
            gpu_be->copy_to_device(par.grads().data(), g.data(), g.size());
            EXPECT_NEAR(b.loss_sum, a.loss_sum, 1e-5 * std::fabs(a.loss_sum)) << "step " << step;
            if (step == 0) {
                const std::vector<float> want = test::host_copy(test::cpu(), ref.grads());
                EXPECT_LE(max_abs_diff(g, want), 1e-5) << "gradients";
            }
            ref_opt.update(ref_opt.grad_norm());
            par_opt.update(par_opt.grad_norm());
        }
        EXPECT_LE(max_abs_diff(test::host_copy(*gpu_be, par.params()),
                               test::host_copy(test::cpu(), ref.params())),
                  1e-5);
        ref.forward(batch.batch());
        par.forward(batch.batch());
        EXPECT_LE(max_abs_diff(par.logits(batch.batch()), ref.logits(batch.batch())), 1e-4);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "rank %d: %s\n", world->rank(), e.what());
        mpi_abort(1);
    }
}

INSTANTIATE_TEST_SUITE_P(
    StylesAndPes, GpuContextParallelMpi,
    ::testing::Values(CpCase{"gpt2", PeCase{"none", {}}}, CpCase{"neox", PeCase{"rope", {}}},
                      CpCase{"bloom", PeCase{"alibi", {}}}, CpCase{"gpt2", PeCase{"t5_bias", {}}},
                      CpCase{"neox", PeCase{"kerple_log", {}}},
                      CpCase{"gpt2", PeCase{"fire", {}}}, CpCase{"gpt2", PeCase{"learned", {}}}),
    [](const auto& info) { return case_name(info.param); });

// bf16 (products on tensor cores, the activations they read stored in bf16): cp 2 on each rank
// against the same bf16 backend running the whole rows in one model. The ring's block kernels
// are fp32 while the whole model's attention is the bf16 tensor-core flash, so the two agree
// within a bf16 band, not to fp32 rounding (emulated: loss 5e-4 relative, gradients 1.7e-2 of
// the largest, logits 3.1e-2).
class GpuContextParallelMpiBf16 : public ::testing::TestWithParam<CpCase> {};

TEST_P(GpuContextParallelMpiBf16, MatchesTheWholeModelOnTheSameBackend) {
    Comm* world = test::mpi_world();
    if (const std::string why = skip_reason(world); !why.empty()) GTEST_SKIP() << why;
    const CpCase& tc = GetParam();
    const int device = local_rank_from_env() % cuda_device_count();
    ParallelGrid grid(*world, GridShape{1, 2});  // cp 2
    auto be = make_cuda_backend(device, Precision::Bf16);
    ASSERT_TRUE(be->bf16_activations());
    const ModelConfig c = config_for(tc.style);
    Model whole(c, *be, test::make_pe(tc.pe.pe, c, tc.pe.opts), 13);
    Model par(c, *be, test::make_pe(tc.pe.pe, c, tc.pe.opts), 13);
    par.set_context_parallel(&grid.cp_group());
    const BatchBuffers batch = cp_batch(c, tc.style);
    try {
        be->zero(whole.grads().data(), whole.grads().size());
        be->zero(par.grads().data(), par.grads().size());
        const LossSums a = whole.forward_backward(batch.batch(), 0.05f);
        const LossSums b = par.forward_backward(batch.batch(), 0.05f);
        std::vector<float> g = test::host_copy(*be, par.grads());
        grid.cp_group().allreduce_sum(g.data(), g.size());
        const std::vector<float> want = test::host_copy(*be, whole.grads());
        double mag = 0;
        for (float x : want) mag = std::max(mag, double(std::fabs(x)));
        const double dg = max_abs_diff(g, want);
        const double dl = max_abs_diff(par.logits(batch.batch()), whole.logits(batch.batch()));
        EXPECT_NEAR(b.loss_sum, a.loss_sum, 5e-3 * std::fabs(a.loss_sum));
        EXPECT_LE(dg, 5e-2 * mag) << "gradients (largest " << mag << ")";
        EXPECT_GT(mag, 1e-3);
        EXPECT_LE(dl, 5e-2);
        if (world->rank() == 0)
            std::printf("  loss %.6f vs %.6f, gradients %.2e of %.2e, logits %.2e\n", b.loss_sum,
                        a.loss_sum, dg, mag, dl);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "rank %d: %s\n", world->rank(), e.what());
        mpi_abort(1);
    }
}

INSTANTIATE_TEST_SUITE_P(StylesAndPes, GpuContextParallelMpiBf16,
                         ::testing::Values(CpCase{"gpt2", PeCase{"none", {}}},
                                           CpCase{"bloom", PeCase{"alibi", {}}}),
                         [](const auto& info) { return case_name(info.param); });

}  // namespace
}  // namespace ctx

int main(int argc, char** argv) { return ctx::test::mpi_gtest_main(argc, argv); }
