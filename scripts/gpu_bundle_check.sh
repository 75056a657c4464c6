#!/usr/bin/env bash
# Checks a GPU bundle made by scripts/gpu_bundle.sh (docs/CUDA.md "The GPU bundle"), without a GPU:
#   1. its size (CTX_BUNDLE_MAX_MIB, default 60: the device tool carries at most 64 MiB, the repository included);
#   2. every ELF file's dynamic dependencies (ldd, in run.sh's environment): only glibc, the CUDA
#      libraries or files inside the bundle (its lib/ carries libstdc++, libgcc_s, libgomp);
#   3. the highest GLIBC_x.y symbol version any of them needs (<= CTX_BUNDLE_MAX_GLIBC, default
#      2.36, Debian 12's glibc);
#   4. a copy of the bundle in a temporary directory, run from there with a clean environment:
#      ctxengine (version, plugins found inside the copy, the smoke recipe and both benchmarks on
#      the CPU, the refusal of an MPI launch), every gpu test executable (skips without a GPU,
#      passes with one) and gpu_validate.sh itself with a short budget;
#   5. the kernels' SASS in lib/libctx_backend.so (scripts/sass_check.py: no chains of read-modify-writes
#      to global memory, no stack beyond its list); skipped, saying so, when no cuobjdump can be had.
# Usage: bash scripts/gpu_bundle_check.sh [BUNDLE]   (default build-gpu-bundle)
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
BUNDLE=$(cd "${1:-build-gpu-bundle}" && pwd)
MAX_MIB=${CTX_BUNDLE_MAX_MIB:-60}
MAX_GLIBC=${CTX_BUNDLE_MAX_GLIBC:-2.36}
fails=0
bad() { echo "FAIL: $*"; fails=$((fails + 1)); }

# ---- 1. size
bytes=$(du -sb "$BUNDLE" | cut -f1)
mib=$(awk -v b="$bytes" 'BEGIN { printf "%.1f", b / 1048576 }')
echo "size: $mib MiB ($(find "$BUNDLE" -type f | wc -l) files; limit $MAX_MIB MiB)"
awk -v m="$mib" -v l="$MAX_MIB" 'BEGIN { exit !(m <= l) }' || bad "bundle is $mib MiB, over $MAX_MIB MiB"
(cd "$BUNDLE" && find . -type f -size +1M -printf '  %8k KiB  %P\n' | sort -rn)

