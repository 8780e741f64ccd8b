#!/usr/bin/env bash
# The project's test command (README, .ci/run). Two pytest processes:
#   1. everything on the host: CPU kernels, PTX compilation of every CUDA kernel, MPI tests via mpiexec,
#      real-GPU tests (they skip themselves without a GPU);
#   2. the CUDA kernels under Numba's CUDA simulator (NUMBA_ENABLE_CUDASIM=1), small sizes.
# With 2 or more cores they run side by side (the simulator's process is one busy Python thread; on CI's
# 2 cores the two took 13.9 + 8.7 minutes one after the other), its output printed when the host's ends;
# HPS_TESTS_SERIAL=1 runs them one after the other. Each lists its 15 slowest tests (CI's whole run
# should stay under 20 minutes: trim what tops them).
set -u
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
if [ "$(nproc)" -ge 2 ] && [ -z "${HPS_TESTS_SERIAL:-}" ]; then
    SIMLOG=$(mktemp)
    trap 'rm -f "$SIMLOG"' EXIT
    NUMBA_ENABLE_CUDASIM=1 "$PY" -m pytest tests/cudasim -q --durations=15 "$@" > "$SIMLOG" 2>&1 &
    simpid=$!
    "$PY" -m pytest tests --ignore=tests/cudasim -q --durations=15 "$@"
    host=$?
    wait "$simpid"
    sim=$?
    echo "== the simulator tests (tests/cudasim, run beside the host tests):"
    cat "$SIMLOG"
else
    "$PY" -m pytest tests --ignore=tests/cudasim -q --durations=15 "$@"
    host=$?
    NUMBA_ENABLE_CUDASIM=1 "$PY" -m pytest tests/cudasim -q --durations=15 "$@"
    sim=$?
fi
echo "host tests exit $host, simulator tests exit $sim"
[ "$host" -eq 0 ] && [ "$sim" -eq 0 ]
