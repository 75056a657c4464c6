#include "parallel/grid.h"

#include <fmt/format.h>

#include "core/error.h"

namespace ctx {

ParallelGrid::ParallelGrid(Comm& world, const GridShape& shape) : world_(world), shape_(shape) {
    const int W = world.size();
    CTX_CHECK(shape.tp >= 1, "tp must be >= 1, got {}", shape.tp);
    CTX_CHECK(shape.cp >= 1, "cp must be >= 1, got {}", shape.cp);
    CTX_CHECK(W % (shape.tp * shape.cp) == 0,
              "the world of {} ranks does not factor as dp x cp {} x tp {}: launch a multiple of "
              "tp x cp = {} ranks", W, shape.cp, shape.tp, shape.tp * shape.cp);
    dp_ = W / (shape.tp * shape.cp);
    const int r = world.rank();
    tp_rank_ = r % shape.tp;
    cp_rank_ = (r / shape.tp) % shape.cp;
    dp_rank_ = r / (shape.tp * shape.cp);
    // Every split is collective over the world: the same three calls on every rank.
    tp_comm_ = world.split(dp_rank_ * shape.cp + cp_rank_, tp_rank_);
    cp_comm_ = world.split(dp_rank_ * shape.tp + tp_rank_, cp_rank_);
    dp_comm_ = world.split(cp_rank_ * shape.tp + tp_rank_, dp_rank_);
    dp_cp_comm_ = world.split(tp_rank_, dp_rank_ * shape.cp + cp_rank_);
}

std::string ParallelGrid::describe() const {
    return fmt::format("dp {} x cp {} x tp {} ({} ranks)", dp_, shape_.cp, shape_.tp,
                       world_.size());
}

}  // namespace ctx