# ---- 2. ldd
mapfile -t elfs < <(find "$BUNDLE" -type f -exec sh -c 'head -c 4 "$1" | grep -q "ELF" && echo "$1"' _ {} \; | sort)
((${#elfs[@]} > 0)) || bad "no ELF files in $BUNDLE"
declare -A kinds=()
# The CUDA library directories run.sh finds here.
cuda_path=$(bash -c 'source "$1/run.sh" >/dev/null 2>&1; echo "$LD_LIBRARY_PATH"' _ "$BUNDLE")
for f in "${elfs[@]}"; do
    rel=${f#"$BUNDLE"/}
    # The carried runtimes have no RUNPATH: in a process they find each other because the
    # executable loaded them from lib/ first, which LD_LIBRARY_PATH models here.
    pre=""
    [[ "$rel" =~ ^lib/lib(stdc\+\+|gcc_s|gomp)\.so ]] && pre="$BUNDLE/lib"
    out=$(LD_LIBRARY_PATH="$pre${pre:+:}$cuda_path" ldd "$f" 2>&1) || true
    glibc=() cuda=() inside=()
    while read -r line; do
        [[ -z "$line" || "$line" == *linux-vdso* || "$line" == *"statically linked"* ]] && continue
        name=${line%% *}
        path=""
        [[ "$line" == *" => "* ]] && path=$(sed -E 's/.* => ([^ ]*).*/\1/' <<<"$line")
        name=$(basename "$name")
        if [[ "$path" == "not" ]]; then
            bad "$rel: $name not found"
        elif [[ "$name" =~ ^(libc|libm|libdl|libpthread|librt)\.so\.[0-9]+$ || "$name" == ld-linux* ]]; then
            glibc+=("$name")
        elif [[ "$name" =~ ^lib(cudart|cublas|cublasLt|nccl|cuda)\.so ]]; then
            cuda+=("$name")
        elif [[ -n "$path" && "$(realpath "$path")" == "$BUNDLE"/* ]]; then
            inside+=("$name")
        else
            bad "$rel needs $name (${path:-?}): neither glibc, CUDA nor inside the bundle"
        fi
    done <<<"$out"
    kinds["$rel"]="glibc: ${glibc[*]:-}; cuda: ${cuda[*]:-}; bundle: ${inside[*]:-}"
done
echo "ldd (${#elfs[@]} ELF files):"
printf '%s\n' "${!kinds[@]}" | sort | while read -r k; do printf '  %-48s %s\n' "$k" "${kinds[$k]}"; done

# ---- 3. symbol versions
# versions PREFIX FILE...: the PREFIX_x.y versions the files need from their libraries.
versions() {
    local prefix=$1 f
    shift
    for f in "$@"; do objdump -T "$f" 2>/dev/null | grep -o "${prefix}_[0-9][0-9.]*" || true; done |
        sed "s/^${prefix}_//" | sort -uV
}
max=$(versions GLIBC "${elfs[@]}" | tail -1)
worst=""
for f in "${elfs[@]}"; do
    versions GLIBC "$f" | grep -qx "$max" && worst+="${worst:+, }${f#"$BUNDLE"/}"
done
own=()
for f in "${elfs[@]}"; do [[ "${f#"$BUNDLE"/}" =~ ^lib/lib(stdc\+\+|gcc_s|gomp)\.so ]] || own+=("$f"); done
echo "highest GLIBC version needed: GLIBC_$max (limit $MAX_GLIBC), by: $worst;" \
     "by the files built here: GLIBC_$(versions GLIBC "${own[@]}" | tail -1)"
[[ "$(printf '%s\n%s\n' "$max" "$MAX_GLIBC" | sort -V | tail -1)" == "$MAX_GLIBC" ]] ||
    bad "GLIBC_$max is newer than GLIBC_$MAX_GLIBC"
cxx=$(versions GLIBCXX "${elfs[@]}" | tail -1)
echo "highest GLIBCXX version needed: ${cxx:+GLIBCXX_}${cxx:-none} (lib/libstdc++.so.6 is carried)"

# ---- 4. run a copy from elsewhere
tmp=$(mktemp -d "${TMPDIR:-/tmp}/ctx-bundle-check.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
cp -a "$BUNDLE" "$tmp/bundle"
B="$tmp/bundle"
cd "$tmp"
# A clean environment: nothing from this shell (LD_LIBRARY_PATH, CTX_*) leaks into the runs.
clean=(env -i "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" "HOME=$tmp" "TMPDIR=$tmp"
       OMP_NUM_THREADS=2)
# check NAME EXPECTED_RC REGEX CMD...: the run's exit code and an output line matching REGEX.
check() {
    local name=$1 want=$2 regex=$3 rc=0
    shift 3
    timeout 600 "${clean[@]}" "$@" >"$tmp/$name.log" 2>&1 || rc=$?
    if [[ $rc != "$want" ]]; then
        bad "$name: exit code $rc, expected $want"; tail -15 "$tmp/$name.log" | sed 's/^/    /'
    elif ! grep -qE -- "$regex" "$tmp/$name.log"; then
        bad "$name: no line matches /$regex/"; tail -15 "$tmp/$name.log" | sed 's/^/    /'
    else
        echo "  ok  $name: $(grep -E -- "$regex" "$tmp/$name.log" | tail -1 | cut -c1-100)"
    fi
}
echo "runs from $tmp (a copy, clean environment):"
check version 0 "^ctxengine [0-9]+\.[0-9]+\.[0-9]+" "$B/run.sh" ctxengine --version
check list-plugins 0 "^pe/rope +pe .*$tmp/bundle/lib/ctxengine/plugins/pe/pe_rope\.so" "$B/run.sh" ctxengine --list-plugins
if grep -E "\.so$" "$tmp/list-plugins.log" | grep -v "$tmp/bundle/" | grep -q .; then
    bad "list-plugins: plugins loaded from outside the bundle copy"
fi
grep -q "^rejected" "$tmp/list-plugins.log" && bad "list-plugins: plugins rejected"
check smoke-recipe-cpu 0 "eval loss [0-9.]+ -> [0-9.]+" "$B/run.sh" ctxengine --device cpu "$B/recipes/smoke.lua"
check bench-train-cpu 0 "^mfu=" "$B/run.sh" ctxengine --threads 1 bench --config tiny --steps 2 --warmup 1 --device cpu
check bench-attention-cpu 0 "^materialised +64 +64 +1 +4 +alibi" \
    "$B/run.sh" ctxengine --threads 1 bench attention --device cpu --T 64 --steps 1 --repeats 1
check refuses-mpirun 2 "this build has no MPI" env OMPI_COMM_WORLD_SIZE=2 "$B/run.sh" ctxengine "$B/recipes/smoke.lua"
for t in "$B"/tests/*; do
    name=$(basename "$t")
    check "$name" 0 "^\[  PASSED  \] [0-9]+ test" "$B/run.sh" "$name" --gtest_output="xml:$tmp/$name.xml"
    grep -qE "^\[  (FAILED|SKIPPED) +\] [0-9]+ test" "$tmp/$name.log" &&
        echo "      $(grep -E '^\[  (SKIPPED|FAILED) +\] [0-9]+ test' "$tmp/$name.log" | paste -sd' ' -)"
done
# gpu_validate.sh end to end: without a GPU every test step must still be ok (skips); the CUDA
# recipes and benchmarks fail, which is what its exit code 1 says then.
vrc=0
timeout 600 "${clean[@]}" OUT="$tmp/validate" CTX_VALIDATE_BUDGET_S=240 bash "$B/gpu_validate.sh" \
    >"$tmp/validate.log" 2>&1 || vrc=$?
if [[ ! -s "$tmp/validate/summary.txt" ]] || ! grep -q "step(s) not ok" "$tmp/validate/summary.txt"; then
    bad "gpu_validate.sh wrote no summary (exit $vrc)"; tail -20 "$tmp/validate.log" | sed 's/^/    /'
else
    ntests=$(find "$B/tests" -type f | wc -l)
    nok=$(grep -cE "^test_[a-z0-9_]+ +ok " "$tmp/validate/summary.txt" || true)
    nxml=$(find "$tmp/validate/tests" -name '*.xml' | wc -l)
    if ((nok != ntests || nxml != ntests)); then
        bad "gpu_validate.sh: $nok of $ntests test steps ok, $nxml XML files"
        sed 's/^/    /' "$tmp/validate/summary.txt"
    else
        echo "  ok  gpu_validate.sh: $nok test steps ok, $nxml XML files, exit $vrc; $(tail -1 "$tmp/validate/summary.txt")"
    fi
fi

# ---- 5. the kernels' machine code (scripts/sass_check.py): no chain of read-modify-writes to
# global memory, no stack (spills) beyond its list. cuobjdump is not in the CUDA toolkit here,
# so it comes from PyPI (nvidia-cuda-cuobjdump, and nvidia-cuda-nvdisasm which -sass runs) into a
# venv beside the bundle's build.
sass_check=$here/sass_check.py
bdir=${BUILD_DIR:-build-bundle}
[[ $bdir == /* ]] || bdir=$here/../$bdir
tools_venv=$bdir/cuda-tools  # where sass_check.py (cuda_code_size.py's finder) looks last
why=""
if [[ -z "${CUOBJDUMP:-}" ]] && ! command -v cuobjdump >/dev/null && [[ ! -x /usr/local/cuda/bin/cuobjdump ]] &&
    ! ls "$tools_venv"/lib/python3*/site-packages/nvidia/cu*/bin/nvdisasm >/dev/null 2>&1; then
    if ! "$tools_venv/bin/python" -m pip --version >/dev/null 2>&1; then
        rm -rf "$tools_venv"
        python3 -m venv "$tools_venv" >/dev/null 2>&1 || why="python3 -m venv failed (Debian: python3-venv)"
    fi
    [[ -n "$why" ]] || "$tools_venv/bin/python" -m pip install --quiet --disable-pip-version-check \
        --timeout 30 --retries 1 "nvidia-cuda-cuobjdump>=13,<14" "nvidia-cuda-nvdisasm>=13,<14" \
        >/dev/null 2>&1 || why="pip could not install nvidia-cuda-cuobjdump/nvdisasm (offline?)"
fi
if [[ -n "$why" ]]; then
    echo "SKIPPED: the SASS check (no cuobjdump on PATH or in /usr/local/cuda/bin; $why)"
elif out=$(python3 "$sass_check" --build "$bdir" "$BUNDLE"/lib/libctx_backend.so 2>&1); then
    echo "  ok  $(tail -1 <<<"$out")"
else
    bad "SASS check:"; sed 's/^/    /' <<<"$out"
fi

if ((fails)); then
    echo "gpu_bundle_check: $fails check(s) FAILED"
    exit 1
fi
echo "gpu_bundle_check: all checks passed ($mib MiB, GLIBC_$max)"
