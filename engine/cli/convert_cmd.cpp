#include "cli/convert_cmd.h"

#include <spdlog/spdlog.h>

#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "data/tokenizer.h"
#include "io/checkpoint.h"
#include "parallel/comm.h"
#include "session/models.h"

namespace ctx {
namespace {

using json = nlohmann::json;

struct UsageError : Error {
    using Error::Error;
};

void usage(FILE* out) {
    std::fprintf(
        out,
        "usage: ctxengine convert HF_DIR OUT.h5\n"
        "       ctxengine convert --to-hf IN.h5 OUT_DIR [--tokenizer DIR|FILE]\n\n"
        "HF_DIR -> OUT.h5   a GPT-2, GPT-NeoX/Pythia or BLOOM directory (config.json,\n"
        "                   model.safetensors or model.safetensors.index.json + shards) as a\n"
        "                   checkpoint ctx.load reads (parameters, PE and its state; no\n"
        "                   optimizer state).\n"
        "--to-hf            a checkpoint (e.g. after extension) as an HF directory: config.json\n"
        "                   with the current context (and RoPE scaling), model.safetensors (F32).\n"
        "--tokenizer        copy this tokenizer's files (a directory, tokenizer.json or\n"
        "                   vocab.json) into OUT_DIR; its bos/eos ids go into config.json.\n"
        "See docs/HF.md.\n");
}

// HF_DIR -> OUT.h5: what ctx.save writes for a model without optimizer or data stream.
void hf_to_checkpoint(EngineContext& engine, const std::string& dir, const std::string& out) {
    DeviceRequest cpu;  // conversion is a copy of tensors: the CPU is enough
    cpu.device = DeviceChoice::Cpu;
    ModelRef h = model_from_hf(engine, dir, cpu, dir + ":");
    TrainingState s = model_checkpoint_state(engine, *h, nullptr, json{{"hf_source", dir}});
    const std::filesystem::path parent = std::filesystem::path(out).parent_path();
    if (!parent.empty()) std::filesystem::create_directories(parent);
    save_checkpoint(out, s);
    spdlog::info("wrote {}", out);
}

// IN.h5 -> OUT_DIR: the model part of ctx.load, then ctx.save_hf.
void checkpoint_to_hf(EngineContext& engine, const std::string& in, const std::string& out,
                      const std::string& tokenizer) {
    DeviceRequest cpu;
    cpu.device = DeviceChoice::Cpu;
    ModelRef h = model_from_checkpoint(engine, load_checkpoint(in), in, cpu);
    std::unique_ptr<Tokenizer> tok;
    if (!tokenizer.empty()) tok = load_tokenizer(tokenizer);
    save_hf_model(*engine.comm, *h, out, tokenizer, tok.get());
}

}  // namespace

int run_convert_command(const std::vector<std::string>& args, PluginRegistry& registry, Comm& comm,
                        int threads) {
    bool to_hf = false;
    std::string tokenizer;
    std::vector<std::string> pos;
    try {
        for (size_t i = 0; i < args.size(); ++i) {
            const std::string& a = args[i];
            if (a == "--help" || a == "-h") {
                usage(stdout);
                return 0;
            } else if (a == "--to-hf") {
                to_hf = true;
            } else if (a == "--tokenizer") {
                if (i + 1 >= args.size()) throw UsageError("--tokenizer needs a value");
                tokenizer = args[++i];
            } else if (a.size() > 1 && a[0] == '-') {
                throw UsageError(fmt::format("unknown option '{}'", a));
            } else {
                pos.push_back(a);
            }
        }
        if (pos.size() != 2)
            throw UsageError(fmt::format("expected 2 paths ({}), got {}",
                                         to_hf ? "IN.h5 OUT_DIR" : "HF_DIR OUT.h5", pos.size()));
        if (!to_hf && !tokenizer.empty())
            throw UsageError("--tokenizer applies to --to-hf only (HF_DIR's tokenizer stays there)");
    } catch (const UsageError& e) {
        std::fprintf(stderr, "ctxengine convert: %s\n", e.what());
        usage(stderr);
        return 2;
    }
    EngineContext engine;
    engine.registry = &registry;
    engine.comm = &comm;
    engine.threads = threads;
    engine.default_device = DeviceChoice::Cpu;  // conversion copies tensors: no GPU needed
    try {
        if (to_hf) checkpoint_to_hf(engine, pos[0], pos[1], tokenizer);
        else hf_to_checkpoint(engine, pos[0], pos[1]);
    } catch (const Error& e) {
        spdlog::error("convert: {}", e.what());
        return 1;
    }
    return 0;
}

}  // namespace ctx
