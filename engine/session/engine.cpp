#include "session/engine.h"

#include <spdlog/spdlog.h>

namespace ctx {

ParallelGrid& EngineContext::parallel() {
    if (!grid) {
        grid = std::make_unique<ParallelGrid>(*comm, grid_shape);
        if (grid->tp() > 1 || grid->cp() > 1)
            spdlog::info("parallel grid: {}", grid->describe());
    }
    return *grid;
}

Backend& EngineContext::backend(DeviceChoice device, Precision precision) {
    const DeviceKind kind = resolve_device(device);
    check_precision(kind, precision);
    const std::string key =
        fmt::format("{}:{}", kind == DeviceKind::CUDA ? "cuda" : "cpu", precision_name(precision));
    auto it = backends.find(key);
    if (it != backends.end()) return *it->second;
    std::unique_ptr<Backend> be = kind == DeviceKind::CUDA
                                      ? make_cuda_backend(cuda_device_for_this_rank(), precision)
                                      : make_cpu_backend(threads);
    if (comm->rank() == 0 || kind == DeviceKind::CUDA)
        spdlog::info("rank {}: backend {}", comm->rank(), be->name());
    Backend& ref = *be;
    backends.emplace(key, std::move(be));
    return ref;
}

GradReducer& EngineContext::grad_reducer(Backend& backend, const GradReduceOptions& o) {
    const std::string key = fmt::format("{}/{}/{}/{}/{}", static_cast<const void*>(&backend),
                                         o.bucket_bytes, o.overlap, static_cast<int>(o.precision),
                                         o.deterministic);
    auto it = reducers.find(key);
    if (it == reducers.end())
        it = reducers.emplace(key, make_grad_reducer(backend, gradient_comm(), o)).first;
    return *it->second;
}

void EngineContext::drop_grad_reducer(const GradReducer* reducer) {
    for (auto it = reducers.begin(); it != reducers.end(); ++it)
        if (it->second.get() == reducer) {
            reducers.erase(it);
            return;
        }
}

MetricsWriter& EngineContext::metrics_for(const std::string& out_dir) {
    auto it = metrics.find(out_dir);
    if (it == metrics.end())
        it = metrics.emplace(out_dir, std::make_unique<MetricsWriter>(out_dir, comm->rank() == 0))
                 .first;
    return *it->second;
}

}  // namespace ctx
