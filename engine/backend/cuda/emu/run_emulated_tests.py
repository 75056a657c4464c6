#!/usr/bin/env python3
"""Runs the CUDA backend's consistency tests with the kernels and the CUDA runtime EMULATED on the
CPU (no GPU needed): a logic check of the backend (indexing, cuBLAS operand mapping, reductions,
barriers, host/device staging) against the CPU backend. It is not a GPU validation: timing,
memory-model races the round-robin scheduler does not expose, real cuBLAS and the nvcc build are
not exercised (docs/CUDA.md).

usage: engine/backend/cuda/emu/run_emulated_tests.py BUILD_DIR [--asan] [--model] [--mpi=N]
           [--only=NAME[,NAME...]] [-- GTEST_ARGS]

BUILD_DIR: a configured ctxengine build with CUDA in which the GPU op tests
(tests/test_ops_gpu_*.cpp; with --model also test_gpu_model, test_gpu_resume and
test_context_parallel_cuda_mpi) have been built,
so its compile_commands.json, link lines, libraries and plugins can be reused. Objects go to
BUILD_DIR/cuda_emu[_asan]/.
--asan: AddressSanitizer (catches out-of-bounds accesses of the kernels; slower).
--model: also the whole-model tests (tests/test_gpu_model.cpp, tests/test_gpu_resume.cpp).
--only=NAMES: run only these test executables (e.g. --only=test_ops_gpu_flash).
--mpi=N: run each under mpirun with N ranks, each emulating its own GPU (the multi-rank model
tests, e.g. --model --mpi=2 --only=test_context_parallel_cuda_mpi; NCCL is not emulated, so the
groups stage through host memory: CTX_GROUP_COLLECTIVES=host is set).
Environment: CTX_EMU_DEVICES=N emulates N devices (default 2 for the op tests, 1 otherwise);
CTX_EMU_THREAD_ORDER=reverse runs a block's threads highest first between barriers
(a read of a lower thread's write with no barrier between then fails; the default order shows
the reverse dependency); CTX_EMU_CP_ASYNC=eager lands cp.async copies when issued;
CTX_EMU_STREAM=deferred queues stream work (kernels, copies, cuBLAS) until the next
synchronisation, as a GPU running behind the host (a host buffer reused while a copy still reads
it, or host data read before the copy that fills it, then shows);
CTX_EMU_WGMMA_WAIT=yield lets the block's other threads run on before a thread's wgmma products
read their operands at its wait (a store racing with them then shows);
CTX_EMU_SHARED_FILL=garbage starts shared memory as 0xAB bytes instead of NaN (0xFF);
CTX_EMU_SCHEDULE=random[:SEED] pauses each warp at random rounds of a block's scheduler, so
warps drift apart (a barrier protocol that relies on their staying close then fails);
CTX_EMU_LT_REFUSE=bf16_out,dgelu makes the emulated cuBLASLt heuristic offer no algorithm for a
bf16 output / the DGELU epilogues (the tests set it to check the callers' fallbacks).
This runner sets CTX_EMU_SCHEDULE=random:1 and CTX_EMU_WGMMA_WAIT=yield unless they are set
(round-robin and run: the emulator's own defaults).
"""
import json
import os
import re
import shlex
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", "..", "..", ".."))
CUDA_DIR = os.path.join(ROOT, "engine", "backend", "cuda")
# run a second time with CTX_EMU_STREAM=deferred (unless the caller chose a mode)
DEFERRED_TOO = {"test_ops_gpu_uploads"}


def emulate_kernels(src, dst):
    """Kernel launches and dynamic shared memory in a form a C++ compiler accepts."""
    s = open(src).read()
    s = re.sub(r"(\w+(?:<\w+>)?)\s*<<<(.*?)>>>\s*\(",
               lambda m: "emu::launch(" + m.group(1) + ", " + m.group(2) + ", ", s, flags=re.S)
    s = re.sub(r"extern __shared__ (\w+) (\w+)\[\];",
               r"\1* \2 = reinterpret_cast<\1*>(emu::dyn_shared());", s)
    open(dst, "w").write(s)


