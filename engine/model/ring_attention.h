// Context parallelism (docs/PARALLEL.md): ring attention over a row split across the cp ranks
// of a group. Each rank holds its tokens of every row (the zigzag split: 2 cp chunks, rank r
// takes chunks r and 2 cp - 1 - r, so causal work is balanced), with their global indices and
// positions. Per layer:
//   forward : q, k rotated by this rank's positions; the ring passes the [k | v] blocks on, one
//             step at a time; each step attends this rank's queries to the block it holds
//             (Backend::attention_block_forward: causal by global index, bias by positions) and
//             merges by log-sum-exp; out and lse are kept.
//   backward: the ring again, each block travelling with the gradient of its keys and values,
//             which every rank adds to; after cp steps each block is home with its whole dk, dv.
// Every rank of the group has the whole batch on the host, so the positions and indices of any
// rank's block are known locally and only [k | v] (and its gradient) travel.
// Memory: the blocks, their metadata and bias tables live in backend memory (device memory on a
// GPU); on a device backend the ring's step runs on the device (NCCL send/recv) where the build
// has it, else it is staged through host memory over the group's Comm.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "backend/backend.h"
#include "model/arena.h"
#include "model/attention_step.h"
#include "parallel/comm.h"
#include "parallel/device_collectives.h"

namespace ctx {

// Global indices of rank r's tokens in a row of T (T divisible by 2 cp), ascending.
std::vector<int32_t> zigzag_indices(int T, int cp, int r);

// A generic-bias PE (its own function of each pair of tokens, e.g. FIRE) across the ring:
// fill writes a (B, H, Tq, Tk) table (B rows) for the visible pairs of a query block and a key block,
// grad takes the gradient of such a table back to the PE parameters (accumulating).
struct BlockBias {
    std::function<void(float* table, const AttnBlockRows& q, const AttnBlockRows& k, int B)> fill;
    std::function<void(const float* dtable, const AttnBlockRows& q, const AttnBlockRows& k,
                       int B)>
        grad;
};

class RingAttention final : public AttentionStep {
public:
    // C, H: this rank's attention width and heads (tensor parallelism may split them).
    // Collective over cp on a device backend (its device collectives are built).
    RingAttention(Backend& backend, int C, int H, Comm& cp);
    // A pass over B rows of T tokens (the whole row): positions and doc_start (B, T) host
    // memory of the whole batch (doc_start may be null); local_positions (B, T / cp) this rank's
    // tokens' positions in backend memory (rotary reads them).
    void begin(int B, int T, const float* positions, const int32_t* doc_start,
               const float* local_positions, const RotarySpec& rotary,
               const AttentionOptions& opt);
    // A generic bias for the passes that follow (empty: the bias of begin's options). Its tables
    // are the same for every layer: begin fills one per key block, the layers' gradients add up,
    // and finish_backward hands them to the PE.
    void set_block_bias(BlockBias b) { block_bias_ = std::move(b); }
    void finish_backward();
    // qkv (B, T / cp, 3C) of this rank's tokens; saved: lse (B, H, T / cp).
    void forward(int layer, float* qkv, Operand out, float* saved) override;
    void backward(int layer, float* dqkv, const float* dout, const float* qkv, const float* saved,
                  Operand out, GradStore store) override;

private:
    struct BlockMeta {  // one rank's tokens: (B, Tl) each, host memory
        std::vector<int32_t> index, doc_start;
        std::vector<float> positions;
        AttnBlockRows rows(int Tl) const {
            return AttnBlockRows{Tl, index.data(), positions.data(),
                                 doc_start.empty() ? nullptr : doc_start.data()};
        }
    };
    bool host_memory() const { return be_.kind() == DeviceKind::CPU; }
    // Rank r's block for the backend's ops: the host metadata on the CPU, its device copy else.
    AttnBlockRows block_rows(int r) const;
    void upload_meta();
    void take_kv(const float* qkv, float* kv);  // kv (B, Tl, 2C) = [k | v] of qkv
    // One ring step of kv_floats_ from cur into next: started (on the host path the exchange
    // runs while the caller computes), then finished (waits, stages in, swaps cur and next).
    std::unique_ptr<Comm::Exchange> start_pass(const Arena& cur, Arena& next);
    void finish_pass(std::unique_ptr<Comm::Exchange> x, Arena& cur, Arena& next);
    void pass(Arena& cur, Arena& next) { finish_pass(start_pass(cur, next), cur, next); }
    void ensure(Arena& a, size_t n);            // at least n floats (grows only)

    Backend& be_;
    int C_, H_;
    Comm& cp_;
    int B_ = 0, Tl_ = 0;
    size_t kv_floats_ = 0;
    std::vector<BlockMeta> meta_;  // per cp rank
    Arena meta_dev_;               // per cp rank: index | positions | doc_start, (B, Tl) each
    const float* local_positions_ = nullptr;
    OwnedRotarySpec rotary_;
    AttentionOptions opt_;
    BlockBias block_bias_;
    // Generic bias, per key block: tables filled on the host, used from backend memory; their
    // gradients gathered in backend memory and handed to the PE on the host.
    std::vector<std::vector<float>> tables_, dtables_;
    std::vector<Arena> tables_dev_, dtables_dev_;
    AttentionOptions options_for(int src, bool with_grad);
    Arena kv_, kv_next_, dkv_, dkv_next_, out_b_, lse_b_;
    std::vector<float> send_stage_, recv_stage_;  // device backends: the ring's host staging
    std::unique_ptr<DeviceCollectives> device_;   // the ring on the device (NCCL), else null
};

}  // namespace ctx
