#!/usr/bin/env python3
"""Per-kernel SASS statistics of CUDA sources, without a GPU (docs/CUDA.md "Code size").

usage: scripts/cuda_code_size.py [--build BUILD_DIR] [--arch sm_90] [--match REGEX] FILE.cu...

Compiles each file to a cubin with the build's include flags (BUILD_DIR, default build/, must be
a configured CUDA build), disassembles it with cuobjdump and prints, per kernel: SASS
instructions, HMMA (tensor-core) instructions, MUFU.EX2, calls, local-memory loads and stores,
and the median distance in instructions between consecutive EX2s: a logit loop's hot
instructions per logit plus whatever sits between them. A kernel whose loop carries large
inline code behind runtime tests shows a distance in the hundreds (the tensor-core dq kernel of
2026-11-27: ~650 at 107,560 instructions, and three quarters of the attention backward on an
H100); a specialised loop shows tens.

cuobjdump (and the nvdisasm it runs): $CUOBJDUMP, else PATH, else /usr/local/cuda/bin, else
BUILD_DIR/cuda-tools, where `pip install --target BUILD_DIR/cuda-tools nvidia-cuda-cuobjdump
nvidia-cuda-nvdisasm` puts both, or a venv there with them (scripts/gpu_bundle_check.sh makes
one); the CUDA toolkit image here has neither. scripts/sass_check.py shares this file's finder
and parser.
"""
import argparse
import glob
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))


def find_cuobjdump(build):
    cands = [os.environ.get("CUOBJDUMP"), shutil.which("cuobjdump"), "/usr/local/cuda/bin/cuobjdump"]
    cands += glob.glob(os.path.join(build, "cuda-tools", "nvidia", "*", "bin", "cuobjdump"))
    cands += glob.glob(os.path.join(build, "cuda-tools", "lib", "python3*", "site-packages",
                                    "nvidia", "*", "bin", "cuobjdump"))
    for c in cands:
        if c and os.path.isfile(c) and os.access(c, os.X_OK):
            return c
    sys.exit("cuda_code_size: no cuobjdump (set CUOBJDUMP, or: pip install --target "
             f"{os.path.join(build, 'cuda-tools')} nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm)")


def disassemble(cuobjdump, option, path):
    """cuobjdump OPTION PATH's output; nvdisasm (which -sass runs) looked for beside it first."""
    env = dict(os.environ, PATH=os.path.dirname(cuobjdump) + os.pathsep + os.environ.get("PATH", ""))
    r = subprocess.run([cuobjdump, option, path], capture_output=True, text=True, env=env)
    if r.returncode != 0:
        sys.exit(f"{os.path.basename(sys.argv[0])}: cuobjdump {option} {path} failed: "
                 f"{r.stderr.strip()}")
    return r.stdout


def kernels(sass):
    """(name, [instruction text]) per function of a cuobjdump -sass listing."""
    for part in re.split(r"\n\s+Function : ", sass)[1:]:
        name = part.split("\n", 1)[0].strip()
        ins = re.findall(r"/\*[0-9a-f]{4,}\*/\s+((?:@!?U?P\w+\s+)?[A-Z][A-Z0-9_.]+[^;]*);", part)
        yield name, ins


def stats(ins):
    op = [t.split()[1] if t.startswith("@") else t.split()[0] for t in ins]
    ex2 = [k for k, o in enumerate(op) if o == "MUFU.EX2"]
    gaps = [b - a for a, b in zip(ex2, ex2[1:])]
    return {
        "instrs": len(op),
        "hmma": sum(o.startswith("HMMA") for o in op),
        "ex2": len(ex2),
        "calls": sum(o.startswith("CALL") for o in op),
        "local": sum(o.startswith(("LDL", "STL")) for o in op),
        "ex2_gap": int(statistics.median(gaps)) if gaps else 0,
    }


def demangle(names):
    cxxfilt = shutil.which("c++filt")
    if not cxxfilt:
        return names
    out = subprocess.run([cxxfilt], input="\n".join(names), capture_output=True, text=True)
    return out.stdout.splitlines() if out.returncode == 0 else names


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("files", nargs="+")
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--arch", default="sm_90")
    ap.add_argument("--match", default="", help="only kernels whose mangled name matches")
    args = ap.parse_args()
    rsp = os.path.join(args.build, "engine", "CMakeFiles", "ctx_backend.dir", "includes_CUDA.rsp")
    if not os.path.isfile(rsp):
        sys.exit(f"cuda_code_size: {rsp} not found (configure {args.build} with CUDA first)")
    nvcc = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
    cuobjdump = find_cuobjdump(args.build)
    print(f"{'kernel':<60} {'instrs':>7} {'hmma':>5} {'ex2':>5} {'gap':>4} {'calls':>5} {'local':>5}")
    with tempfile.TemporaryDirectory() as tmp:
        for src in args.files:
            cubin = os.path.join(tmp, os.path.basename(src) + ".cubin")
            cmd = [nvcc, "--options-file", rsp, "-O3", "-DNDEBUG", f"-arch={args.arch}",
                   "-std=c++17", "-x", "cu", "-cubin", os.path.abspath(src), "-o", cubin]
            r = subprocess.run(cmd, cwd=os.path.join(args.build, "engine"), capture_output=True,
                               text=True)
            if r.returncode != 0:
                sys.exit(f"cuda_code_size: nvcc failed on {src}:\n{r.stderr[-2000:]}")
            sass = disassemble(cuobjdump, "-sass", cubin)
            rows = [(n, stats(i)) for n, i in kernels(sass) if re.search(args.match, n)]
            for name, s in zip(demangle([n for n, _ in rows]), (s for _, s in rows)):
                short = re.sub(r"\(.*", "", name)[-60:]
                print(f"{short:<60} {s['instrs']:>7} {s['hmma']:>5} {s['ex2']:>5} "
                      f"{s['ex2_gap']:>4} {s['calls']:>5} {s['local']:>5}")


if __name__ == "__main__":
    main()
