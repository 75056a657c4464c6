#!/usr/bin/env python3
"""Reads what a failing wgmma layout check left on the GPU machine (tests/test_ops_gpu_wgmma.cpp
dump_failure; gpu_validate.sh puts it under OUT/tests/wgmma-dumps) and prints where C is wrong:

    python3 scripts/wgmma_dump_read.py DUMP.bin [DUMP.bin ...]

For each dump: the case, a map of C's 8 x 8 blocks (. right, X wrong, N not finite) with rows
of 16 (one warp's m-tile) marked, and for the first wrong entries whether the GPU's value is
the expected value of another entry of C (an accumulator stored at the wrong place: the
fragment layout) or of none (an operand read from the wrong place: the descriptors, LBO / SBO,
or the A fragment). Plain Python: no NumPy needed on the build machine.
"""
import math
import struct
import sys


def load(path):
    with open(path, "rb") as f:
        header = f.readline().decode().split()
        M, N, K, tile, regs, acc, n_major, tma = (int(x) for x in header)
        def floats(n):
            return list(struct.unpack("<%df" % n, f.read(4 * n)))
        a, b, c0, got = floats(M * K), floats(N * K), floats(M * N), floats(M * N)
    return dict(M=M, N=N, K=K, tile=tile, regs=regs, acc=acc, n_major=n_major, tma=tma,
                a=a, b=b, c0=c0, got=got)


def expected(d):
    M, N, K = d["M"], d["N"], d["K"]
    a, b = d["a"], d["b"]
    want, mag = [0.0] * (M * N), [0.0] * (M * N)
    for m in range(M):
        row = a[m * K:(m + 1) * K]
        for n in range(N):
            s = d["c0"][m * N + n] if d["acc"] else 0.0
            t = abs(s)
            for k in range(K):
                bk = b[k * N + n] if d["n_major"] else b[n * K + k]
                p = row[k] * bk
                s += p
                t += abs(p)
            want[m * N + n], mag[m * N + n] = s, t
    return want, mag


def report(path):
    d = load(path)
    M, N = d["M"], d["N"]
    want, mag = expected(d)
    got = d["got"]
    ok = [abs(got[i] - want[i]) <= 1e-5 * mag[i] + 1e-6 for i in range(M * N)]
    print("%s: M %d N %d K %d tile %d%s%s%s%s: %d of %d entries wrong" % (
        path, M, N, d["K"], d["tile"], ", A in registers" if d["regs"] else ", A by descriptor",
        ", accumulate" if d["acc"] else "", ", B N-major" if d["n_major"] else "",
        ", TMA" if d["tma"] else "", ok.count(False), M * N))
    for bm in range(0, M, 8):
        cells = []
        for bn in range(0, N, 8):
            idx = [(bm + i) * N + bn + j for i in range(8) for j in range(8)]
            if any(not math.isfinite(got[i]) for i in idx):
                cells.append("N")
            else:
                cells.append("." if all(ok[i] for i in idx) else "X")
        print("  rows %3d-%3d %s %s" % (bm, bm + 7, "".join(cells),
                                        "(warp m-tile starts)" if bm % 16 == 0 else ""))
    shown = 0
    for i in range(M * N):
        if ok[i] or shown >= 8:
            continue
        shown += 1
        m, n = divmod(i, N)
        same = [j for j in range(M * N) if abs(got[i] - want[j]) <= 1e-5 * mag[j] + 1e-6]
        where = ", ".join("C[%d][%d]" % divmod(j, N) for j in same[:3]) or "no entry of C"
        print("  C[%d][%d] = %.6g, expected %.6g; the value expected at: %s" % (
            m, n, got[i], want[i], where))


def main():
    if len(sys.argv) < 2:
        print(__doc__)
        return 2
    for path in sys.argv[1:]:
        report(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
