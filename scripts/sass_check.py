#!/usr/bin/env python3
"""Static checks of the machine code (SASS) of the CUDA kernels, without a GPU.

    python3 scripts/sass_check.py [--cuobjdump PATH | --build DIR] [--table] BINARY_OR_CUBIN...
    python3 scripts/sass_check.py --self-test

For every function of every embedded architecture (cuobjdump -res-usage and -sass) it reports
registers, stack bytes, SASS instructions and serialized load-store pairs, and fails (exit 1) on

  1. a chain of read-modify-writes to global memory: a load whose value is stored back to the
     same address within a few instructions, MAX_SERIAL or more times in one function. Written
     as `*p += x` one entry after another, each load waits for the store before it (the store
     may alias it), so a thread makes one round trip to memory per entry: the flash backward's
     epilogues had 32-128 of them a thread (docs/CUDA.md "Gradient rows written at the end").
     The occasional pair in a loop (a table gradient) stays under the limit. What it counts is
     code, not work: a rolled loop of `*p += x` is one pair however often it runs, and a batch
     of fewer than 8 loads then stores counts as one (its first load sees its first store).
  2. stack (spills, local arrays) in a function that STACK_ALLOWED does not list, or more than
     it allows: ptxas spilling a kernel's accumulators after an edit is a silent slowdown.
  3. a kernel written with wgmma (WGMMA_KERNELS) without an HGMMA instruction: built for a
     target that lacks it (sm_90 rather than sm_90a), its wgmma calls compile to traps.
  4. a flash kernel on wgmma whose products ptxas serialised: most HGMMAs end their group
     (gsb0, each waited for before the next issues). ptxas does so, with an info message the
     build does not show (C7515, C7520), when the code around the products takes a shape it
     cannot pipeline (a product issued under a condition, accumulators written while one is
     in flight).
  5. a flash kernel on wgmma (but the dq kernels' bias-gradient instantiations, PARAM_GRADS,
     which wait for dP first by design) with fewer than SOFTMAX_EXPS MUFU.EX2 between its first wait for
     all groups but one (`WARPGROUP.DEPBAR.LE gsb0, 0x1`: S, or S^T) and its next wait: the
     exponentials are what the product still in flight (the forward's previous P V, the
     backward's dP or dP^T) is meant to run under; ptxas hoisted the forward's wait above them
     when it sat in their basic block (docs/CUDA.md "wgmma").
  6. a backward wgmma kernel meant to leave its last products running through the block barrier
     (IN_FLIGHT_AT_BARRIER: the dq kernel's dq += dS K, the dk / dv kernel's at head dim 64)
     that waits for them before it: the overlap is gone (a wait moved, or a shape ptxas
     serialised).
  7. a kernel with a producer warpgroup and two computing ones (REGISTER_HANDOFF) without both
     setmaxnreg steps (USETMAXREG.DEALLOC, USETMAXREG.TRY_ALLOC): its computing warpgroups would
     keep the launch's share, 168 registers a thread of 384 (ptxas then fits the forward at head
     dim 128 into 168 without spilling, where it takes 210 when allowed: less room to schedule).

cuobjdump: --cuobjdump, else as scripts/cuda_code_size.py finds it (whose SASS parser this
shares) with --build (default build-bundle): $CUOBJDUMP, PATH, /usr/local/cuda/bin,
BUILD/cuda-tools (the PyPI wheels nvidia-cuda-cuobjdump and nvidia-cuda-nvdisasm, whose
nvdisasm -sass runs on a library's fatbinary; scripts/gpu_bundle_check.sh installs them).
"""
import argparse
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cuda_code_size import ROOT, disassemble, find_cuobjdump, kernels  # noqa: E402

MAX_SERIAL = 16

