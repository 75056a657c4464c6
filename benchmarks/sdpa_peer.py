#!/usr/bin/env python3
"""The same-run peer for `ctxengine bench attention`: PyTorch's scaled_dot_product_attention
(causal), timed on the shapes and in the FLOP convention of the engine's attention table
(docs/BENCHMARKS.md), so the two tables can be read side by side.

  python3 benchmarks/sdpa_peer.py [--device auto|cpu|cuda] [--head-dim 64,128]
      [--T 1024,2048,...] [--batch B] [--heads H] [--dtype fp32,bf16] [--pe none,alibi]
      [--bias-max-T 4096] [--steps N] [--repeats N] [--check]

Shapes: as the engine's defaults, B = 16384 / T and H = 2048 / D on CUDA, B = 1 and H = 4 on the
CPU, unless --batch / --heads say otherwise. pe "none" is is_causal=True (PyTorch picks its flash
or memory-efficient kernel); "alibi" adds ALiBi's bias as a (1, H, T, T) float mask with -inf
above the diagonal, the way a user without a fused kernel would run a bias PE (PyTorch then
cannot use its flash kernel), up to --bias-max-T. FLOPs: forward 4 B H T^2 D / 2, backward 2.5x
forward (FlashAttention-2's causal convention); bias work is not counted.

--check: compares each shape's output and gradients against a float64 softmax reference on the
first row of the batch and exits 1 when they differ by more than the dtype's tolerance.
"""
import argparse
import math
import sys
import time


def parse_list(text, kind, name):
    try:
        values = [kind(v) for v in text.split(",") if v]
    except ValueError:
        sys.exit(f"sdpa_peer: --{name}: expected a comma-separated list, got '{text}'")
    if not values:
        sys.exit(f"sdpa_peer: --{name}: empty list")
    return values


def alibi_slopes(heads):
    # ALiBi's geometric slopes for a power of two, interleaved for the rest (the alibi plugin's
    # formula, METHODS.md 1.4)
    def power_of_two(n):
        start = 2.0 ** (-8.0 / n)
        return [start ** (i + 1) for i in range(n)]
    if math.log2(heads).is_integer():
        return power_of_two(heads)
    closest = 2 ** math.floor(math.log2(heads))
    return power_of_two(closest) + power_of_two(2 * closest)[0::2][: heads - closest]


def causal_mask(torch, pe, heads, T, dtype, device):
    """None for is_causal; else the (1, H, T, T) additive mask: -slope_h (i - j), -inf for j > i."""
    if pe == "none":
        return None
    i = torch.arange(T, device=device, dtype=torch.float32)
    dist = (i[:, None] - i[None, :])
    slopes = torch.tensor(alibi_slopes(heads), device=device, dtype=torch.float32)
    bias = -slopes[:, None, None] * dist[None]
    bias = bias.masked_fill(dist[None] < 0, float("-inf"))
    return bias[None].to(dtype)


