// ctx.sampler.lua(fn [, {name = "..."}]): a training-row sampler written in Lua (METHODS.md 2's
// contract, as a sampler plugin's sample()). For every row the host calls
//     fn(window, window_len, row_len, rng) -> {tokens =, positions =, targets =, mask =}
// window[p + 1] is the token at original position p (p = 0 .. window_len; the last one only a
// target); the four lists have row_len entries (mask optional: all 1); rng:below(n) and
// rng:uniform() draw from the row's own stream (rows stay reproducible per row and independent
// of batching and ranks); rng is valid only during the call. The row then gets exactly the
// checks plugin rows get (validate_sample_row). Errors name the sampler and the recipe line that
// made it, with the Lua traceback.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "data/row_sampler.h"
#include "lua/options.h"

struct lua_State;

namespace ctx::lua {

class LuaRowSampler final : public RowSampler {
public:
    // fn: a function in the state of the run (the state outlives every row stream).
    LuaRowSampler(std::shared_ptr<const LuaRef> fn, std::string name, std::string where,
                  int32_t vocab_size);

    const std::string& name() const override { return name_; }  // "lua:NAME"
    void sample(const int32_t* window, int64_t window_len, uint64_t rng_state[4],
                ctx_sample_row& row) override;

private:
    std::shared_ptr<const LuaRef> fn_;
    std::string name_, where_;
    int32_t vocab_;
};

// Registers the metatable of the rng handle passed to Lua samplers (once per state).
void register_lua_sampler_types(lua_State* L);

}  // namespace ctx::lua
