// Shared helpers for model-level tests: the real plugins from the build tree, PE instances with
// options checked against the plugin's schema, tiny configs and batches.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <variant>
#include <vector>

#include <gtest/gtest.h>

#include "backend/backend.h"
#include "core/error.h"
#include "core/options.h"
#include "core/rng.h"
#include "data/token_source.h"
#include "model/decoder.h"
#include "plugin/pe_plugin.h"
#include "plugin/plugin_instance.h"
#include "plugin/registry.h"

namespace ctx::test {

inline PluginRegistry& plugins() {
    static PluginRegistry reg;
    static bool scanned = false;
    if (!scanned) {
        // The build tree's plugins; CTX_TEST_PLUGINS points a relocated test binary (the GPU
        // bundle, docs/CUDA.md) at its own copies.
        const char* dir = std::getenv("CTX_TEST_PLUGINS");
        reg.scan_directory(dir ? std::string(dir) : std::string(CTX_TEST_BINARY_DIR) + "/plugins");
        scanned = true;
    }
    return reg;
}

inline Backend& cpu() {
    static std::unique_ptr<Backend> be = make_cpu_backend(0);
    return *be;
}

using OptionValue = std::variant<double, std::string, bool>;

// Builds PE options as the Lua front end would from a recipe's table: every key must be in the
// plugin's schema, with a value of its type (an Integer option takes an integral number), and
// required keys present. No Lua here, so the tests that use this link no Lua runtime (the GPU
// bundle's test executables stay small).
inline std::unique_ptr<PePlugin> make_pe(const std::string& name, const ModelConfig& c,
                                         const std::map<std::string, OptionValue>& opts = {},
                                         uint64_t seed = 1) {
    if (name == "none") return nullptr;
    const LoadedPlugin& lib = plugins().get("pe/" + name);
    const std::vector<OptSpec> schema = plugin_option_schema(*lib.descriptor);
    Options o("test:", "pe/" + name + " options");
    for (const auto& [k, v] : opts) {
        auto spec = std::find_if(schema.begin(), schema.end(),
                                 [&](const OptSpec& x) { return x.name == k; });
        CTX_CHECK(spec != schema.end(), "test: pe/{} has no option '{}'", name, k);
        const double* d = std::get_if<double>(&v);
        switch (spec->type) {
            case OptType::Number:
                CTX_CHECK(d, "test: pe/{} option '{}' expects a number", name, k);
                o.set(k, *d);
                break;
            case OptType::Integer:
                CTX_CHECK(d && *d == std::floor(*d), "test: pe/{} option '{}' expects an integer",
                          name, k);
                o.set(k, static_cast<int64_t>(*d));
                break;
            case OptType::Bool:
                CTX_CHECK(std::holds_alternative<bool>(v), "test: pe/{} option '{}' expects a "
                          "boolean", name, k);
                o.set(k, std::get<bool>(v));
                break;
            case OptType::String:
                CTX_CHECK(std::holds_alternative<std::string>(v), "test: pe/{} option '{}' "
                          "expects a string", name, k);
                o.set(k, std::get<std::string>(v));
                break;
            default:
                CTX_CHECK(false, "test: pe/{} option '{}': make_pe takes scalar options only",
                          name, k);
        }
    }
    for (const OptSpec& spec : schema)
        CTX_CHECK(!spec.required || opts.count(spec.name), "test: pe/{} needs option '{}'", name,
                  spec.name);
    ctx_model_info info{sizeof(ctx_model_info), c.d_model, c.n_head, c.head_dim(),
                        c.n_layer, c.vocab_size, c.context_length};
    return std::make_unique<PePlugin>(lib, info, o, seed);
}

inline ModelConfig tiny_config() {
    ModelConfig c;
    c.vocab_size = 13;
    c.d_model = 16;
    c.n_head = 2;
    c.n_layer = 2;
    c.ffn_hidden = 24;
    c.context_length = 12;
    c.init_std = 0.3f;  // large enough that gradients are far from zero
    return c;
}

// The Llama block's knobs on a (tiny) config: RMSNorm, SwiGLU, untied head, no biases.
inline void use_llama_block(ModelConfig& c) {
    const ModelConfig l = ModelConfig::from_style("llama");
    c.norm = l.norm;
    c.activation = l.activation;
    c.tied_embeddings = l.tied_embeddings;
    c.attention_bias = c.attention_out_bias = c.mlp_bias = c.norm_bias = false;
}

// Two rows of six tokens with fractional, non-contiguous original positions and a partial mask.
inline BatchBuffers tiny_batch(int vocab) {
    BatchBuffers b;
    b.resize(2, 6);
    const float pos[12] = {0, 1.5f, 2, 4.25f, 7, 9, 3, 4, 5, 6, 10, 11};
    for (int i = 0; i < 12; ++i) {
        b.tokens[i] = (i * 7 + 3) % vocab;
        b.targets[i] = (i * 5 + 1) % vocab;
        b.positions[i] = pos[i];
        b.mask[i] = (i == 4 || i == 8) ? 0.0f : 1.0f;
    }
    return b;
}

// How check_model_gradients samples entries (defaults: test_model.cpp's whole-model check).
struct GradCheckOptions {
    int samples_per_view = 6;     // random entries checked in each larger view
    bool all_small_views = true;  // views of <= 8 entries are checked whole
    bool all_pe_entries = false;  // every entry of the PE's parameters ("pe.*")
    bool require_pe_gradient = false;  // at least two PE entries must get a gradient
    uint64_t seed = 42;
};

inline double mean_loss(Model& m, const Batch& b) { return m.forward(b).mean(); }

// A PE plugin name with recipe-style options (parameterised model tests).
struct PeCase {
    std::string pe;
    std::map<std::string, OptionValue> opts;
};
inline void PrintTo(const PeCase& c, std::ostream* os) { *os << c.pe; }

// An arena's contents in host memory, whatever the backend.
inline std::vector<float> host_copy(Backend& be, const Arena& a) {
    std::vector<float> h(a.size());
    be.copy_to_host(h.data(), a.data(), a.size());
    return h;
}

inline bool bit_equal(const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// The analytic gradient of the mean masked loss against central differences (eps 1e-2) on
// sampled entries of every parameter view, entry by entry and as a vector per view.
inline void check_model_gradients(Model& m, const BatchBuffers& buf, const std::string& label,
                                  const GradCheckOptions& opt = {}) {
    const Batch b = buf.batch();
    double mask_sum = 0;
    for (float x : buf.mask) mask_sum += x;
    cpu().zero(m.grads().data(), m.grads().size());
    m.forward_backward(b, static_cast<float>(1.0 / mask_sum));
    float* p = m.params().data();
    const float* g = m.grads().data();
    Rng rng(opt.seed);
    const double eps = 1e-2;
    int checked = 0, pe_nonzero = 0;
    for (const ParamView& v : m.layout().views()) {
        const bool is_pe = v.name.rfind("pe.", 0) == 0;
        std::vector<size_t> idx;
        if ((opt.all_small_views && v.numel <= 8) || (opt.all_pe_entries && is_pe)) {
            for (size_t i = 0; i < v.numel; ++i) idx.push_back(i);
        } else {
            for (int k = 0; k < opt.samples_per_view; ++k)
                idx.push_back(static_cast<size_t>(rng.below(v.numel)));
        }
        double num_sq = 0, diff_sq = 0, ana_sq = 0;
        for (size_t i : idx) {
            float& x = p[v.offset + i];
            const float orig = x;
            x = static_cast<float>(orig + eps);
            const double lp = mean_loss(m, b);
            x = static_cast<float>(orig - eps);
            const double lm = mean_loss(m, b);
            x = orig;
            const double numeric = (lp - lm) / (2 * eps);
            const double analytic = g[v.offset + i];
            num_sq += numeric * numeric;
            ana_sq += analytic * analytic;
            diff_sq += (numeric - analytic) * (numeric - analytic);
            ++checked;
            if (is_pe && std::fabs(analytic) > 1e-5) ++pe_nonzero;
            EXPECT_NEAR(analytic, numeric, 2e-3 + 3e-2 * std::fabs(numeric))
                << label << ": " << v.name << "[" << i << "]";
        }
        // The losses are float: a central difference carries about ulp(loss) / (2 eps) ~ 2e-5
        // of rounding per entry, so the per-view relative error means something only for
        // gradients well above that (smaller ones are bounded by the entrywise check above).
        const double scale = std::max(std::sqrt(num_sq), std::sqrt(ana_sq));
        if (scale > 1e-3) {
            EXPECT_LT(std::sqrt(diff_sq) / scale, 2e-2)
                << label << ": " << v.name << " |numeric| " << std::sqrt(num_sq) << " |analytic| "
                << std::sqrt(ana_sq) << " |diff| " << std::sqrt(diff_sq);
        }
    }
    EXPECT_GT(checked, 40);
    if (opt.require_pe_gradient) {
        EXPECT_GT(pe_nonzero, 1) << label << ": the PE parameters get no gradient";
    }
}

}  // namespace ctx::test