# Functions allowed a stack frame, by a regex on the mangled name: bytes at most per
# architecture, as measured (CUDA 13.0, the bundle's sm_80 and sm_90 code, 2026-12-04); a
# listing without architecture (one cubin) gets the larger. Why each is accepted:
STACK_ALLOWED = [
    # the forward with two m-tiles at D 128, whose alternative (one m-tile,
    # CTX_FLASH_FORWARD_MTILES=1) has no spill; which is faster is for a GPU to say (sm_80:
    # 112 before the output could be written in bf16, 2026-12-04)
    (r"flash_tc_fwd_kernelILi128ELb0ELi2E", {"sm_80": 120, "sm_90": 64}),
    # the forward's instantiation for the general bias families (KERPLE-power, T5, tables),
    # two m-tiles at D 64: the out-of-line bias call's ABI (80 / 32 before the bf16 output)
    (r"flash_tc_fwd_kernelILi64ELb1ELi2E", {"sm_80": 96, "sm_90": 40}),
    # the one-kernel backward at D 128 on sm_80 (not the default backward): two staging values
    # kept on the stack, reloaded from L1 when a tile is prefetched
    (r"flash_tc_dkv_kernelILi128ELb1E", {"sm_80": 8, "sm_90": 0}),
    # the dk / dv kernel on wgmma at D 128 (CTX_FLASH_DKV=wgmma, not the default): its four
    # 64 x 64 / 64 x 128 accumulators take 192 of the 255 registers; as first written, the same
    # two staging values reloaded from L1 when a query tile is prefetched (8 bytes; 0 since the
    # two-warpgroup blocks, 2026-12-05); its one-kernel backward form with one warpgroup (dq's
    # 64 accumulators beside dk's and dv's): 8 bytes, 2026-12-06
    (r"flash_wg_dkv_kernelILi128E", {"sm_90a": 8}),
    # the one-kernel backward's producer form at D 128 (CTX_FLASH_BACKWARD=atomic with the
    # producer pipeline, ELb0ELb1E; not the default): 13 loop-invariant values of the consumers
    # (dq's atomics, the kDs barrier) stored once and reloaded from L1 once a tile (52 bytes in a
    # 56-byte frame with two consumers at 240 registers; none with one), 2026-12-06. Since dq
    # is added four columns an atomic: 48 bytes with two consumers, 8 with one (the lanes'
    # traded pairs beside dq's 64 accumulators a thread)
    (r"flash_wg_dkv_producer_kernelILi128ELi2ELb0ELb1E", {"sm_90a": 56}),
    (r"flash_wg_dkv_producer_kernelILi128ELi1ELb0ELb1E", {"sm_90a": 8}),
    # the dk / dv kernel's producer form with two consumers (CTX_FLASH_WGMMA_PIPELINE=producer):
    # 240 registers a consumer thread after setmaxnreg; loop-invariant values of the consumers'
    # named-barrier waits reloaded from L1 once a tile (20 bytes of spill in a 24-byte frame,
    # 2026-12-06; 52 while dv's products overlapped dS^T, which the producer form no longer does
    # at D 128)
    (r"flash_wg_dkv_producer_kernelILi128ELi2E", {"sm_90a": 24}),
    # the same with its tiles by TMA (CTX_FLASH_WGMMA_LOADS=tma), two consumers: the producer's
    # code at 24 registers (it also stores the query tile's positions, log-sum-exps and D) keeps
    # three loop-invariant values on the stack (3 stores, 3 reloads a tile; none in the
    # consumers' code at D 64, two values there at D 128 as in the cp.async form), 2026-12-06
    (r"flash_wg_dkv_tma_kernelILi64ELi2E", {"sm_90a": 24}),
    (r"flash_wg_dkv_tma_kernelILi128ELi2E", {"sm_90a": 16}),
    # the rotary kernels' double-precision sincos (cuda_rotary.cuh pair_rotation): libdevice's
    # argument reduction for large angles keeps its words in a local array, not a spill
    # (2026-12-05: the separate pass and the flash kernels' per-token table)
    (r"rotary(_table)?_kernel", {"sm_80": 40, "sm_90": 40}),
]


# Kernels built on the warpgroup instruction (backend/cuda/*_sm90a.cu), by a regex on the name.
WGMMA_KERNELS = re.compile(r"wgmma_gemm_kernel|flash_wg_\w+_kernel")


