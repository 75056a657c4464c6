#!/usr/bin/env python3
"""The numbers of a GPU validation run, side by side: what docs/BENCHMARKS.md needs.

usage: scripts/gpu_digest.py OUT [--baseline DIR]

OUT is a directory written by gpu_validate.sh (summary.txt, logs/NAME.log); every log whose
output is a `ctxengine bench` run (training: `mfu=` lines), a `bench attention` table or the
SDPA peer's table is read, whatever its step name. DIR (optional) holds an earlier run's logs
(docs/gpu_runs/DATE-h100/ or another OUT/logs): its default bf16 attention tables become a
"before" column (where two logs have a row, the later file name's).

Prints markdown: the steps that were not ok; training runs (tokens/s, MFU, device peak; each
against the step without the `env` switch, or with B 8 for the B 64 run); for each head dim,
total TFLOP/s of every attention log by (T, PE) with the change against the default log and
the SDPA peer; each profile's ten largest ops; and the issue-17 goals against what was
measured (met or not, by how much). Nothing is judged here beyond that arithmetic.
"""
import argparse
import os
import re
import sys

GOAL_MFU, GOAL_ATTN_TF, GOAL_BIAS_PCT = 0.5, 300.0, 5.0


def read(path):
    with open(path, errors="replace") as f:
        return f.read()


def command_of(text):
    """The step's command (gpu_validate's first log line, `$ CMD`), or ''."""
    first = text.split("\n", 1)[0]
    return first[2:] if first.startswith("$ ") else ""


def env_switches(cmd):
    """CTX_* switches an `env A=B ...` prefix sets, as 'A=B A2=B2' ('' for none)."""
    return " ".join(re.findall(r"\b(CTX_[A-Z0-9_]+=\S+)", cmd.split("ctxengine")[0]))


def parse_training(text):
    """key=value lines of `ctxengine bench` (training), or None."""
    if not re.search(r"^mfu=", text, re.M):
        return None
    kv = dict(re.findall(r"^(\w+)=(\S+)", text, re.M))
    out = {"tokens_per_s": float(kv["tokens_per_s"]), "mfu": float(kv["mfu"])}
    if "peak_memory_mib" in kv:
        out["peak_mib"] = float(kv["peak_memory_mib"])
    if "host_waits_per_step" in kv:
        out["host_waits"] = float(kv["host_waits_per_step"])
    m = re.search(r"^config=(\S+).* B=(\d+) pe=(\S+)", text, re.M)
    if m:
        out.update(config=m.group(1), B=int(m.group(2)), pe=m.group(3))
    m = re.search(r"^device=.* precision=(\S+)", text, re.M)
    if m:
        out["precision"] = m.group(1)
    return out


def parse_table(text, first_col):
    """Rows of a whitespace table whose header line starts with first_col, as dicts."""
    rows, header = [], None
    for line in text.splitlines():
        cells = line.split()
        if cells and cells[0] == first_col:
            header = cells
            continue
        if header and len(cells) == len(header) and re.match(r"^\d+$", cells[1]):
            rows.append(dict(zip(header, cells)))
    return rows


def num(cell):
    """A table cell as a float ('+4.8%' -> 4.8; '-' -> None)."""
    try:
        return float(cell.rstrip("%"))
    except (ValueError, AttributeError):
        return None


def parse_attention(text):
    """{(mode, D, T, pe): row} of a `bench attention` log, or {}."""
    if "attention benchmark:" not in text:
        return {}
    return {(r["mode"], int(r["D"]), int(r["T"]), r["pe"]): r for r in parse_table(text, "mode")}


def parse_sdpa(text):
    """{(D, T, pe): row} of sdpa_peer.py's table, or {}."""
    if not text.lstrip().startswith("$") and "sdpa_peer:" not in text:
        return {}
    return {(int(r["D"]), int(r["T"]), r["pe"]): r for r in parse_table(text, "dtype")}


def parse_profile(text):
    """(op, shape, calls, ms, share) rows of a `bench --profile` table."""
    rows, inside = [], False
    for line in text.splitlines():
        if re.match(r"^profile: per step", line):
            inside = True
            continue
        if not inside:
            continue
        m = re.match(r"^  (\S.*?)\s{2,}(.*?)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)%\s+\S+$", line)
        if m and m.group(1) != "op":
            rows.append((m.group(1), m.group(2).strip(), float(m.group(3)), float(m.group(4)),
                         float(m.group(5))))
        elif not line.startswith("  "):
            inside = False
    return rows


