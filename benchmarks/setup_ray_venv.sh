#!/usr/bin/env bash
# Create (or reuse) a virtualenv holding Ray 2.60, used only by benchmarks/compare.py to
# measure Ray next to miniray. Ray is never a dependency of miniray or of its tests.
#
# Usage: benchmarks/setup_ray_venv.sh            # idempotent; prints the venv's python path
# Env:   MINIRAY_BENCH_RAY_VENV   where to put the venv
#                                 (default: $HOME/.cache/miniray-bench/ray-2.60)
#        MINIRAY_BENCH_RAY_PYTHON the interpreter to build it with (default: python3.11)
set -euo pipefail

RAY_VERSION="2.60.0"
VENV="${MINIRAY_BENCH_RAY_VENV:-$HOME/.cache/miniray-bench/ray-2.60}"
BASE_PYTHON="${MINIRAY_BENCH_RAY_PYTHON:-python3.11}"
PY="$VENV/bin/python"

installed_version() {
    "$PY" -c 'import ray; print(ray.__version__)' 2>/dev/null || true
}

if [[ -x "$PY" && "$(installed_version)" == "$RAY_VERSION" ]] \
    && "$PY" -c 'import numpy' 2>/dev/null; then
    echo "ray $RAY_VERSION already installed in $VENV" >&2
    echo "$PY"
    exit 0
fi

if ! command -v "$BASE_PYTHON" >/dev/null 2>&1; then
    echo "error: $BASE_PYTHON not found; set MINIRAY_BENCH_RAY_PYTHON to a Python 3.11" >&2
    exit 1
fi

if [[ ! -x "$PY" ]]; then
    echo "creating $VENV with $("$BASE_PYTHON" --version 2>&1)" >&2
    mkdir -p "$(dirname "$VENV")"
    "$BASE_PYTHON" -m venv "$VENV"
fi

echo "installing ray==$RAY_VERSION and numpy into $VENV (a few minutes)" >&2
"$PY" -m pip install -q --upgrade pip >&2
"$PY" -m pip install -q "ray==$RAY_VERSION" numpy >&2

if [[ "$(installed_version)" != "$RAY_VERSION" ]]; then
    echo "error: ray $RAY_VERSION did not import from $PY" >&2
    exit 1
fi
echo "$PY"