def lacks_wgmma(fn, instructions):
    """A wgmma kernel whose code has no HGMMA (its calls are traps)."""
    return bool(WGMMA_KERNELS.search(fn)) and not any("HGMMA" in i for i in instructions)


FLASH_WGMMA = re.compile(r"flash_wg_\w+_kernel")
SOFTMAX_EXPS = 32  # a thread's probabilities of a 64 x 64 tile (16 rows x 64 keys a warp)


def serialized_wgmma(fn, instructions):
    """A flash wgmma kernel in which more than half of the HGMMAs close their group (gsb0)."""
    if not FLASH_WGMMA.search(fn):
        return False
    hgmma = [i for i in instructions if "HGMMA" in i]
    return bool(hgmma) and 2 * sum("gsb0" in i for i in hgmma) > len(hgmma)


# Kernels whose last products of a tile are still in flight at the block barrier
# (cuda_flash_wg_sm90a.cu kWgDqStages, kWgDkvStages: three stages; of the dk / dv kernel the
# kInFlight instantiation, ELb0ELb1E: not the one-kernel backward's, whose dq product waits for
# every product of a tile, nor the one for packed documents).
IN_FLIGHT_AT_BARRIER = re.compile(
    r"flash_wg_dq_kernelILi(64ELi[12]|128ELi2)ELb0E|flash_wg_dkv_kernelILi64ELi[12]ELb0ELb1E")

# The dq kernels' instantiations with the bias-parameter gradients (kGrads, ELb1E): they wait for
# dP before the exponentials (a logit's dS and its bias terms together), so check 5 does not
# apply, and the lock-step one waits for dq += dS K in its tile (in flight, ptxas serialised it).
PARAM_GRADS = re.compile(r"flash_wg_dq(_producer|_tma)?_kernelILi\d+ELi\dELb1E")


# Kernels of a producer warpgroup and two computing ones (cuda_flash_wg_producer_sm90a.cu: the
# forward, the dq and the dk / dv kernel): 384 threads launch with 168 registers; setmaxnreg
# gives the producer's to the others.
REGISTER_HANDOFF = re.compile(r"flash_wg_(fwd|dq|dkv)_(producer|tma)_kernelILi\d+ELi2E")


def hands_registers_over(instructions):
    """Whether some warpgroup gives registers back and some takes them (setmaxnreg)."""
    return (any("USETMAXREG.DEALLOC" in i for i in instructions) and
            any("USETMAXREG.TRY_ALLOC" in i for i in instructions))


def product_in_flight_at_barrier(instructions):
    """Whether some BAR.SYNC is reached with a committed wgmma group not yet waited for."""
    pending = False
    for i in instructions:
        if "HGMMA" in i and "gsb0" in i:
            pending = True
        elif "WARPGROUP.DEPBAR.LE" in i and i.rstrip(" ;").endswith("0x0"):
            pending = False
        elif "BAR.SYNC" in i and "WARPGROUP" not in i and pending:
            return True
    return False


def exps_in_flight(instructions):
    """MUFU.EX2 between the first wait for all groups but one and the next wait."""
    start = next((k for k, i in enumerate(instructions)
                  if "WARPGROUP.DEPBAR.LE" in i and i.rstrip(" ;").endswith("0x1")), None)
    if start is None:
        return 0
    n = 0
    for i in instructions[start + 1:]:
        if "WARPGROUP.DEPBAR.LE" in i:
            break
        n += "MUFU.EX2" in i
    return n


def stack_allowed(fn, arch):
    """Bytes of stack fn may have on arch (0: none)."""
    for pattern, limits in STACK_ALLOWED:
        if re.search(pattern, fn):
            return limits.get(arch, max(limits.values()))
    return 0


ARCH = re.compile(r"arch = (sm_\d+a?)")


def by_arch(listing):
    """[(arch, text)]: a listing cut where its architecture changes (a cubin has one section)."""
    parts, arch, start = [], "?", 0
    for m in ARCH.finditer(listing):
        parts.append((arch, listing[start:m.start()]))
        arch, start = m.group(1), m.end()
    parts.append((arch, listing[start:]))
    return [(a, t) for a, t in parts if "Function" in t]


