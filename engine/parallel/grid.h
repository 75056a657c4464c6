// The process grid (docs/PARALLEL.md): world = dp x cp x tp. Tensor-parallel ranks are adjacent
// (the fastest-varying coordinate, so a group sits on one node when tp divides the GPUs per
// node), then context-parallel, then data-parallel:
//   world rank = (dp_rank * cp + cp_rank) * tp + tp_rank
// Each rank belongs to one group of each kind; the groups are communicators split from the
// world (MPI_Comm_split), so collectives of one group never involve the others.
#pragma once

#include <memory>
#include <string>

#include "parallel/comm.h"

namespace ctx {

struct GridShape {
    int tp = 1;  // tensor-parallel ranks per model replica
    int cp = 1;  // context-parallel ranks per row
};

class ParallelGrid {
public:
    // Collective over `world`. Throws ctx::Error when tp or cp is < 1 or tp x cp does not divide
    // the world size.
    ParallelGrid(Comm& world, const GridShape& shape);

    int tp() const { return shape_.tp; }
    int cp() const { return shape_.cp; }
    int dp() const { return dp_; }
    int tp_rank() const { return tp_rank_; }
    int cp_rank() const { return cp_rank_; }
    int dp_rank() const { return dp_rank_; }

    Comm& world() const { return world_; }
    Comm& tp_group() const { return *tp_comm_; }  // same dp and cp coordinates
    Comm& cp_group() const { return *cp_comm_; }  // same dp and tp coordinates
    Comm& dp_group() const { return *dp_comm_; }  // same cp and tp coordinates: different rows
    // same tp coordinate: every rank holding the same parameters (gradients are summed over it)
    Comm& dp_cp_group() const { return *dp_cp_comm_; }

    // "dp 2 x cp 1 x tp 2 (4 ranks)"
    std::string describe() const;

private:
    Comm& world_;
    GridShape shape_;
    int dp_ = 1, tp_rank_ = 0, cp_rank_ = 0, dp_rank_ = 0;
    std::unique_ptr<Comm> tp_comm_, cp_comm_, dp_comm_, dp_cp_comm_;
};

}  // namespace ctx