def load_logs(d):
    """{name: text} of the .log files of d (and of d/logs)."""
    logs = {}
    for sub in (d, os.path.join(d, "logs")):
        if os.path.isdir(sub):
            for f in sorted(os.listdir(sub)):
                if f.endswith(".log"):
                    logs[f[:-4]] = read(os.path.join(sub, f))
    return logs


def pct(a, b):
    return f"{100.0 * (a - b) / b:+.1f}%" if a is not None and b else "-"


def digest(out_dir, baseline_dir=None):
    lines = []
    say = lines.append
    summary = os.path.join(out_dir, "summary.txt")
    logs = load_logs(out_dir)
    if not logs:
        raise SystemExit(f"gpu_digest: no .log files in {out_dir} or {out_dir}/logs")
    base = load_logs(baseline_dir) if baseline_dir else {}

    if os.path.isfile(summary):
        text = read(summary)
        gpu = re.findall(r"^gpu: (.*)$", text, re.M)
        say(f"GPU: {gpu[0] if gpu else 'not listed in summary.txt'}")
        bad = [l for l in text.splitlines()
               if re.match(r"^\S+\s+(FAIL|TIMEOUT|ALLSKIP|skipped)", l)]
        ok = len(re.findall(r"^\S+\s+ok\s", text, re.M))
        say(f"steps: {ok} ok, {len(bad)} not ok")
        for l in bad:
            say(f"    {l}")
        say("")

    # ---- training
    # (a --profile run's own timing is distorted by its marks: its table is below instead)
    train = {n: parse_training(t) for n, t in logs.items() if "--profile" not in command_of(t)}
    train = {n: r for n, r in train.items() if r}
    cmds = {n: command_of(logs[n]) for n in train}

    def reference(name):
        """The run this one is an A/B against: the same command without the env switch (or at
        the config's default batch when --batch is given); None for the default itself."""
        sw, cmd = env_switches(cmds[name]), cmds[name]
        if sw:
            plain = re.sub(r"^env (CTX_[A-Z0-9_]+=\S+ )+", "", cmd)
        elif "--batch" in cmd:
            plain = re.sub(r" --batch \d+", "", cmd)
        else:
            return None
        # the same model, PE and precision; steps and warmup may differ
        key = lambda c: re.sub(r" --(steps|warmup) \d+", "", c).replace("\\", "").split()
        for other, c in cmds.items():
            if other != name and key(c) == key(plain):
                return other
        return None

    if train:
        say("| step | config | B | PE | tokens/s | MFU | device peak MiB | against |")
        say("| --- | --- | ---: | --- | ---: | ---: | ---: | --- |")
        for n in sorted(train):
            r, ref = train[n], reference(n)
            vs = f"{pct(r['tokens_per_s'], train[ref]['tokens_per_s'])} vs `{ref}`" if ref else "-"
            peak = f"{r['peak_mib']:,.0f}" if "peak_mib" in r else "-"
            say(f"| `{n}` | {r.get('config', '?')} {r.get('precision', '')} | {r.get('B', '?')} "
                f"| {r.get('pe', '?')} | {r['tokens_per_s']:,.0f} | {r['mfu']:.3f} | {peak} | {vs} |")
        say("")

    # ---- attention
    attn = {n: parse_attention(t) for n, t in logs.items()}
    attn = {n: a for n, a in attn.items() if a}
    sdpa = {}
    for n, t in logs.items():
        if "sdpa" in n:
            sdpa.update(parse_sdpa(t))
    before = {}
    for n, t in base.items():
        before.update({k: v for k, v in parse_attention(t).items() if k[0] == "flash" and
                       "bf16" in n and env_switches(command_of(t)) == ""})
    dims = sorted({k[1] for a in attn.values() for k in a})
    for D in dims:
        names = [n for n in sorted(attn) if any(k[1] == D for k in attn[n])]
        default = next((n for n in names if not env_switches(command_of(logs[n]))
                        and "bf16" in n), names[0])
        names = [default] + [n for n in names if n != default]
        say(f"Attention, head dim {D}: total TFLOP/s (forward + backward), `{default}` the default")
        head = ["T", "PE"] + [f"`{n}`" for n in names]
        if before:
            head.append("before")
        head += ["vs_none", "SDPA"]
        say("| " + " | ".join(head) + " |")
        say("|" + " --- |" * len(head))
        keys = []  # (T, PE) in the logs' order
        for n in names:
            keys += [(k[2], k[3]) for k in attn[n] if k[1] == D and (k[2], k[3]) not in keys]
        keys.sort(key=lambda k: k[0])
        for T, pe in keys:
            d = attn[default].get(("flash", D, T, pe))
            dtf = num(d["total_TF"]) if d else None
            cells = [str(T), pe]
            for n in names:
                r = attn[n].get(("flash", D, T, pe))
                tf = num(r["total_TF"]) if r else None
                cells.append("-" if tf is None else f"{tf:.1f}" if n == default or dtf is None
                             else f"{tf:.1f} ({pct(tf, dtf)})")
            if before:
                b = before.get(("flash", D, T, pe))
                cells.append(f"{num(b['total_TF']):.1f}" if b else "-")
            cells.append(d["vs_none"] if d else "-")
            s = sdpa.get((D, T, pe))
            cells.append(f"{num(s['total_TF']):.1f}" if s else "-")
            say("| " + " | ".join(cells) + " |")
        say("")

    # ---- profiles
    for n in sorted(logs):
        rows = parse_profile(logs[n])
        if not rows:
            continue
        total = re.search(r"profile: per step .*?, ([\d.]+) ms in all", logs[n])
        clock = re.search(r"clock: (\w+)", logs[n])
        say(f"`{n}`: {total.group(1) if total else '?'} ms a step "
            f"({'clock: ' + clock.group(1) if clock else 'clock not stated'}); the ten largest ops")
        say("| op | shape | calls | ms | share |")
        say("| --- | --- | ---: | ---: | ---: |")
        for op, shape, calls, ms, share in sorted(rows, key=lambda r: -r[3])[:10]:
            say(f"| {op} | {shape} | {calls:g} | {ms:.3f} | {share:.1f}% |")
        say("")

    # ---- the goals
    say("Goals of issue 17 against this run:")
    best = {}
    for n, r in train.items():
        if r.get("config") == "gpt2-124m" and r.get("precision") == "bf16" and \
                not env_switches(cmds[n]) and r.get("pe") == "learned":
            best[r["B"]] = max(best.get(r["B"], 0.0), r["mfu"])
    for B in sorted(best):
        say(f"- MFU, GPT-2 124M bf16, B {B}: {best[B]:.3f} against {GOAL_MFU} "
            f"({'met' if best[B] >= GOAL_MFU else 'not met'})")
    defaults = [a for n, a in attn.items() if not env_switches(command_of(logs[n]))]
    d128 = [num(r["total_TF"]) for a in defaults for k, r in a.items()
            if k[0] == "flash" and k[1] == 128 and k[3] == "none"]
    if d128:
        say(f"- attention, D 128, none: {min(d128):.1f}-{max(d128):.1f} TFLOP/s against "
            f"{GOAL_ATTN_TF:.0f} ({'met' if min(d128) >= GOAL_ATTN_TF else 'not met'})")
    for pe in ("alibi", "kerple_log"):
        over = [num(r["vs_none"]) for a in defaults for k, r in a.items()
                if k[0] == "flash" and k[3] == pe and num(r["vs_none"]) is not None]
        if over:
            say(f"- {pe} over none: {min(over):+.1f}% to {max(over):+.1f}% against "
                f"<= {GOAL_BIAS_PCT:.0f}% ({'met' if max(over) <= GOAL_BIAS_PCT else 'not met'})")
    return "\n".join(lines)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("out")
    p.add_argument("--baseline")
    a = p.parse_args()
    if not os.path.isdir(a.out):
        sys.exit(f"gpu_digest: {a.out} is not a directory")
    if a.baseline and not os.path.isdir(a.baseline):
        sys.exit(f"gpu_digest: --baseline {a.baseline} is not a directory")
    print(digest(a.out, a.baseline))


if __name__ == "__main__":
    main()