def parse_resources(listing):
    """{(arch, function): (registers, stack bytes)} of a cuobjdump -res-usage listing"""
    out = {}
    for arch, text in by_arch(listing):
        for m in re.finditer(r"Function (\S+):\s*\n(.*)", text):
            reg, stack = re.search(r"REG:(\d+)", m.group(2)), re.search(r"STACK:(\d+)", m.group(2))
            out[(arch, m.group(1))] = (int(reg.group(1)) if reg else 0,
                                        int(stack.group(1)) if stack else 0)
    return out


def parse_sass(listing):
    """{(arch, function): [instruction text]} of a cuobjdump -sass listing"""
    return {(arch, name): ins for arch, text in by_arch(listing) for name, ins in kernels(text)}


LOAD = re.compile(r"^(?:@!?U?P\w+\s+)?LDG\S*\s+R\d+,\s*(desc\[\w+\]\[[^\]]+\])")


def serialized_pairs(instructions):
    """Loads whose address is stored to within the next 8 instructions, before any other store."""
    n = 0
    for k, ins in enumerate(instructions):
        m = LOAD.match(ins)
        if not m:
            continue
        for later in instructions[k + 1:k + 9]:
            op = later.split()
            op = op[1] if op and op[0].startswith("@") and len(op) > 1 else (op[0] if op else "")
            if op.startswith("STG"):
                n += m.group(1) in later
                break
    return n


