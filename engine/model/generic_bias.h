// The host side of a generic PE bias (CTX_BIAS_GENERIC, ABI 1.1): packs every causal
// (query, key) pair of a pass as (distance p_c - p_j, query position p_c), asks the plugin for
// each head's bias of all pairs at once, and lays the values out as the attention op's Table
// bias; backward gathers d(table) at the same pairs for the plugin. Training (whole rows) and
// generation (new queries over a cache) pack through the same code: a row's queries are its last
// Tq keys.
#pragma once

#include <cstdint>
#include <vector>

#include "ctx/plugin.h"
#include "plugin/pe_plugin.h"

namespace ctx {

class GenericBiasPairs {
public:
    // Room for `pairs` pairs without reallocating (reserve once, so steps allocate nothing).
    void reserve(size_t pairs);
    // rows rows; row r's keys sit at kpos + r * kpos_stride (host), lens[r] of them (nullptr:
    // Tq each), and its queries are keys lens[r] - Tq .. lens[r] - 1. doc_start (rows, Tq), whole
    // rows only (lens null): packed rows, whose pairs across documents are left out (the
    // attention op masks them, and their distances may be negative).
    void pack(int rows, int Tq, const float* kpos, size_t kpos_stride, const int32_t* lens,
              const int32_t* doc_start = nullptr);
    // table (rows, H, Tq, S), host memory: entry [r, h, t, j] = f_h of query t and key j for
    // doc_start[r, t] <= j <= lens[r] - Tq + t (other entries untouched).
    void forward(PePlugin& pe, const std::vector<ctx_tensor>& params, int H, int S, float* table);
    // Hands the plugin dtable (same layout) at the packed pairs, head by head.
    void backward(PePlugin& pe, const std::vector<ctx_tensor>& params,
                  std::vector<ctx_tensor>& grads, int H, int S, const float* dtable);

private:
    int rows_ = 0, Tq_ = 0;
    std::vector<int32_t> first_;             // (rows) the key index of each row's first query
    std::vector<int32_t> lo_;                // (rows, Tq) each query's first key
    std::vector<float> dist_, qpos_, val_;   // (pairs)
};

}  // namespace ctx
