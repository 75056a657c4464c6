// CPU backend: softmax cross-entropy (with a loss mask) and the AdamW update.
#include <omp.h>

#include <algorithm>
#include <cmath>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_math.h"
#include "backend/op_common.h"
#include "core/error.h"

namespace ctx::cpu {

namespace {

inline float mask_at(const float* mask, int n) { return mask != nullptr ? mask[n] : 1.0f; }

}  // namespace

void CpuBackend::crossentropy_forward(float* losses, const float* logits, const int32_t* targets,
                                      const float* mask, int N, int V) {
    check_targets(targets, mask, N, V);
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const float mk = mask_at(mask, n);
        if (mk == 0.0f) {
            losses[n] = 0.0f;
            continue;
        }
        const float* x = logits + size_t(n) * V;  // (V)
        const float mx = row_max(x, V);
        float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
        for (int i = 0; i < V; i++) sum += fast_exp(x[i] - mx);
        // -log softmax[t] = log(sum) + max - x[t]
        losses[n] = mk * (std::log(sum) + mx - x[targets[n]]);
    }
}

void CpuBackend::crossentropy_forward_backward(float* logits_to_dlogits, float* losses,
                                               const int32_t* targets, const float* mask, int N,
                                               int V, float grad_scale) {
    check_targets(targets, mask, N, V);
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        float* x = logits_to_dlogits + size_t(n) * V;  // (V) logits in, dlogits out
        const float mk = mask_at(mask, n);
        if (mk == 0.0f) {
            losses[n] = 0.0f;
            for (int i = 0; i < V; i++) x[i] = 0.0f;
            continue;
        }
        const int t = targets[n];
        const float xt = x[t];
        const float mx = row_max(x, V);
        // x <- exp(x - max), summed on the way
        float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
        for (int i = 0; i < V; i++) {
            const float e = fast_exp(x[i] - mx);
            x[i] = e;
            sum += e;
        }
        losses[n] = mk * (std::log(sum) + mx - xt);
        // dlogits = grad_scale * mask * (softmax - onehot)
        const float g = grad_scale * mk;
        const float s = g / sum;
#pragma omp simd
        for (int i = 0; i < V; i++) x[i] *= s;
        x[t] -= g;
    }
}

void CpuBackend::crossentropy_shard_stats(float* stats, const float* logits,
                                         const int32_t* targets, int N, int V, VocabShard shard) {
    check_targets(targets, nullptr, N, shard.total);
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const float* x = logits + size_t(n) * V;  // (V) this shard's logits
        const float mx = row_max(x, V);
        float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
        for (int i = 0; i < V; i++) sum += fast_exp(x[i] - mx);
        const int t = targets[n] - shard.begin;
        float* st = stats + size_t(n) * 3;  // {m, z, target logit}
        st[0] = mx;
        st[1] = sum;
        st[2] = t >= 0 && t < V ? x[t] : 0.0f;
    }
}

void CpuBackend::crossentropy_shard_finish(float* losses, float* logits_to_dlogits,
                                          const float* all_stats, int S, const int32_t* targets,
                                          const float* mask, int N, int V, VocabShard shard,
                                          float grad_scale) {
    check_targets(targets, mask, N, shard.total);
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const float mk = mask_at(mask, n);
        float* x = logits_to_dlogits ? logits_to_dlogits + size_t(n) * V : nullptr;  // (V)
        if (mk == 0.0f) {
            losses[n] = 0.0f;
            if (x)
                for (int i = 0; i < V; i++) x[i] = 0.0f;
            continue;
        }
        // the global max M, Z = sum_s z_s exp(m_s - M), and the target's logit (one shard has it)
        float M = -INFINITY, xt = 0.0f;
        for (int s = 0; s < S; s++) M = std::max(M, all_stats[(size_t(s) * N + n) * 3]);
        float Z = 0.0f;
        for (int s = 0; s < S; s++) {
            const float* st = all_stats + (size_t(s) * N + n) * 3;
            Z += st[1] * std::exp(st[0] - M);
            xt += st[2];
        }
        losses[n] = mk * (std::log(Z) + M - xt);
        if (!x) continue;
        // dlogits = grad_scale * mask * (softmax - onehot) over this shard
        const float g = grad_scale * mk;
        const float sc = g / Z;
#pragma omp simd
        for (int i = 0; i < V; i++) x[i] = fast_exp(x[i] - M) * sc;
        const int t = targets[n] - shard.begin;
        if (t >= 0 && t < V) x[t] -= g;
    }
}

void CpuBackend::adamw_update(float* params, const float* grads, float* m, float* v, size_t n,
                              const AdamWParams& hp) {
    CTX_CHECK(hp.step >= 1, "adamw: step must be >= 1 (1-based), got {}", hp.step);
    const float b1 = hp.beta1, b2 = hp.beta2;
    const float inv_bc1 = float(1.0 / (1.0 - std::pow(double(b1), double(hp.step))));
    const float inv_bc2 = float(1.0 / (1.0 - std::pow(double(b2), double(hp.step))));
    const float lr = hp.lr, eps = hp.eps, wd = hp.weight_decay, gs = hp.grad_scale;
#pragma omp parallel for simd schedule(static) if (n >= 4096)
    for (size_t i = 0; i < n; i++) {
        const float g = grads[i] * gs;
        const float mi = b1 * m[i] + (1.0f - b1) * g;
        const float vi = b2 * v[i] + (1.0f - b2) * g * g;
        m[i] = mi;
        v[i] = vi;
        const float mhat = mi * inv_bc1;
        const float vhat = vi * inv_bc2;
        params[i] -= lr * (mhat / (std::sqrt(vhat) + eps) + wd * params[i]);
    }
}

}  // namespace ctx::cpu
