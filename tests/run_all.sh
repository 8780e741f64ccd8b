#!/usr/bin/env bash
# The project's test command (README, .ci/run). Two pytest processes:
#   1. everything on the host: CPU kernels, PTX compilation of every CUDA kernel, MPI tests via mpiexec,
#      real-GPU tests (they skip themselves without a GPU);
#   2. the CUDA kernels under Numba's CUDA simulator (NUMBA_ENABLE_CUDASIM=1), small sizes.
# Each lists its 15 slowest tests (CI's whole run should stay under 20 minutes: trim what tops them).
set -u
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
"$PY" -m pytest tests --ignore=tests/cudasim -q --durations=15 "$@"
host=$?
NUMBA_ENABLE_CUDASIM=1 "$PY" -m pytest tests/cudasim -q --durations=15 "$@"
sim=$?
echo "host tests exit $host, simulator tests exit $sim"
[ "$host" -eq 0 ] && [ "$sim" -eq 0 ]
