#include "io/sparsity_file.h"

#include <filesystem>
#include <map>
#include <vector>

#include "core/error.h"
#include <fmt/ranges.h>

#include "io/safetensors.h"

namespace ctx {

namespace {

constexpr const char* kFormat = "ctxengine.sparsity_predictors";
constexpr int kVersion = 1;

std::map<std::string, std::string> shape_metadata(const ModelConfig& c) {
    return {{"n_layer", std::to_string(c.n_layer)},
            {"d_model", std::to_string(c.d_model)},
            {"n_head", std::to_string(c.n_head)},
            {"ffn", std::to_string(c.ffn())}};
}

}  // namespace

void save_predictors(const SparsityPredictors& p, const std::string& path) {
    std::vector<float> host(p.layout().total());
    p.backend().copy_to_host(host.data(), p.params().data(), host.size());
    std::vector<StWriteTensor> tensors;
    for (const ParamView& v : p.layout().views())
        tensors.push_back({v.name, v.shape, host.data() + v.offset});
    std::map<std::string, std::string> meta = shape_metadata(p.config());
    meta["format"] = kFormat;
    meta["version"] = std::to_string(kVersion);
    meta["unit_rank"] = std::to_string(p.shape().unit_rank);
    meta["head_rank"] = std::to_string(p.shape().head_rank);
    meta["label_units"] = fmt::format("{}", p.shape().label_units);
    meta["label_heads"] = fmt::format("{}", p.shape().label_heads);
    const std::filesystem::path parent = std::filesystem::path(path).parent_path();
    std::error_code ec;
    if (!parent.empty()) std::filesystem::create_directories(parent, ec);
    CTX_CHECK(!ec, "{}: cannot create the directory {}: {}", path, parent.string(), ec.message());
    write_safetensors(path, tensors, meta);
}

std::unique_ptr<SparsityPredictors> load_predictors(const std::string& path,
                                                    const ModelConfig& config, Backend& backend) {
    const SafetensorsFile f(path);
    const auto& meta = f.metadata();
    auto get = [&](const std::string& key) {
        auto it = meta.find(key);
        CTX_CHECK(it != meta.end(), "{}: not a sparsity predictors file (metadata has no '{}')",
                  path, key);
        return it->second;
    };
    CTX_CHECK(get("format") == kFormat, "{}: format '{}', expected '{}'", path, get("format"),
              kFormat);
    CTX_CHECK(get("version") == std::to_string(kVersion), "{}: version {} of the predictors "
              "format; this build reads version {}", path, get("version"), kVersion);
    for (const auto& [key, want] : shape_metadata(config))
        CTX_CHECK(get(key) == want, "{}: predictors for a model with {} = {}, this model has {}",
                  path, key, get(key), want);
    PredictorShape shape;
    try {
        shape.unit_rank = std::stoi(get("unit_rank"));
        shape.head_rank = std::stoi(get("head_rank"));
        shape.label_units = std::stof(get("label_units"));
        shape.label_heads = std::stof(get("label_heads"));
    } catch (const std::logic_error&) {
        fail("{}: malformed predictor metadata (ranks and label fractions must be numbers)", path);
    }
    auto p = std::make_unique<SparsityPredictors>(config, backend, shape, 0);
    std::vector<float> host(p->layout().total(), 0.0f);
    for (const ParamView& v : p->layout().views()) {
        const StTensor* t = f.find(v.name);
        CTX_CHECK(t != nullptr, "{}: tensor '{}' is missing", path, v.name);
        CTX_CHECK(t->shape == v.shape, "{}: tensor '{}' has shape {}, expected {}", path, v.name,
                  fmt::join(t->shape, "x"), fmt::join(v.shape, "x"));
        f.read_f32(*t, host.data() + v.offset);
    }
    CTX_CHECK(f.tensors().size() == p->layout().views().size(), "{}: {} tensors, expected {}",
              path, f.tensors().size(), p->layout().views().size());
    backend.copy_to_device(p->params().data(), host.data(), host.size());
    return p;
}

}  // namespace ctx
