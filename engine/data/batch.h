// One step's rows as the model takes them, and host buffers that hold them.
#pragma once

#include <cstdint>
#include <vector>

namespace ctx {

// One step's rows, host memory. Positions are the tokens' ORIGINAL positions (floats).
struct Batch {
    int B = 0, T = 0;
    const int32_t* tokens = nullptr;   // (B, T)
    const float* positions = nullptr;  // (B, T)
    const int32_t* targets = nullptr;  // (B, T)
    const float* loss_mask = nullptr;  // (B, T) 1 = train this target
    // Packed rows (several documents per row): for each token, the index in its row of its
    // document's first token; attention never crosses documents. Null: one document per row.
    const int32_t* doc_start = nullptr;  // (B, T)
};

// Host buffers for one batch; batch() views them.
struct BatchBuffers {
    int B = 0, T = 0;
    std::vector<int32_t> tokens, targets;  // (B, T)
    std::vector<float> positions, mask;    // (B, T)
    std::vector<int32_t> doc_start;        // (B, T) packed rows, or empty (resize clears it)
    void resize(int b, int t);
    Batch batch() const;
};

}  // namespace ctx
