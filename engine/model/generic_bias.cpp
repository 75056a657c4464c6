#include "model/generic_bias.h"

#include <algorithm>

#include "core/error.h"

namespace ctx {

void GenericBiasPairs::reserve(size_t pairs) {
    dist_.reserve(pairs);
    qpos_.reserve(pairs);
    val_.reserve(pairs);
}

void GenericBiasPairs::pack(int rows, int Tq, const float* kpos, size_t kpos_stride,
                            const int32_t* lens, const int32_t* doc_start) {
    CTX_CHECK(!(lens && doc_start), "internal: packed rows (doc_start) are whole rows, not a cache");
    rows_ = rows;
    Tq_ = Tq;
    first_.resize(static_cast<size_t>(rows));
    lo_.assign(static_cast<size_t>(rows) * Tq, 0);
    if (doc_start) std::copy(doc_start, doc_start + lo_.size(), lo_.begin());
    dist_.clear();
    qpos_.clear();
    for (int r = 0; r < rows; ++r) {
        const int first = (lens ? lens[r] : Tq) - Tq;
        first_[static_cast<size_t>(r)] = first;
        const float* kp = kpos + static_cast<size_t>(r) * kpos_stride;
        for (int c = first; c < first + Tq; ++c)
            for (int j = lo_[static_cast<size_t>(r) * Tq + (c - first)]; j <= c; ++j) {
                dist_.push_back(static_cast<float>(static_cast<double>(kp[c]) - kp[j]));
                qpos_.push_back(kp[c]);
            }
    }
    val_.resize(dist_.size());
}

void GenericBiasPairs::forward(PePlugin& pe, const std::vector<ctx_tensor>& params, int H, int S,
                               float* table) {
    const int64_t n = static_cast<int64_t>(dist_.size());
    for (int h = 0; h < H; ++h) {
        pe.bias_forward(params, h, dist_.data(), qpos_.data(), n, val_.data());
        size_t k = 0;
        for (int r = 0; r < rows_; ++r)
            for (int t = 0; t < Tq_; ++t) {
                float* row = table + ((static_cast<size_t>(r) * H + h) * Tq_ + t) * S;  // (S)
                const int last = first_[static_cast<size_t>(r)] + t;
                const int lo = lo_[static_cast<size_t>(r) * Tq_ + t];
                for (int j = lo; j <= last; ++j) row[j] = val_[k++];
            }
    }
}

void GenericBiasPairs::backward(PePlugin& pe, const std::vector<ctx_tensor>& params,
                                std::vector<ctx_tensor>& grads, int H, int S,
                                const float* dtable) {
    const int64_t n = static_cast<int64_t>(dist_.size());
    for (int h = 0; h < H; ++h) {
        size_t k = 0;
        for (int r = 0; r < rows_; ++r)
            for (int t = 0; t < Tq_; ++t) {
                const float* row = dtable + ((static_cast<size_t>(r) * H + h) * Tq_ + t) * S;
                const int last = first_[static_cast<size_t>(r)] + t;
                const int lo = lo_[static_cast<size_t>(r) * Tq_ + t];
                for (int j = lo; j <= last; ++j) val_[k++] = row[j];
            }
        pe.bias_backward(params, grads, h, dist_.data(), qpos_.data(), n, val_.data());
    }
}

}  // namespace ctx
