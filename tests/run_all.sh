#!/usr/bin/env bash
# The project's test command (README, .ci/run). Two kinds of pytest process:
#   1. the host's: CPU kernels, PTX compilation of every CUDA kernel, MPI tests via mpiexec, real-GPU tests
#      (they skip themselves without a GPU);
#   2. the simulator's: the CUDA kernels under Numba's CUDA simulator (NUMBA_ENABLE_CUDASIM=1), small sizes.
# With 2 or more cores two chains run side by side, their work balanced by the last measured durations
# (this 2-core VM, 2026-11-28 18:00: host 993 s, beside it the simulator 668 s then the MPI files 289 s;
# since, ~30 s of MPI files moved across and ~40 s of simulator cases went): the host's tests but the
# slowest MPI files, and the simulator's tests followed by those MPI files (BESIDE). The second chain's output is
# printed when the first ends. HPS_TESTS_SERIAL=1 runs the host's, then the simulator's, as one
# machine with one core would. Each process lists its 15 slowest tests (CI's whole run should stay under
# 20 minutes: trim what tops them, or move a file between the chains).
set -u
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
BESIDE=(tests/test_train_mpi.py tests/test_train_fae_mpi.py tests/test_train_het_mpi.py tests/test_train_mpi_order.py
        tests/test_train_fused_mpi.py tests/test_checkpoint_mpi.py)

sim_tests() { NUMBA_ENABLE_CUDASIM=1 "$PY" -m pytest tests/cudasim -q --durations=15 "$@"; }

if [ "$(nproc)" -ge 2 ] && [ -z "${HPS_TESTS_SERIAL:-}" ]; then
    LOG=$(mktemp)
    trap 'rm -f "$LOG"' EXIT
    (
        sim_tests "$@"; sim=$?
        echo "== the host's slowest MPI files, after the simulator's tests:"
        "$PY" -m pytest "${BESIDE[@]}" -q --durations=15 "$@"; beside=$?
        exit $(( (sim != 0) * 10 + (beside != 0) ))
    ) > "$LOG" 2>&1 &
    chain=$!
    "$PY" -m pytest tests --ignore=tests/cudasim "${BESIDE[@]/#/--ignore=}" -q --durations=15 "$@"
    host=$?
    wait "$chain"
    code=$?
    echo "== the second chain (the simulator's tests, then ${BESIDE[*]}), run beside:"
    cat "$LOG"
    sim=$(( code / 10 ))
    [ $(( code % 10 )) -ne 0 ] && host=1
else
    "$PY" -m pytest tests --ignore=tests/cudasim -q --durations=15 "$@"
    host=$?
    sim_tests "$@"
    sim=$?
fi
echo "host tests exit $host, simulator tests exit $sim"
[ "$host" -eq 0 ] && [ "$sim" -eq 0 ]
