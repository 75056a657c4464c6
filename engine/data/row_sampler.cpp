#include "data/row_sampler.h"

namespace ctx {

void RowSampler::trial(const int32_t* window, int64_t window_len, int64_t row_len) {
    const auto n = static_cast<size_t>(row_len);
    std::vector<int32_t> tokens(n), targets(n);
    std::vector<float> positions(n), mask(n);
    uint64_t rng[4] = {1, 2, 3, 4};
    ctx_sample_row row{tokens.data(), positions.data(), targets.data(), mask.data(), row_len,
                       nullptr};
    sample(window, window_len, rng, row);
}

}  // namespace ctx
