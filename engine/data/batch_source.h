// Where training rows come from. A source owns its position (cursor, RNG) so that a checkpoint
// can save it and a resumed run continues with exactly the rows it would have seen.
#pragma once

#include "core/rng.h"
#include "core/training_state.h"
#include "data/token_source.h"
#include "parallel/comm.h"

namespace ctx {

class BatchSource {
public:
    virtual ~BatchSource() = default;
    // This rank's B rows of the next global batch, each T tokens.
    virtual void next(BatchBuffers& out, int B, int T) = 0;
    // Sources that always yield the same batch shape say so (and what it is).
    virtual bool fixed_shape(int* /*B*/, int* /*T*/) const { return false; }
    // Document windows the rows are drawn from (0 for sources that are not windowed).
    virtual int64_t num_windows() const { return 0; }
    // Collective (every rank calls it): writes the position into state (cursor, per-rank RNGs).
    virtual void save(TrainingState& state, Comm& comm) const = 0;
    // Collective: continues from a saved position. Throws when the state cannot be used (e.g. it
    // was saved by a different number of ranks and the source's rows depend on the rank).
    virtual void restore(const TrainingState& state, Comm& comm) = 0;
};

// Random contiguous windows of an in-memory token stream (smoke data). Each rank draws from its
// own RNG stream, seeded from (seed, rank) at construction.
class TokenStream final : public BatchSource {
public:
    TokenStream(std::shared_ptr<const TokenSource> source, uint64_t seed, int rank);
    void next(BatchBuffers& out, int B, int T) override;
    void save(TrainingState& state, Comm& comm) const override;
    void restore(const TrainingState& state, Comm& comm) override;
    const TokenSource& source() const { return *source_; }

private:
    std::shared_ptr<const TokenSource> source_;
    Rng rng_;
};

// The seed of rank `rank`'s stream for a user seed (distinct streams per rank).
uint64_t rank_seed(uint64_t seed, int rank);

}  // namespace ctx
