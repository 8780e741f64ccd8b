#!/usr/bin/env bash
# The project's test command (README, .ci/run). Two pytest processes:
#   1. everything on the host: CPU kernels, PTX compilation of every CUDA kernel, MPI tests via mpiexec,
#      real-GPU tests (they skip themselves without a GPU);
#   2. the CUDA kernels under Numba's CUDA simulator (NUMBA_ENABLE_CUDASIM=1), small sizes.
set -u
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
"$PY" -m pytest tests --ignore=tests/cudasim -q "$@"
host=$?
NUMBA_ENABLE_CUDASIM=1 "$PY" -m pytest tests/cudasim -q "$@"
sim=$?
echo "host tests exit $host, simulator tests exit $sim"
[ "$host" -eq 0 ] && [ "$sim" -eq 0 ]
