#!/usr/bin/env bash
# benchmarks/gpu/gpu.py on a GPU machine that has torch but not kornia, and no network: kornia and kornia_rs
# travel as wheels in .whl/gpu (ignored by git; the device call carries the folder).
#
#   benchmarks/gpu/gpu_run.sh --fetch          # here, where pip reaches PyPI: the wheels for CPython 3.12 x86-64
#   benchmarks/gpu/gpu_run.sh [gpu.py flags]   # there: installs the wheels if kornia is missing, runs gpu.py
#
# The figures go to $OUT (the device machine's folder that comes back), else benchmarks/gpu-figures; a --out
# among the flags wins.  PYTHON picks the interpreter (default python3).
set -euo pipefail
cd "$(dirname "$0")/../.."
WHEELS=.whl/gpu
PY=${PYTHON:-python3}
# the versions this repository's venv runs; kornia_rs is kornia's one dependency the GPU machine lacks
KORNIA=kornia==0.9.0
KORNIA_RS=kornia_rs==0.2.0

if [[ ${1:-} == --fetch ]]; then
    mkdir -p "$WHEELS"
    exec "$PY" -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        -d "$WHEELS" "$KORNIA" "$KORNIA_RS"
fi

if ! "$PY" -c "import kornia" 2>/dev/null; then
    if ! compgen -G "$WHEELS/*.whl" >/dev/null; then
        echo "error: kornia is not installed and $WHEELS holds no wheels: run benchmarks/gpu/gpu_run.sh --fetch" \
             "where pip reaches PyPI, and carry $WHEELS with the call" >&2
        exit 2
    fi
    SITE=$(mktemp -d /tmp/mocolab-gpu-site.XXXXXX)
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$SITE" "$WHEELS"/*.whl
    export PYTHONPATH=$SITE${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONPATH=platform${PYTHONPATH:+:$PYTHONPATH}
export PYTHONUNBUFFERED=1
exec "$PY" benchmarks/gpu/gpu.py --out "${OUT:-benchmarks/gpu-figures}" "$@"
