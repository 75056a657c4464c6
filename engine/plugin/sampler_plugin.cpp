#include "plugin/sampler_plugin.h"

#include <cmath>

#include "core/error.h"

namespace ctx {

SamplerPlugin::SamplerPlugin(const LoadedPlugin& lib, const Options& options, int32_t vocab_size,
                             uint64_t seed)
    : lib_(&lib), vt_(static_cast<const ctx_sampler_vtable*>(lib.descriptor->vtable)),
      name_(lib.full_name), vocab_(vocab_size),
      // Samplers declare no parameters: registering stays null, so register_param fails cleanly.
      instance_(require_kind(lib, CTX_PLUGIN_SAMPLER, "a sampler"), options, seed, vt_->create,
                vt_->destroy) {
    CTX_CHECK(vocab_size > 0, "{}: vocab_size must be positive, got {}", name_, vocab_size);
}

SamplerPlugin::~SamplerPlugin() = default;

void SamplerPlugin::sample(const int32_t* window, int64_t window_len, uint64_t rng_state[4],
                           ctx_sample_row& row) {
    CTX_CHECK(window != nullptr && window_len > 0, "{}: sample needs a window (got {} tokens)",
              name_, window_len);
    CTX_CHECK(row.row_len > 0 && row.tokens && row.positions && row.targets && row.loss_mask,
              "{}: sample needs row buffers of positive length (got {})", name_, row.row_len);
    const int64_t row_len = row.row_len;
    ctx_err err{};
    instance_.check(vt_->sample(instance_.get(), window, window_len, rng_state, &row, &err),
                    "sample", err);
    CTX_CHECK(row.row_len == row_len, "{}: invalid row: the plugin changed row_len from {} to {}",
              name_, row_len, row.row_len);
    validate(row);
}

void SamplerPlugin::validate(const ctx_sample_row& row) const {
    validate_sample_row(row, vocab_, strict_, name_);
}

void validate_sample_row(const ctx_sample_row& row, int32_t vocab, bool strict,
                         const std::string& name) {
    for (int64_t i = 0; i < row.row_len; ++i) {
        CTX_CHECK(row.tokens[i] >= 0 && row.tokens[i] < vocab,
                  "{}: invalid row: token {} at index {} is outside the vocabulary [0, {})",
                  name, row.tokens[i], i, vocab);
        CTX_CHECK(row.targets[i] >= 0 && row.targets[i] < vocab,
                  "{}: invalid row: target {} at index {} is outside the vocabulary [0, {})",
                  name, row.targets[i], i, vocab);
        CTX_CHECK(std::isfinite(row.positions[i]), "{}: invalid row: position {} at index {} "
                  "is not finite", name, row.positions[i], i);
        CTX_CHECK(row.loss_mask[i] == 0.0f || row.loss_mask[i] == 1.0f,
                  "{}: invalid row: loss mask {} at index {} is not 0 or 1", name,
                  row.loss_mask[i], i);
        if (i > 0) {
            const float a = row.positions[i - 1], b = row.positions[i];
            CTX_CHECK(strict ? a < b : a <= b,
                      "{}: invalid row: positions must {}, but index {} has {} after {}", name,
                      strict ? "increase strictly" : "not decrease", i, b, a);
        }
    }
}

}  // namespace ctx
