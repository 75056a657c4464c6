#include "data/batch_source.h"

#include <cstring>

#include "core/error.h"

namespace ctx {

uint64_t rank_seed(uint64_t seed, int rank) {
    return seed * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(rank) * 0xD1B54A32D192ED03ull;
}

TokenStream::TokenStream(std::shared_ptr<const TokenSource> source, uint64_t seed, int rank)
    : source_(std::move(source)), rng_(rank_seed(seed, rank)) {}

void TokenStream::next(BatchBuffers& out, int B, int T) { source_->sample(out, B, T, rng_); }

void TokenStream::save(TrainingState& state, Comm& comm) const {
    const Rng::State mine = rng_.state();
    TrainingState::RngState packed;
    packed.words = mine.words;
    packed.has_spare = mine.has_spare;
    packed.spare = mine.spare;
    state.rank_rngs.assign(static_cast<size_t>(comm.size()), {});
    comm.allgather(&packed, sizeof(packed), state.rank_rngs.data());
}

void TokenStream::restore(const TrainingState& state, Comm& comm) {
    CTX_CHECK(state.rank_rngs.size() == static_cast<size_t>(comm.size()),
              "the checkpoint holds the data streams of {} ranks but this run has {}; rows drawn "
              "from an in-memory source depend on the rank, so resume with the same number of "
              "ranks", state.rank_rngs.size(), comm.size());
    const auto& s = state.rank_rngs[static_cast<size_t>(comm.rank())];
    rng_.set_state(Rng::State{s.words, s.has_spare, s.spare});
}

}  // namespace ctx
