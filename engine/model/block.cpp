#include "model/block.h"

#include "core/error.h"

namespace ctx {

void AttentionStep::backward(int, float*, const float*, const float*, const float*, Operand,
                             GradStore) {
    fail("internal: this attention step runs forward only (no backward pass)");
}

void norm_forward(Backend& be, const ModelConfig& c, Operand out, float* mean, float* rstd,
                  const float* inp, const float* w, const float* b, int N) {
    if (c.norm == NormKind::RMSNorm)
        rmsnorm_forward(be, out, rstd, inp, w, N, c.d_model, c.norm_eps);
    else
        layernorm_forward(be, out, mean, rstd, inp, w, b, N, c.d_model, c.norm_eps);
}

void norm_backward(Backend& be, const ModelConfig& c, float* dinp, float* dw, float* db,
                   const float* dout, const float* inp, const float* w, const float* mean,
                   const float* rstd, int N) {
    if (c.norm == NormKind::RMSNorm)
        be.rmsnorm_backward(dinp, dw, dout, inp, w, rstd, N, c.d_model);
    else
        be.layernorm_backward(dinp, dw, db, dout, inp, w, mean, rstd, N, c.d_model);
}

void norm_backward_rows(Backend& be, const ModelConfig& c, TensorGroup& tp, float* scratch,
                        float* dinp, float* dw, float* db, const float* dout, const float* inp,
                        const float* w, const float* mean, const float* rstd, int rows) {
    if (!tp.sequence_parallel()) {
        norm_backward(be, c, dinp, dw, db, dout, inp, w, mean, rstd, rows);
        return;
    }
    const size_t C = static_cast<size_t>(c.d_model);
    be.zero(scratch, 2 * C);
    norm_backward(be, c, dinp, scratch, db ? scratch + C : nullptr, dout, inp, w, mean, rstd,
                  rows);
    tp.allreduce_sum(scratch, 2 * C);
    be.accumulate(dw, scratch, C);
    if (db) be.accumulate(db, scratch + C, C);
}

void TransformerBlock::forward(const BlockWeights& w, const float* x, float* x_out,
                               const BlockActs& a, float* tmp, int N, int layer,
                               AttentionStep& attention, const BlockSparsity* sp) const {
    Backend& be = backend_;
    const ModelConfig& c = config_;
    const TensorShard& s = shard_;
    const int C = c.d_model, A = s.A, F = s.F, Q = s.Q;
    const int Nr = tp_.rows_here(N);  // rows of the residual stream on this rank
    const size_t NrC = static_cast<size_t>(Nr) * C, slot = tp_.row_offset(N) * C;
    // A row-parallel output's bias is added once: by tensor-parallel rank 0, before the sum.
    const bool add_out_bias = s.rank == 0;

    // attention branch: ln1 -> qkv (column-parallel) [-> kv heads repeated] -> attention ->
    // proj (row-parallel; summed over tp)
    norm_forward(be, c, a.ln1.at(slot), a.ln1_mean, a.ln1_rstd, x, w.ln1_w, w.ln1_b, Nr);
    if (tp_.sequence_parallel())  // every rank's rows
        tp_.gather_rows(a.ln1.fp32("sequence parallelism"), NrC);
    float* projected = c.grouped_kv() ? a.qkv_grouped : a.qkv;  // (N, Q)
    if (sp && sp->heads) {
        // q of the listed heads only; k and v of every head (rows [A, Q) of qkv_w), into place
        const int KV = Q - A;
        const float* ln1 = a.ln1.fp32("contextual sparsity");
        be.matmul_rows_forward(projected, Q, ln1, w.qkv_w, w.qkv_b, sp->heads, N, C,
                               sp->heads_k, s.D);
        be.matmul_forward(sp->kv, ln1, w.qkv_w + static_cast<size_t>(A) * C,
                          w.qkv_b ? w.qkv_b + A : nullptr, N, C, KV);
        be.copy_2d(projected + A, static_cast<size_t>(Q), sp->kv, static_cast<size_t>(KV),
                   static_cast<size_t>(N), static_cast<size_t>(KV));
    } else {
        matmul_forward(be, projected, a.ln1, w.qkv_w, w.qkv_b, N, C, Q);
    }
    if (c.grouped_kv()) be.kv_repeat_forward(a.qkv, a.qkv_grouped, N, s.H, s.Hkv, s.D);
    attention.forward(layer, a.qkv, a.atty, a.att);
    // Without tensor parallelism the residual add is the output projection's (a fused epilogue
    // on CUDA); with it the projection's partial sums are reduced first.
    const bool fused_residual = !tp_.active();
    if (sp && sp->heads) {
        be.matmul_rows_project(tmp, a.atty.fp32("contextual sparsity"), A, sp->attn_proj_t,
                               add_out_bias ? w.attn_proj_b : nullptr, sp->heads, N, C, sp->heads_k,
                               s.D);
        be.add(a.res2, x, tmp, NrC);
    } else if (fused_residual) {
        matmul_residual_forward(be, a.res2, x, a.atty, w.attn_proj_w,
                                add_out_bias ? w.attn_proj_b : nullptr, N, A, C);
    } else {
        matmul_forward(be, tmp, a.atty, w.attn_proj_w, add_out_bias ? w.attn_proj_b : nullptr, N, A,
                       C);
        tp_.sum_rows(tmp, NrC);       // all-reduce, or reduce-scatter into tmp[0, NrC)
        be.add(a.res2, x, tmp, NrC);  // sequential: x + attn; parallel: also x + attn
    }

    // MLP branch: ln2 of (x + attn) sequentially, of x in parallel; fc (column-parallel) ->
    // activation (or SwiGLU of [gate | up]) -> fc_proj (row-parallel; summed over tp)
    const float* mlp_in = c.parallel_residual ? x : a.res2;
    norm_forward(be, c, a.ln2.at(slot), a.ln2_mean, a.ln2_rstd, mlp_in, w.ln2_w, w.ln2_b, Nr);
    if (tp_.sequence_parallel()) tp_.gather_rows(a.ln2.fp32("sequence parallelism"), NrC);
    if (sp && sp->units) {
        // the listed units' rows of fc ([gate | up] halves alike); the others' entries of fch
        // keep stale values that the activation passes through and fc_proj never reads
        float* pre = a.fch.fp32("contextual sparsity");
        for (int half = 0; half < s.F2 / F; ++half)
            be.matmul_rows_forward(pre + half * F, s.F2, a.ln2.fp32("contextual sparsity"),
                                   w.fc_w + static_cast<size_t>(half) * F * C,
                                   w.fc_b ? w.fc_b + half * F : nullptr, sp->units, N, C,
                                   sp->units_k, 1);
        if (c.gated_mlp())
            swiglu_forward(be, a.fch_act, pre, N, F);
        else
            activation_forward(be, a.fch_act, pre, static_cast<size_t>(N) * F, c.activation);
    } else {  // fc and its activation in one op (CUDA: a fused epilogue; in bf16 one kernel
              // that applies the activation and stores pre rounded)
        matmul_activation_forward(be, a.fch, a.fch_act, a.ln2, w.fc_w, w.fc_b, N, C, s.F2,
                                  c.activation);
    }
    if (sp && sp->units) {
        be.matmul_rows_project(tmp, a.fch_act.fp32("contextual sparsity"), F, sp->fc_proj_t,
                               add_out_bias ? w.fc_proj_b : nullptr, sp->units, N, C,
                               sp->units_k, 1);
        be.add(x_out, a.res2, tmp, NrC);
    } else if (fused_residual) {
        matmul_residual_forward(be, x_out, a.res2, a.fch_act, w.fc_proj_w,
                                add_out_bias ? w.fc_proj_b : nullptr, N, F, C);
    } else {
        matmul_forward(be, tmp, a.fch_act, w.fc_proj_w, add_out_bias ? w.fc_proj_b : nullptr, N,
                       F, C);
        tp_.sum_rows(tmp, NrC);
        be.add(x_out, a.res2, tmp, NrC);
    }
}

void TransformerBlock::backward(const BlockWeights& w, const BlockWeights& g, const float* x,
                                const BlockActs& a, float* dx, const BlockGradBuffers& d, int N,
                                int layer, AttentionStep& attention) const {
    Backend& be = backend_;
    const ModelConfig& c = config_;
    const TensorShard& s = shard_;
    const int C = c.d_model, A = s.A, F2 = s.F2, Q = s.Q;
    const int Nr = tp_.rows_here(N);
    const size_t NrC = static_cast<size_t>(Nr) * C;
    const float* mlp_in = c.parallel_residual ? x : a.res2;

    // dx holds d(loss)/d(x_out) (this rank's rows under sequence parallelism, else all, the
    // same on every tensor-parallel rank). MLP branch first: x_out = res2 + mlp(ln2(mlp_in)).
    // Row-parallel fc_proj: this rank's columns of dW and its hidden units' gradient need no
    // communication beyond every rank's rows of dx (nor does the replicated bias's gradient).
    // The activation gradients below are each made by one op, which writes them (Overwrite:
    // no zeroing pass; CUDA in bf16 hands dfch to fc's products in bf16 and writes no fp32
    // copy); the parameter gradients and dx accumulate.
    const GradStore write = GradStore::Overwrite;
    const float* dx_all = tp_.gather_rows_from(dx, d.dx_full, NrC);
    // fc_proj's backward, the activation's (SwiGLU's too) and fc's in one op: on CUDA in bf16
    // fc's products get bf16(dfch) and its bias gradient directly, from the activation kernel
    // or (GELU tanh) from the epilogue of the product that makes dfch_act
    float* dln2 = c.parallel_residual ? d.dln2 : d.dln;
    MlpBackwardBf16 m;
    m.dinp = dln2;
    m.dinp_store = write;
    m.dW_fc = g.fc_w;
    m.db_fc = g.fc_b;
    m.dW_proj = g.fc_proj_w;
    m.db_proj = g.fc_proj_b;
    m.dact = d.dfch_act;
    m.dpre = d.dfch;
    m.dout = dx_all;
    m.W_fc = w.fc_w;
    m.W_proj = w.fc_proj_w;
    m.N = N;
    m.IC = C;
    m.OC = F2;
    m.OP = C;
    m.act = c.activation;
    mlp_backward(be, m, a.fch, a.fch_act, a.ln2);
    tp_.sum_rows(dln2, NrC);  // column-parallel fc: each rank's hidden units' share
    if (!c.parallel_residual) {
        // dx becomes d/d(res2): the residual path plus the MLP norm's input gradient.
        norm_backward_rows(be, c, tp_, d.norm_scratch, dx, g.ln2_w, g.ln2_b, dln2, mlp_in,
                           w.ln2_w, a.ln2_mean, a.ln2_rstd, Nr);
        dx_all = tp_.gather_rows_from(dx, d.dx_full, NrC);
    }
    // attention branch: res2 = x + proj(attention(qkv(ln1(x))))
    matmul_backward(be, d.datty, g.attn_proj_w, g.attn_proj_b, dx_all, a.atty, w.attn_proj_w, N, A,
                    C, write);
    attention.backward(layer, d.dqkv, d.datty, a.qkv, a.att, a.atty, write);
    const float* dproj = d.dqkv;  // d(loss)/d(the projection's output)
    if (c.grouped_kv()) {  // each key/value head collects the gradients of its query heads
        be.zero(d.dqkv_grouped, static_cast<size_t>(N) * Q);
        be.kv_repeat_backward(d.dqkv_grouped, d.dqkv, N, s.H, s.Hkv, s.D);
        dproj = d.dqkv_grouped;
    }
    matmul_backward(be, d.dln, g.qkv_w, g.qkv_b, dproj, a.ln1, w.qkv_w, N, C, Q, write);
    tp_.sum_rows(d.dln, NrC);  // column-parallel qkv: each rank's heads' share
    if (c.parallel_residual) {
        // Both branches read x: their norm gradients join the residual in dx.
        norm_backward_rows(be, c, tp_, d.norm_scratch, dx, g.ln2_w, g.ln2_b, dln2, mlp_in,
                           w.ln2_w, a.ln2_mean, a.ln2_rstd, Nr);
    }
    norm_backward_rows(be, c, tp_, d.norm_scratch, dx, g.ln1_w, g.ln1_b, d.dln, x, w.ln1_w,
                       a.ln1_mean, a.ln1_rstd, Nr);
}

}  // namespace ctx