def self_test():
    """The parsers and the pair count on SASS text shaped as cuobjdump prints it (ctest
    scripts.sass_check): a chain of `*p += x`, the same with the loads first, a load whose
    store goes elsewhere, a short batch, the resource lines, the stack limits."""
    def text(body):
        return "\n".join(f"        /*{16 * k:04x}*/                   {ins} ;"
                         for k, ins in enumerate(body))
    chain, batched = [], []
    for k in range(20):
        off = f"+0x{4 * k:x}" if k else ""
        chain += [f"@!P{k % 6} LDG.E R0, desc[UR6][R4.64{off}]", "FADD R0, R0, R7",
                  f"@!P{k % 6} STG.E desc[UR6][R4.64{off}], R0"]
        batched.insert(k, f"LDG.E.64 R{2 * k + 10}, desc[UR6][R4.64{off}]")
        batched.append(f"STG.E.64 desc[UR6][R4.64{off}], R{2 * k + 10}")
    small = batched[:4] + batched[20:24]  # 4 loads then 4 stores: counted once
    code = {0: chain, 1: batched, 2: ["LDG.E R0, desc[UR6][R4.64]", "STG.E desc[UR6][R2.64], R0"],
            3: small}
    listing = "".join(f"\n Fatbin elf code:\n arch = sm_{a}\n"
                      f"        Function : k{k}\n{text(b)}\n"
                      for a in (80, 90) for k, b in code.items())
    got = {fn: serialized_pairs(ins) for fn, ins in parse_sass(listing).items()}
    want = {(f"sm_{a}", f"k{k}"): n for a in (80, 90)
            for k, n in ((0, 20), (1, 0), (2, 0), (3, 1))}
    assert got == want, got
    res = parse_resources("\n arch = sm_90\n Function k0:\n  REG:255 STACK:64 SHARED:1024 "
                          "LOCAL:0\n Function k1:\n  REG:40 STACK:0 SHARED:0 LOCAL:0\n")
    assert res == {("sm_90", "k0"): (255, 64), ("sm_90", "k1"): (40, 0)}, res
    fwd = "_ZN3ctx4cuda2tc19flash_tc_fwd_kernelILi128ELb0ELi2EEEvPfS3_NS1_6TcArgsE"
    got = [stack_allowed(fwd, a) for a in ("sm_80", "sm_90", "?")]
    assert got == [120, 64, 120], got
    assert stack_allowed(fwd.replace("ELi2E", "ELi1E"), "sm_90") == 0
    wg = parse_sass("\n arch = sm_90a\n        Function : _Z17wgmma_gemm_kernelILi64ELb0EEvv\n" +
                    text(["HGMMA.64x64x16.F32.BF16 R24, gdesc[UR16], R24, gsb0", "EXIT"]))
    assert list(wg) == [("sm_90a", "_Z17wgmma_gemm_kernelILi64ELb0EEvv")], wg
    assert [lacks_wgmma(fn, ins) for (_, fn), ins in wg.items()] == [False]
    assert lacks_wgmma("_Z17wgmma_gemm_kernelILi64ELb0EEvv", ["BPT.TRAP 0x1", "EXIT"])
    assert not lacks_wgmma("_Z10add_kernelv", ["EXIT"])
    s_chain = [f"HGMMA.64x64x16.F32.BF16 R88, gdesc[UR16], R88{', gsb0' if k == 7 else ''}"
               for k in range(8)]
    serial = [x for k in range(8) for x in (f"HGMMA.64x64x16.F32.BF16 R88, gdesc[UR16], R88, "
                                           "gsb0", "WARPGROUP.DEPBAR.LE gsb0, 0x0")]
    fwd_wg = "_ZN3ctx4cuda2tc19flash_wg_fwd_kernelILi128ELi2EEEvPfS4_NS1_6TcArgsE"
    assert not serialized_wgmma(fwd_wg, s_chain) and serialized_wgmma(fwd_wg, serial)
    assert not serialized_wgmma("_Z17wgmma_gemm_kernelILi64ELb0EEvv", serial)  # one at a time
    exps = ["MUFU.EX2 R88, R88"] * 34
    hoisted = (["WARPGROUP.DEPBAR.LE gsb0, 0x1", "SHFL.BFLY PT, R1, R2, 0x1, 0x1f",
                "WARPGROUP.DEPBAR.LE gsb0, 0x0"] + exps + ["WARPGROUP.DEPBAR.LE gsb0, 0x0"])
    below = ["WARPGROUP.DEPBAR.LE gsb0, 0x1"] + exps + ["WARPGROUP.DEPBAR.LE gsb0, 0x0"]
    got = [exps_in_flight(x) for x in (hoisted, below, exps, below[:-1] + [below[0]])]
    assert got == [0, 34, 0, 34], got
    dq = "HGMMA.64x128x16.F32.BF16 R24, R152, gdesc[UR12].tnspB, R24, gsb0"
    waited = [dq, "WARPGROUP.DEPBAR.LE gsb0, 0x0", "BAR.SYNC.DEFER_BLOCKING 0x0"]
    running = [dq, "BAR.SYNC.DEFER_BLOCKING 0x0", "WARPGROUP.DEPBAR.LE gsb0, 0x1"]
    assert [product_in_flight_at_barrier(x) for x in (waited, running)] == [False, True]
    dq_wg = "_ZN3ctx4cuda2tc19flash_wg_dq_kernelILi128ELi2ELb0EEEvPfS4_PKfS6_NS1_6TcArgsE"
    assert IN_FLIGHT_AT_BARRIER.search(dq_wg) and not PARAM_GRADS.search(dq_wg)
    assert not IN_FLIGHT_AT_BARRIER.search(dq_wg.replace("ELi2E", "ELi1E"))
    assert not IN_FLIGHT_AT_BARRIER.search(dq_wg.replace("ELb0E", "ELb1E"))
    assert PARAM_GRADS.search(dq_wg.replace("ELb0E", "ELb1E"))
    dkv_wg = "_ZN3ctx4cuda2tc19flash_wg_dkv_kernelILi64ELi2ELb0ELb1EEEvPfPKfS5_NS1_6TcArgsE"
    assert IN_FLIGHT_AT_BARRIER.search(dkv_wg)  # not the one-kernel backward's, nor packed rows'
    assert not IN_FLIGHT_AT_BARRIER.search(dkv_wg.replace("ELb0ELb1E", "ELb1ELb0E"))
    assert not IN_FLIGHT_AT_BARRIER.search(dkv_wg.replace("ELb0ELb1E", "ELb0ELb0E"))
    assert PARAM_GRADS.search(dq_wg.replace("ELb0E", "ELb1E").replace("dq_", "dq_producer_"))
    prod = "_ZN3ctx4cuda2tc28flash_wg_fwd_producer_kernelILi128ELi2EEEvPfS4_NS1_6TcArgsE"
    assert REGISTER_HANDOFF.search(prod) and not REGISTER_HANDOFF.search(prod.replace("Li2E", "Li1E"))
    assert REGISTER_HANDOFF.search(prod.replace("fwd", "dq"))
    assert REGISTER_HANDOFF.search(prod.replace("fwd", "dkv"))
    assert REGISTER_HANDOFF.search(prod.replace("producer", "tma"))
    assert PARAM_GRADS.search(dq_wg.replace("ELb0E", "ELb1E").replace("dq_", "dq_tma_"))
    both = ["USETMAXREG.TRY_ALLOC.CTAPOOL UP0, 0xf0", "EXIT", "USETMAXREG.DEALLOC.CTAPOOL 0x18"]
    assert [hands_registers_over(x) for x in (both, both[:2], both[1:])] == [True, False, False]
    print("sass_check: self-test passed (pairs counted 20 / 0 / 0 / 1)")
    return 0


