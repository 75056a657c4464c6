// The host side of a sampler plugin (METHODS.md 2): creates the instance from validated options,
// calls sample(), turns ctx_status errors into ctx::Error prefixed with the plugin's name, and
// checks every row the plugin returns before the trainer sees it.
#pragma once

#include <cstdint>
#include <string>

#include "core/options.h"
#include "ctx/plugin.h"
#include "data/row_sampler.h"
#include "plugin/plugin_instance.h"
#include "plugin/registry.h"

namespace ctx {

class SamplerPlugin final : public RowSampler {
public:
    // options must already be validated against plugin_option_schema(*lib.descriptor).
    // vocab_size bounds the tokens and targets of every row. seed feeds host->rng_u64 (the
    // per-row stream is the rng_state passed to sample(), not this).
    SamplerPlugin(const LoadedPlugin& lib, const Options& options, int32_t vocab_size,
                  uint64_t seed = 0);
    ~SamplerPlugin() override;
    SamplerPlugin(const SamplerPlugin&) = delete;
    SamplerPlugin& operator=(const SamplerPlugin&) = delete;

    const std::string& name() const override { return name_; }  // "sampler/chunk"
    const std::string& path() const { return lib_->path; }

    // Rows must have strictly increasing positions (true by default: every sampler of METHODS 2
    // keeps tokens in their original order without repeats). With false, non-decreasing is
    // enough (for a future sampler that repeats a position).
    void set_strict_positions(bool strict) { strict_ = strict; }

    // window: window_len + 1 tokens (the last only a target). row: caller-owned buffers of
    // row.row_len entries. Throws ctx::Error "<name>: sample failed (status N): <message>" or
    // "<name>: invalid row: <what>" (a token or target outside the vocabulary, a non-finite or
    // decreasing position, a mask other than 0 or 1).
    void sample(const int32_t* window, int64_t window_len, uint64_t rng_state[4],
                ctx_sample_row& row) override;

private:
    void validate(const ctx_sample_row& row) const;

    const LoadedPlugin* lib_;
    const ctx_sampler_vtable* vt_;
    std::string name_;
    int32_t vocab_;
    bool strict_ = true;
    PluginInstance instance_;
};

// The checks every row gets before the trainer sees it, whatever made it (a plugin, a Lua
// sampler): tokens and targets in [0, vocab), finite positions that increase (strictly, or
// without decreasing), masks of 0 or 1. Throws ctx::Error "<name>: invalid row: <what>".
void validate_sample_row(const ctx_sample_row& row, int32_t vocab, bool strict,
                         const std::string& name);

}  // namespace ctx
