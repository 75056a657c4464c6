// The ctxengine side of the HF reference test: loads CASE_DIR/hf (what make_reference.py saved
// with transformers) through ctx::load_hf_model, compares logits, loss and every parameter's
// gradient with CASE_DIR/reference.safetensors, then exports the model (CASE_DIR/export_hf) and,
// extended to twice its context, CASE_DIR/extended_hf with our logits on longer rows
// (CASE_DIR/extended_logits.safetensors) for check_export.py to reload in transformers.
// Usage: hf_check CASE_DIR   (exit 0 when every difference is within tolerance)
#include <lua.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "core/error.h"
#include "data/token_source.h"
#include "data/tokenizer.h"
#include "io/safetensors.h"
#include "lua/ctx_hf.h"
#include "lua/ctx_module.h"
#include "lua/runtime.h"
#include "model/decoder.h"
#include "parallel/comm.h"
#include "plugin/registry.h"

namespace {

using namespace ctx;

constexpr double kTol = 1e-4;  // fp32 logits / loss; gradients: relative to their largest entry

BatchBuffers rows_from(const std::vector<float>& tokens, int B, int T) {
    BatchBuffers b;
    b.resize(B, T);
    for (int r = 0; r < B; ++r)
        for (int t = 0; t < T; ++t) {
            const size_t i = static_cast<size_t>(r) * T + t;
            b.tokens[i] = static_cast<int32_t>(tokens[i]);
            // transformers' labels = inputs, shifted inside: the last position has no target
            b.targets[i] = t + 1 < T ? static_cast<int32_t>(tokens[i + 1]) : 0;
            b.mask[i] = t + 1 < T ? 1.0f : 0.0f;
            b.positions[i] = static_cast<float>(t);
        }
    return b;
}

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
    CTX_CHECK(a.size() == b.size(), "size mismatch: {} vs {}", a.size(), b.size());
    double m = 0;
    for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(double(a[i]) - double(b[i])));
    return m;
}

int run(const std::string& dir) {
    namespace fs = std::filesystem;
    const std::string name = fs::path(dir).filename().string();
    PluginRegistry registry;
    registry.scan_directory(CTX_HF_PLUGIN_DIR);
    auto comm = make_single_comm();
    EngineContext engine;
    engine.registry = &registry;
    engine.comm = comm.get();
    lua::Runtime runtime;
    open_ctx_module(runtime.state(), &engine);
    lua_State* L = runtime.state();
    DeviceRequest cpu;  // the reference comparison is on the CPU backend
    cpu.device = DeviceChoice::Cpu;

    const SafetensorsFile ref(dir + "/reference.safetensors");
    ModelRef h = load_hf_model(L, dir + "/hf", cpu, "hf_check:");
    Model& m = *h->model;
    const StTensor* tt = ref.find("tokens");
    CTX_CHECK(tt && tt->shape.size() == 2, "reference.safetensors: no (B, T) tokens");
    const int B = static_cast<int>(tt->shape[0]), T = static_cast<int>(tt->shape[1]);
    const BatchBuffers rows = rows_from(ref.read_f32("tokens"), B, T);
    const Batch batch = rows.batch();

    // logits and loss
    const LossSums sums = m.forward(batch);
    const double d_logits = max_abs_diff(m.logits(batch), ref.read_f32("logits"));
    const double d_loss = std::fabs(sums.mean() - ref.read_f32("loss")[0]);

    // gradients of the mean loss, mapped to HF names and layouts by the export mapping
    m.backend().zero(m.grads().data(), m.grads().size());
    m.forward_backward(batch, static_cast<float>(1.0 / sums.mask_sum));
    const HfSpec spec = hf_spec_of(*h);
    double d_grad = 0, g_max = 0;
    int n_grads = 0;
    std::string worst;
    for (const HfTensor& g : ours_to_hf_tensors(spec, model_tensors(m, m.grads()))) {
        const std::vector<float> want = ref.read_f32("grad." + g.name);
        const double d = max_abs_diff(g.data, want);
        for (float x : want) g_max = std::max(g_max, double(std::fabs(x)));
        if (d >= d_grad) worst = g.name;
        d_grad = std::max(d_grad, d);
        ++n_grads;
    }
    int ref_grads = 0;
    for (const StTensor& t : ref.tensors()) ref_grads += t.name.rfind("grad.", 0) == 0;
    CTX_CHECK(ref_grads == n_grads, "transformers has {} parameter gradients, ctxengine {}",
              ref_grads, n_grads);
    std::printf("%s: logits max|diff| %.3g, loss |diff| %.3g (loss %.6f), gradients max|diff| "
                "%.3g (largest |grad| %.3g, %d tensors, worst %s)\n",
                name.c_str(), d_logits, d_loss, sums.mean(), d_grad, g_max, n_grads,
                worst.c_str());

    // the same model saved sharded or in half precision (read as fp32)
    double d_variants = 0;
    for (const char* tag : {"sharded", "f16", "bf16"}) {
        const std::string vdir = dir + "/hf_" + tag;
        if (!fs::exists(vdir)) continue;
        ModelRef v = load_hf_model(L, vdir, cpu, "hf_check:");
        v->model->forward(batch);
        const double d = max_abs_diff(v->model->logits(batch),
                                      ref.read_f32(std::string("logits_") + tag));
        std::printf("%s: %s checkpoint: logits max|diff| %.3g\n", name.c_str(), tag, d);
        d_variants = std::max(d_variants, d);
    }

    // exports: as loaded, and extended to twice the context with our logits on longer rows
    const auto tok = load_tokenizer(dir + "/hf");
    save_hf_model(*engine.comm, *h, dir + "/export_hf", dir + "/hf", tok.get());
    const int Le = 2 * m.config().context_length;
    m.extend(Le, nullptr, nullptr);
    const StTensor* tl = ref.find("tokens_long");
    CTX_CHECK(tl && tl->shape.size() == 2 && tl->shape[1] == Le,
              "reference.safetensors: tokens_long must be (B, {})", Le);
    const BatchBuffers long_rows = rows_from(ref.read_f32("tokens_long"), int(tl->shape[0]), Le);
    m.forward(long_rows.batch());
    const std::vector<float> long_logits = m.logits(long_rows.batch());
    write_safetensors(dir + "/extended_logits.safetensors",
                      {{"logits", {tl->shape[0], Le, m.config().vocab_size}, long_logits.data()}},
                      {{"format", "pt"}});
    save_hf_model(*engine.comm, *h, dir + "/extended_hf", dir + "/hf", tok.get());

    const bool ok = d_logits < kTol && d_loss < kTol && d_variants < kTol &&
                    d_grad < kTol * std::max(1.0, g_max);
    if (!ok) std::printf("%s: FAILED (tolerance %g)\n", name.c_str(), kTol);
    return ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
    if (argc != 2) {
        std::fprintf(stderr, "usage: hf_check CASE_DIR\n");
        return 2;
    }
    try {
        return run(argv[1]);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "hf_check: %s\n", e.what());
        return 1;
    }
}
