#!/usr/bin/env bash
# wgmma_dump_read.sh REPO DIR: scripts/wgmma_dump_read.py on dumps written as
# tests/test_ops_gpu_wgmma.cpp's dump_failure writes them: a C whose row halves g and g + 8 are
# swapped (a wrong accumulator layout) must be reported as values that belong elsewhere in C,
# and a C from a scrambled operand as values of no entry; a right C has no wrong block.
set -u
repo=$1; dir=$2
rm -rf "$dir"; mkdir -p "$dir"
python3 - "$dir" <<'PY' || exit 1
import random, struct, sys
d = sys.argv[1]
M, N, K = 16, 8, 16
rnd = random.Random(5)
a = [round(rnd.gauss(0, 1) * 64) / 64 for _ in range(M * K)]
b = [round(rnd.gauss(0, 1) * 64) / 64 for _ in range(N * K)]
c0 = [0.0] * (M * N)
want = [sum(a[m * K + k] * b[n * K + k] for k in range(K)) for m in range(M) for n in range(N)]
def write(name, got):
    with open("%s/%s.bin" % (d, name), "wb") as f:
        f.write(b"%d %d %d 64 0 0 0 0\n" % (M, N, K))
        for v in (a, b, c0, got):
            f.write(struct.pack("<%df" % len(v), *v))
write("right", want)
write("rows_swapped", [want[((m + 8) % 16) * N + n] for m in range(M) for n in range(N)])
write("scrambled", [w + 1000.0 for w in want])
PY
out=$(python3 "$repo/scripts/wgmma_dump_read.py" "$dir/right.bin" "$dir/rows_swapped.bin" \
      "$dir/scrambled.bin") || { echo "FAIL: the reader exited non-zero"; exit 1; }
echo "$out"
fail=0
expect() { grep -qE -- "$1" <<<"$out" || { echo "FAIL: no line matching: $1"; fail=1; }; }
expect "right.bin: M 16 N 8 K 16 tile 64, A by descriptor: 0 of 128 entries wrong"
expect "rows_swapped.bin: .*: 128 of 128 entries wrong"
expect "C\[0\]\[0\] = .*the value expected at: C\[8\]\[0\]"
expect "scrambled.bin: .*: 128 of 128 entries wrong"
expect "the value expected at: no entry of C"
exit $fail
