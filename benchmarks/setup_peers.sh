#!/usr/bin/env bash
# Install the peers that benchmarks/bench_peers.py compares miniray with (loky; the standard
# library brings multiprocessing and concurrent.futures) into the interpreter that runs the
# benchmark. Never a dependency of miniray or of its tests.
#
# Usage: benchmarks/setup_peers.sh [PYTHON]     # default: python3; idempotent
set -euo pipefail

LOKY_VERSION="3.7.0"
PY="${1:-python3}"

if "$PY" -c "import loky, sys; sys.exit(loky.__version__ != '$LOKY_VERSION')" 2>/dev/null; then
    echo "loky $LOKY_VERSION already installed for $PY" >&2
    exit 0
fi
"$PY" -m pip install -q "loky==$LOKY_VERSION" numpy >&2
"$PY" -c "import loky; print('loky', loky.__version__)" >&2
