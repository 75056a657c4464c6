#!/usr/bin/env bash
# The GPU bundle's runner (scripts/gpu_bundle.sh copies it to <bundle>/run.sh; docs/CUDA.md).
# The bundle carries everything except glibc and the CUDA libraries (libcudart, libcublas,
# libcublasLt, libnccl), which it takes from the machine: the CUDA toolkit, a python's nvidia-*
# wheels (PyTorch's), or the loader's cache. This script finds them and puts their directories
# on LD_LIBRARY_PATH.
#
#   run.sh ctxengine ARGS...        <bundle>/bin/ctxengine
#   run.sh test_ops_gpu_flash ARGS  <bundle>/tests/test_ops_gpu_flash
#   run.sh CMD ARGS...              any other command in the same environment (compute-sanitizer)
#   run.sh --libs                   where every needed library resolves (exit 1 if one does not)
#   source run.sh                   only set the environment (gpu_validate.sh does this)
#
# CTX_CUDA_LIB_DIRS (colon-separated) is searched before everything else.

CTX_BUNDLE_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export CTX_BUNDLE_DIR

# Directories that may hold CUDA 13 libraries, most specific first.
ctx_candidate_lib_dirs() {
    local d py
    if [[ -n "${CTX_CUDA_LIB_DIRS:-}" ]]; then tr ':' '\n' <<<"$CTX_CUDA_LIB_DIRS"; fi
    for d in "${CUDA_HOME:-}" "${CUDA_PATH:-}" /usr/local/cuda /usr/local/cuda-13*; do
        [[ -n "$d" ]] && echo "$d/lib64" "$d/lib" "$d/targets/x86_64-linux/lib" | tr ' ' '\n'
    done
    # nvidia-* pip wheels (nvidia-cublas, nvidia-nccl-cu13, nvidia-cuda-runtime): every python on
    # PATH or in a venv we can see, asked where its site-packages are.
    local seen=" " key
    for py in "${VIRTUAL_ENV:+$VIRTUAL_ENV/bin/python}" python3 python /opt/venv/bin/python \
              /venv/bin/python "${HOME:-/root}/.venv/bin/python" /opt/conda/bin/python; do
        [[ -n "$py" ]] && py=$(command -v "$py" 2>/dev/null) || continue
        # python is often python3 in the same directory (a venv's python is not: its directory
        # decides its site-packages, so it is run by its own path).
        key="$(dirname "$py"):$(realpath "$py")"
        [[ "$seen" == *" $key "* ]] && continue
        seen+="$key "
        timeout 20 "$py" - 2>/dev/null <<'EOF'
import glob, os, site, sys
roots = list(sys.path)
try:
    roots += site.getsitepackages() + [site.getusersitepackages()]
except Exception:
    pass
for r in roots:
    # CUDA 13 wheels: nvidia/cu13/lib (cuBLAS, runtime), nvidia/nccl/lib (nvidia-nccl-cu13).
    for d in sorted(glob.glob(os.path.join(r, "nvidia", "*", "lib"))):
        print(d)
EOF
    done
    # A glob over the usual site-packages locations, in case no python above could run.
    compgen -G "/usr/local/lib/python3*/dist-packages/nvidia/*/lib" || true
    compgen -G "/usr/lib/python3/dist-packages/nvidia/*/lib" || true
    compgen -G "/opt/conda/lib/python3*/site-packages/nvidia/*/lib" || true
}