def main():
    args = sys.argv[1:]
    gtest_args = []
    if "--" in args:
        gtest_args = args[args.index("--") + 1:]
        args = args[:args.index("--")]
    asan = "--asan" in args
    model = "--model" in args
    only = None
    ranks = 0
    for a in args:
        if a.startswith("--only="):
            only = a[len("--only="):].split(",")
        if a.startswith("--mpi="):
            ranks = int(a[len("--mpi="):])
    rest = [a for a in args if not a.startswith("--")]
    if len(rest) != 1:
        sys.exit(__doc__)
    build = os.path.abspath(rest[0])
    out = os.path.join(build, "cuda_emu_asan" if asan else "cuda_emu")
    os.makedirs(out, exist_ok=True)
    cc = json.load(open(os.path.join(build, "compile_commands.json")))
    by_file = {os.path.abspath(c["file"]): c for c in cc}

    def flags_of(path):
        cmd = shlex.split(by_file[path]["command"])
        keep, skip = [], False
        for i, a in enumerate(cmd[1:]):
            if skip:
                skip = False
                continue
            if a in ("-o", "-c"):
                skip = True
                continue
            if a == "-isystem" and "cuda" in cmd[i + 2]:
                skip = True
                continue
            if a.startswith("-O"):
                continue
            keep.append(a)
        extra = ["-I" + HERE, "-O1", "-g", "-Wno-unknown-pragmas"]
        if asan:
            extra += ["-fsanitize=address", "-fno-omit-frame-pointer"]
        return [cmd[0]] + extra + keep

    backend_flags = flags_of(os.path.join(ROOT, "engine", "backend", "cpu", "cpu_dense.cpp"))
    jobs = []  # (flags, source, object)
    kernel_files = sorted(f[:-3] for f in os.listdir(CUDA_DIR) if f.endswith(".cu"))
    for k in kernel_files:
        dst = os.path.join(out, k + "_emu.cpp")
        emulate_kernels(os.path.join(CUDA_DIR, k + ".cu"), dst)
        jobs.append((backend_flags, dst, os.path.join(out, k + "_emu.o")))
    sources = [os.path.join(HERE, f) for f in ("emu_runtime.cpp", "emu_tma.cpp", "emu_blas.cpp")]
    sources += [os.path.join(CUDA_DIR, f) for f in sorted(os.listdir(CUDA_DIR))
                if f.endswith(".cpp") and f != "cuda_stub.cpp"]
    # backend/*.cpp (shared argument checks, op_common.cpp) and the CPU backend: the emulated
    # objects replace libctx_backend.a on the link line
    be_dir = os.path.join(ROOT, "engine", "backend")
    sources += [os.path.join(be_dir, f) for f in sorted(os.listdir(be_dir)) if f.endswith(".cpp")]
    cpu_dir = os.path.join(ROOT, "engine", "backend", "cpu")
    sources += [os.path.join(cpu_dir, f) for f in sorted(os.listdir(cpu_dir)) if f.endswith(".cpp")]
    # The NCCL reducer as built without NCCL (a factory that says so): the real one in
    # libctx_parallel.a needs libnccl and the CUDA runtime, which emulation leaves out.
    sources.append(os.path.join(ROOT, "engine", "parallel", "nccl_reducer.cpp"))
    for s in sources:
        jobs.append((backend_flags, s, os.path.join(out, os.path.basename(s)[:-4] + ".o")))
    backend_objs = [j[2] for j in jobs]
    # every op test (tests/test_ops_gpu_*.cpp), so a new one is emulated without being listed
    tests = [(f[:-4], os.path.join(ROOT, "tests", f))
             for f in sorted(os.listdir(os.path.join(ROOT, "tests")))
             if f.startswith("test_ops_gpu_") and f.endswith(".cpp")]
    if model:
        tests.append(("test_gpu_model", os.path.join(ROOT, "tests", "test_gpu_model.cpp")))
        tests.append(("test_gpu_resume", os.path.join(ROOT, "tests", "test_gpu_resume.cpp")))
        tests.append(("test_context_parallel_cuda_mpi",
                      os.path.join(ROOT, "tests", "test_context_parallel_cuda_mpi.cpp")))
    if only is not None:
        unknown = [o for o in only if o not in [t[0] for t in tests]]
        if unknown:
            sys.exit("run_emulated_tests: --only names no emulated test: " + ", ".join(unknown) +
                     " (the op tests are tests/test_ops_gpu_*.cpp; the model tests need --model)")
        tests = [t for t in tests if t[0] in only]
    for name, src in tests:
        jobs.append((flags_of(src), src, os.path.join(out, name + ".o")))

    def compile_one(job):
        flags, src, obj = job
        r = subprocess.run(flags + ["-c", src, "-o", obj], capture_output=True, text=True)
        return src, r

    with ThreadPoolExecutor(max_workers=max(1, min(4, os.cpu_count() or 1))) as ex:
        for src, r in ex.map(compile_one, jobs):
            if r.returncode != 0 or r.stderr.strip():
                print(r.stderr, file=sys.stderr)
            if r.returncode != 0:
                sys.exit(f"compile failed: {src}")

    status = 0
    for name, _ in tests:
        link = open(os.path.join(build, "tests", "CMakeFiles", name + ".dir", "link.txt")).read().split()
        cmd = []
        for a in link:
            if a.endswith(name + ".cpp.o"):
                cmd += [os.path.join(out, name + ".o")] + backend_objs
            elif "libctx_backend.a" in a or "/cuda/" in a or a in ("-lcudadevrt", "-lcudart_static"):
                continue
            elif a.startswith("-L") and "cuda" in a:
                continue
            elif a == "-o":
                cmd.append(a)
            else:
                cmd.append(a)
        exe = os.path.join(out, name)
        cmd[cmd.index("-o") + 1] = exe
        if asan:
            cmd.insert(1, "-fsanitize=address")
        cmd.append("-fopenmp")
        r = subprocess.run(cmd, cwd=os.path.join(build, "tests"), capture_output=True, text=True)
        if r.returncode != 0:
            print(r.stderr, file=sys.stderr)
            sys.exit(f"link failed: {name}")
        env = dict(os.environ, ASAN_OPTIONS="detect_leaks=0")
        # two emulated devices for the op tests (whose per-device test needs them), one per
        # rank for the multi-rank model tests
        if name.startswith("test_ops_gpu_"):
            env.setdefault("CTX_EMU_DEVICES", "2")
        # warps drift apart as on an SM, and a thread's wgmma products read their operands as
        # late as a GPU may: the runner's defaults since 2026-12-06, when the whole op suite
        # passed so (about a fifth slower); CTX_EMU_SCHEDULE=round-robin and
        # CTX_EMU_WGMMA_WAIT=run give the emulator's own defaults
        env.setdefault("CTX_EMU_SCHEDULE", "random:1")
        env.setdefault("CTX_EMU_WGMMA_WAIT", "yield")
        launch = [exe]
        if ranks > 0:
            env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
                       CTX_GROUP_COLLECTIVES="host")
            launch = ["mpirun", "--oversubscribe", "-np", str(ranks), exe]
        print(f"== {name} (emulated CUDA{f', {ranks} ranks' if ranks else ''})", flush=True)
        status |= subprocess.run(launch + gtest_args, env=env).returncode
        # the upload ring's test has teeth only when copies run behind the host: also deferred
        if name in DEFERRED_TOO and "CTX_EMU_STREAM" not in os.environ:
            print(f"== {name} (emulated CUDA, CTX_EMU_STREAM=deferred)", flush=True)
            status |= subprocess.run(launch + gtest_args,
                                     env=dict(env, CTX_EMU_STREAM="deferred")).returncode
    sys.exit(status)


if __name__ == "__main__":
    main()
