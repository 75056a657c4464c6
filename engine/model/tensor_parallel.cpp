#include "model/tensor_parallel.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"

namespace ctx {

TensorShard tensor_shard(const ModelConfig& c, int rank, int size) {
    CTX_CHECK(size >= 1 && rank >= 0 && rank < size, "internal: tensor-parallel rank {} of {}",
              rank, size);
    const int H = c.n_head, Hkv = c.kv_heads(), F = c.ffn(), V = c.vocab_size;
    CTX_CHECK(H % size == 0, "tensor parallelism: tp = {} does not divide n_head = {} (each rank "
              "holds n_head / tp query heads)", size, H);
    CTX_CHECK(Hkv % size == 0, "tensor parallelism: tp = {} does not divide the {} key/value "
              "heads (n_kv_head); grouped-query models need n_kv_head divisible by tp", size,
              Hkv);
    CTX_CHECK(F % size == 0, "tensor parallelism: tp = {} does not divide the MLP width {} "
              "(ffn_hidden)", size, F);
    const int per = (V + size - 1) / size;
    CTX_CHECK(static_cast<int64_t>(per) * (size - 1) < V, "tensor parallelism: vocab_size = {} "
              "is too small to give each of tp = {} ranks a row of the vocabulary-parallel "
              "embedding", V, size);
    TensorShard s;
    s.rank = rank;
    s.size = size;
    s.C = c.d_model;
    s.D = c.head_dim();
    s.H = H / size;
    s.Hkv = Hkv / size;
    s.head0 = rank * s.H;
    s.A = s.H * s.D;
    s.Q = (s.H + 2 * s.Hkv) * s.D;
    s.F = F / size;
    s.F2 = c.gated_mlp() ? 2 * s.F : s.F;
    const Slice vocab = shard_slice(V, rank, size);
    s.V = static_cast<int>(vocab.count);
    s.vocab_begin = static_cast<int>(vocab.first);
    s.vocab_total = V;
    return s;
}

Slice shard_slice(int64_t n, int rank, int size) {
    const int64_t per = (n + size - 1) / size;
    const int64_t first = std::min<int64_t>(n, per * rank);
    return Slice{first, std::min<int64_t>(n, first + per) - first};
}

void copy_shard(float* whole, float* part, const std::vector<int64_t>& shape,
                const ShardSpec& spec, int rank, int size, bool to_part) {
    size_t numel = 1;
    for (int64_t d : shape) numel *= static_cast<size_t>(d);
    auto move = [&](float* w, float* p, size_t n) {
        if (to_part) std::memcpy(p, w, n * sizeof(float));
        else std::memcpy(w, p, n * sizeof(float));
    };
    if (spec.replicated()) {
        move(whole, part, numel);
        return;
    }
    CTX_CHECK(shape.size() <= 2 && spec.dim < static_cast<int>(shape.size()),
              "internal: shard of a {}-d tensor along dim {}", shape.size(), spec.dim);
    const size_t rows = static_cast<size_t>(shape[0]);
    const size_t cols = shape.size() == 2 ? static_cast<size_t>(shape[1]) : 1;
    if (spec.dim == 0) {  // each part: its rank-th slice of rows
        size_t off = 0, out = 0;
        for (int64_t p : spec.parts) {
            const Slice sl = shard_slice(p, rank, size);
            move(whole + (off + sl.first) * cols, part + out * cols, sl.count * cols);
            off += static_cast<size_t>(p);
            out += static_cast<size_t>(sl.count);
        }
        CTX_CHECK(off == rows, "internal: shard parts cover {} of {} rows", off, rows);
        return;
    }
    // dim 1: the same column slices of every row
    size_t part_cols = 0;
    for (int64_t p : spec.parts) part_cols += static_cast<size_t>(shard_slice(p, rank, size).count);
    for (size_t r = 0; r < rows; ++r) {
        size_t off = 0, out = 0;
        for (int64_t p : spec.parts) {
            const Slice sl = shard_slice(p, rank, size);
            move(whole + r * cols + off + sl.first, part + r * part_cols + out, sl.count);
            off += static_cast<size_t>(p);
            out += static_cast<size_t>(sl.count);
        }
    }
}

TensorGroup::TensorGroup(Comm* comm, Backend& backend) : comm_(comm), backend_(&backend) {
    if (active() && backend.kind() != DeviceKind::CPU)
        device_ = make_device_collectives(backend, *comm);
}

std::string TensorGroup::collectives_name() const {
    if (device_) return device_->name();
    return backend_ && backend_->kind() != DeviceKind::CPU ? "mpi (host staging)" : "mpi (host)";
}

void TensorGroup::allreduce_sum(float* x, size_t n) {
    if (!active() || n == 0) return;
    if (device_) {
        device_->allreduce_sum(x, n);
        return;
    }
    if (backend_->kind() == DeviceKind::CPU) {
        comm_->allreduce_sum(x, n);
        return;
    }
    stage_.resize(n);
    backend_->copy_to_host(stage_.data(), x, n);
    comm_->allreduce_sum(stage_.data(), n);
    backend_->copy_to_device(x, stage_.data(), n);
}

void TensorGroup::gather_rows(float* full, size_t n) {
    if (!sequence_parallel_) return;
    if (device_) {  // in place: this rank's rows are already at block rank
        device_->allgather(full + static_cast<size_t>(rank()) * n, n, full);
        return;
    }
    // MPI's allgather may not read from its own output: this rank's rows go through a copy
    stage_out_.resize(n);
    backend_->copy_to_host(stage_out_.data(), full + static_cast<size_t>(rank()) * n, n);
    if (backend_->kind() == DeviceKind::CPU) {
        comm_->allgather(stage_out_.data(), n * sizeof(float), full);
        return;
    }
    stage_.resize(n * static_cast<size_t>(size()));
    comm_->allgather(stage_out_.data(), n * sizeof(float), stage_.data());
    backend_->copy_to_device(full, stage_.data(), stage_.size());
}

const float* TensorGroup::gather_rows_from(const float* local, float* full, size_t n) {
    if (!sequence_parallel_) return local;
    allgather(local, n, full);
    return full;
}

void TensorGroup::sum_rows(float* partial, size_t n) {
    if (!sequence_parallel_) {
        allreduce_sum(partial, n);
        return;
    }
    const size_t all = n * static_cast<size_t>(size());
    if (device_) {
        device_->reduce_scatter_sum(partial, n);
        return;
    }
    if (backend_->kind() == DeviceKind::CPU) {
        comm_->reduce_scatter_sum(partial, n);
        return;
    }
    stage_.resize(all);
    backend_->copy_to_host(stage_.data(), partial, all);
    comm_->reduce_scatter_sum(stage_.data(), n);
    backend_->copy_to_device(partial, stage_.data(), n);
}

void TensorGroup::allgather(const float* x, size_t n, float* out) {
    if (n == 0) return;
    if (!active()) {
        backend_->copy(out, x, n);
        return;
    }
    if (device_) {
        device_->allgather(x, n, out);
        return;
    }
    if (backend_->kind() == DeviceKind::CPU) {
        comm_->allgather(x, n * sizeof(float), out);
        return;
    }
    stage_.resize(n);
    stage_out_.resize(n * static_cast<size_t>(size()));
    backend_->copy_to_host(stage_.data(), x, n);
    comm_->allgather(stage_.data(), n * sizeof(float), stage_out_.data());
    backend_->copy_to_device(out, stage_out_.data(), stage_out_.size());
}

}  // namespace ctx