# NEEDED entries of the bundle's binaries that are not inside the bundle and not glibc.
ctx_needed_external() {
    local f
    for f in "$CTX_BUNDLE_DIR"/bin/* "$CTX_BUNDLE_DIR"/tests/* "$CTX_BUNDLE_DIR"/lib/*.so*; do
        [[ -f "$f" ]] || continue
        readelf -d "$f" 2>/dev/null | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'
    done | sort -u | while read -r lib; do
        [[ -e "$CTX_BUNDLE_DIR/lib/$lib" ]] && continue
        case "$lib" in
            libc.so.*|libm.so.*|libdl.so.*|libpthread.so.*|librt.so.*|ld-linux*) ;;
            *) echo "$lib" ;;
        esac
    done
}

# The first directory of ctx_cands holding $1, or nothing.
ctx_find_lib() {
    local dir
    for dir in "${ctx_cands[@]}"; do
        if [[ -e "$dir/$1" ]]; then echo "$dir"; return; fi
    done
}

ctx_setup_env() {
    local needed lib found dirs=() missing=() joined
    needed=$(ctx_needed_external)
    mapfile -t ctx_cands < <(ctx_candidate_lib_dirs | awk 'NF && !seen[$0]++')
    for lib in $needed; do
        found=$(ctx_find_lib "$lib")
        if [[ -n "$found" ]]; then
            dirs+=("$found")
        elif ! ldconfig -p 2>/dev/null | grep -q "^[[:space:]]*$lib "; then
            missing+=("$lib")
        fi
    done
    if ((${#missing[@]})); then
        # Last resort, one bounded search: a wheel or toolkit in a place not listed above.
        local expr=() hits
        for lib in "${missing[@]}"; do expr+=(-o -name "$lib"); done
        hits=$(timeout 60 find / -xdev \( "${expr[@]:1}" \) 2>/dev/null || true)
        mapfile -t ctx_cands < <(xargs -r -n1 dirname <<<"$hits" | awk 'NF && !seen[$0]++')
        local still=()
        for lib in "${missing[@]}"; do
            found=$(ctx_find_lib "$lib")
            if [[ -n "$found" ]]; then dirs+=("$found"); else still+=("$lib"); fi
        done
        missing=("${still[@]}")
    fi
    joined=$(printf '%s\n' "${dirs[@]}" "${LD_LIBRARY_PATH:-}" | awk 'NF && !seen[$0]++' | paste -sd: -)
    export LD_LIBRARY_PATH="$joined"
    # Relocated test executables load the bundle's plugins (tests/model_fixtures.h).
    export CTX_TEST_PLUGINS="$CTX_BUNDLE_DIR/lib/ctxengine/plugins"
    CTX_MISSING_LIBS="${missing[*]}"
    export CTX_MISSING_LIBS
    if [[ -n "$CTX_MISSING_LIBS" ]]; then
        echo "run.sh: not found on this machine: $CTX_MISSING_LIBS (searched CUDA toolkit dirs," \
             "python nvidia-* wheels, ldconfig; set CTX_CUDA_LIB_DIRS=dir1:dir2)" >&2
    fi
}

# Once per bundle: gpu_validate.sh sources this file, and the run.sh calls it makes inherit it.
if [[ "${CTX_BUNDLE_ENV:-}" != "$CTX_BUNDLE_DIR" ]]; then
    ctx_setup_env
    export CTX_BUNDLE_ENV=$CTX_BUNDLE_DIR
fi

if [[ "${BASH_SOURCE[0]}" != "$0" ]]; then
    return 0  # sourced: the environment is all
fi

case "${1:-}" in
"" | -h | --help)
    sed -n 2,15p "$0"
    exit 2
    ;;
--libs)
    echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
    rc=0
    for f in "$CTX_BUNDLE_DIR"/bin/ctxengine "$CTX_BUNDLE_DIR"/tests/*; do
        [[ -f "$f" ]] || continue
        echo "== ${f#"$CTX_BUNDLE_DIR"/}"
        out=$(ldd "$f" 2>&1)
        echo "$out" | grep -v "linux-vdso" | sed 's/ (0x[0-9a-f]*)//'
        grep -q "not found" <<<"$out" && rc=1
    done
    exit $rc
    ;;
esac

cmd=$1
shift
if [[ "$cmd" == ctxengine ]]; then
    exec "$CTX_BUNDLE_DIR/bin/ctxengine" "$@"
elif [[ "$cmd" != */* && -x "$CTX_BUNDLE_DIR/tests/$cmd" ]]; then
    exec "$CTX_BUNDLE_DIR/tests/$cmd" "$@"
fi
exec "$cmd" "$@"