def reference(torch, q, k, v, mask, dout):
    """float64 attention of row 0 and its gradients: (out, dq, dk, dv)."""
    q64, k64, v64 = (t[:1].detach().double().requires_grad_(True) for t in (q, k, v))
    T, D = q64.shape[-2], q64.shape[-1]
    logits = q64 @ k64.transpose(-1, -2) / math.sqrt(D)
    if mask is None:
        upper = torch.ones(T, T, dtype=torch.bool, device=q.device).triu(1)
        logits = logits.masked_fill(upper, float("-inf"))
    else:
        logits = logits + mask.double()
    out = torch.softmax(logits, dim=-1) @ v64
    out.backward(dout[:1].double())
    return out.detach(), q64.grad, k64.grad, v64.grad


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="auto")
    ap.add_argument("--head-dim", default=None)
    ap.add_argument("--T", default=None)
    ap.add_argument("--batch", type=int, default=0)
    ap.add_argument("--heads", type=int, default=0)
    ap.add_argument("--dtype", default=None)
    ap.add_argument("--pe", default="none,alibi")
    ap.add_argument("--bias-max-T", type=int, default=4096)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--check", action="store_true")
    a = ap.parse_args()

    try:
        import torch  # imported here so --help works without it
    except ImportError:
        print("sdpa_peer: needs PyTorch (Debian: python3-torch; or pip install torch)",
              file=sys.stderr)
        return 77  # "skipped" for ctest
    F = torch.nn.functional
    legacy = not hasattr(F, "scaled_dot_product_attention")  # torch < 2.0 (Debian 12's 1.13)
    if legacy:
        # the private forerunner: causal, boolean masks only, returns (out, weights)
        def sdpa(q, k, v, mask):
            return F._scaled_dot_product_attention(q, k, v, None, 0.0, False, True)[0]
    else:
        def sdpa(q, k, v, mask):
            if mask is None:
                return F.scaled_dot_product_attention(q, k, v, is_causal=True)
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    if a.device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    elif a.device in ("cpu", "cuda"):
        device = a.device
        if device == "cuda" and not torch.cuda.is_available():
            sys.exit("sdpa_peer: --device cuda: torch sees no CUDA device")
    else:
        sys.exit(f"sdpa_peer: --device: expected auto, cpu or cuda, got '{a.device}'")
    gpu = device == "cuda"
    head_dims = parse_list(a.head_dim or ("64,128" if gpu else "64"), int, "head-dim")
    lengths = parse_list(a.T or ("1024,2048,4096,8192,16384" if gpu else "256,512"), int, "T")
    dtypes = parse_list(a.dtype or ("fp32,bf16" if gpu else "fp32"), str, "dtype")
    pes = parse_list(a.pe, str, "pe")
    for name in dtypes:
        if name not in ("fp32", "bf16"):
            sys.exit(f"sdpa_peer: --dtype: expected fp32 or bf16, got '{name}'")
    for pe in pes:
        if pe not in ("none", "alibi"):
            sys.exit(f"sdpa_peer: --pe: expected none or alibi, got '{pe}'")
    if min(head_dims + lengths) <= 0 or a.steps <= 0 or a.repeats <= 0 or a.batch < 0 or a.heads < 0:
        sys.exit("sdpa_peer: sizes, --steps and --repeats must be positive")
    if gpu:
        torch.backends.cuda.matmul.allow_tf32 = False  # fp32 means fp32, as in the engine
        torch.backends.cudnn.allow_tf32 = False

    def sync():
        if gpu:
            torch.cuda.synchronize()

    name = torch.cuda.get_device_name() if gpu else "cpu"
    print(f"sdpa_peer: torch {torch.__version__}, device {name}"
          + (" (torch < 2.0: the private _scaled_dot_product_attention, pe none only)" if legacy else ""))
    print(f"{'dtype':5} {'D':>4} {'T':>6} {'B':>4} {'H':>4} {'pe':6} {'fwd_ms':>9} {'bwd_ms':>9} "
          f"{'total_ms':>9} {'fwd_TF':>8} {'bwd_TF':>8} {'total_TF':>8} {'vs_none':>8}  check")
    failed = False
    gen = torch.Generator(device="cpu").manual_seed(1)
    for dname in dtypes:
        dtype = torch.float32 if dname == "fp32" else torch.bfloat16
        tol = 2e-4 if dname == "fp32" else 3e-2
        for D in head_dims:
            for T in lengths:
                B = a.batch or (max(1, 16384 // T) if gpu else 1)
                H = a.heads or (max(1, 2048 // D) if gpu else 4)
                shape = (B, H, T, D)
                q, k, v, dout = (torch.randn(shape, generator=gen).to(device, dtype) for _ in range(4))
                for t in (q, k, v):
                    t.requires_grad_(True)
                none_total = None
                for pe in pes:
                    label = f"{dname:5} {D:4d} {T:6d} {B:4d} {H:4d} {pe:6}"
                    if pe != "none" and (legacy or T > a.bias_max_T):
                        why = "torch < 2.0 takes no float mask" if legacy else f"T > --bias-max-T {a.bias_max_T}"
                        print(f"{label} skipped ({why})")
                        continue
                    try:
                        mask = causal_mask(torch, pe, H, T, dtype, device)

                        def forward():
                            return sdpa(q, k, v, mask)

                        out = forward()
                        out.backward(dout)  # warm-up
                        best_f = best_b = float("inf")
                        for _ in range(a.repeats):
                            sync()
                            t0 = time.perf_counter()
                            for _ in range(a.steps):
                                out = forward()
                            sync()
                            best_f = min(best_f, (time.perf_counter() - t0) / a.steps)
                            t0 = time.perf_counter()
                            for _ in range(a.steps):
                                q.grad = k.grad = v.grad = None
                                out.backward(dout, retain_graph=True)
                            sync()
                            best_b = min(best_b, (time.perf_counter() - t0) / a.steps)
                    except RuntimeError as e:  # out of memory, unsupported kernel
                        print(f"{label} error: {str(e).splitlines()[0]}")
                        failed = True
                        if gpu:
                            torch.cuda.empty_cache()
                        continue
                    fwd_flop = 4.0 * B * H * T * T * D / 2
                    total = best_f + best_b
                    if pe == "none":
                        none_total = total
                    vs = f"{100 * (total / none_total - 1):+7.1f}%" if none_total else "       -"
                    check = "-"
                    if a.check:
                        want = reference(torch, q, k, v, mask, dout)
                        got = (out[:1], q.grad[:1], k.grad[:1], v.grad[:1])
                        err = max(float((g.double() - w).abs().max() / max(1.0, float(w.abs().max())))
                                  for g, w in zip(got, want))
                        check = f"{err:.1e}" + ("" if err <= tol else " FAILED")
                        failed |= err > tol
                    print(f"{label} {best_f * 1e3:9.3f} {best_b * 1e3:9.3f} {total * 1e3:9.3f} "
                          f"{fwd_flop / best_f / 1e12:8.3f} {2.5 * fwd_flop / best_b / 1e12:8.3f} "
                          f"{3.5 * fwd_flop / total / 1e12:8.3f} {vs}  {check}")
                del q, k, v, dout
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
