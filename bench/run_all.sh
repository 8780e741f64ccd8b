#!/usr/bin/env bash
# Runs every benchmark and writes its results under bench/results/ (the numbers of docs/benchmarks.md come from here).
# Usage: bash bench/run_all.sh   (CPU; on a GPU machine the cuda cases of the table run too)
set -eu
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
MPIEXEC=$(dirname "$(command -v "$PY")")/mpiexec
R=bench/results
mkdir -p "$R"
export OPENBLAS_NUM_THREADS=1   # the microbenchmarks and their peers run with one BLAS thread
"$PY" -m pytest bench/bench_get.py bench/bench_insert.py bench/bench_accumulate.py bench/bench_erase.py \
    --benchmark-only -q --benchmark-json "$R/table.json" | tee "$R/table.txt"
"$PY" -m pytest bench/bench_ssd.py --benchmark-only -q --benchmark-json "$R/ssd.json" | tee "$R/ssd.txt"
"$PY" -m pytest bench/bench_cache.py --benchmark-only -q --benchmark-json "$R/cache.json" | tee "$R/cache.txt"
"$PY" -m pytest bench/bench_readers.py --benchmark-only -q --benchmark-json "$R/readers.json" | tee "$R/readers.txt"
"$MPIEXEC" -n 4 "$PY" -m bench.bench_comm --ranks-per-node 2 --json "$R/comm-2x2.json" | tee "$R/comm-2x2.txt"
"$PY" -m bench.bench_train outofcore | tee "$R/train-outofcore.txt"
"$PY" -m bench.bench_train scaling | tee "$R/train-scaling.txt"
# peer_torch pins hps and its peers to the same --cores CPUs and sets every thread pool to that size
"$PY" -m bench.peer_torch --data synthetic --cores 2 --json "$R/peer-torch-synthetic.json" | tee "$R/peer-torch-synthetic.txt"
"$PY" -m bench.peer_torch --data frappe --epochs 3 --cores 2 --json "$R/peer-torch-frappe.json" | tee "$R/peer-torch-frappe.txt"