def main():
    if sys.argv[1:] == ["--self-test"]:
        return self_test()
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("files", nargs="+")
    ap.add_argument("--cuobjdump")
    ap.add_argument("--build", default=os.path.join(ROOT, "build-bundle"))
    ap.add_argument("--table", action="store_true", help="print every function's numbers")
    a = ap.parse_args()
    tool = a.cuobjdump or find_cuobjdump(a.build)
    failures, functions = [], 0
    for path in a.files:
        res = parse_resources(disassemble(tool, "-res-usage", path))
        code = parse_sass(disassemble(tool, "-sass", path))
        if not code:
            failures.append(f"{path}: no device code found")
        for (arch, fn) in sorted(set(res) | set(code)):
            functions += 1
            reg, stack = res.get((arch, fn), (0, 0))
            ins = code.get((arch, fn), [])
            pairs = serialized_pairs(ins)
            if a.table:
                print(f"{arch} {reg:4d} reg {stack:5d} B stack {len(ins):7d} instr "
                      f"{pairs:4d} serial  {fn}")
            where = f"{os.path.basename(path)} {arch} {fn}"
            if pairs >= MAX_SERIAL:
                failures.append(f"{where}: {pairs} serialized load-store pairs (at most "
                                f"{MAX_SERIAL - 1}): load every old value before storing any")
            if lacks_wgmma(fn, ins):
                failures.append(f"{where}: no HGMMA instruction: built for a target without "
                                f"wgmma (sm_90a)?")
            if serialized_wgmma(fn, ins):
                failures.append(f"{where}: its wgmma products are serialized (most HGMMAs "
                                f"carry gsb0): ptxas -v names the cause (C7515 / C7520)")
            if (FLASH_WGMMA.search(fn) and not PARAM_GRADS.search(fn) and
                    exps_in_flight(ins) < SOFTMAX_EXPS):
                failures.append(f"{where}: {exps_in_flight(ins)} MUFU.EX2 while a product is "
                                f"in flight, at least {SOFTMAX_EXPS} expected: its wait moved "
                                f"above the exponentials")
            if IN_FLIGHT_AT_BARRIER.search(fn) and not product_in_flight_at_barrier(ins):
                failures.append(f"{where}: waits for its last products before the block "
                                f"barrier; they are meant to run through it (three stages)")
            if REGISTER_HANDOFF.search(fn) and not hands_registers_over(ins):
                failures.append(f"{where}: no setmaxnreg pair (USETMAXREG.DEALLOC / TRY_ALLOC): "
                                f"its computing warpgroups keep the launch's registers")
            if stack > stack_allowed(fn, arch):
                failures.append(f"{where}: {stack} bytes of stack (spills?), at most "
                                f"{stack_allowed(fn, arch)} allowed (STACK_ALLOWED)")
    for f in failures:
        print("FAIL:", f)
    print(f"sass_check: {functions} functions in {len(a.files)} file(s), "
          f"{len(failures)} failure(s) ({tool})")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
