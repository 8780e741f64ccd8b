#!/bin/bash
# One call on a lent GPU machine: correctness first, then the figures. Everything lands in $OUT/all.tgz (log.txt,
# pytest.txt, device-mb*.json, ...); each step has its own timeout so the call ends inside ~7 min.
#   mkdir -p .device && cp -r ../shared/device/* .device/     # once: the shim (numba-cuda 0.30.4 imports under
#                                                              # NumPy 2.5 with it) and the hash-table bench
#   device run: bash bench/device_check.sh  (carry .device, timeout ~500 s)
# STEPS (default "tests bench big tenth", ~7 min on an H200 by 2026-11-28's step times, bench now running four jobs a
# round; also "graphs", "profile", "launch", "modes", "calls", "table", "equiv", "blocking", "scaling", "switch") picks
# steps; the GPU image has no mpiexec, zstandard or isal: "scaling" installs MPICH's and mpi4py's wheels from
# .device/wheels (pip download mpi4py mpich --only-binary=:all: --python-version 3.12 -d .device/wheels).
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/hps-device-out}; mkdir -p "$OUT"
[ -z "$(ls -A "$OUT")" ] && PACK=1 || PACK=  # an empty $OUT ends as one archive (below); never touch files of others
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/.device/shim:$PWD NUMBA_CACHE_DIR=/tmp/hps-numba-cache
STEPS=${STEPS:-"tests bench big tenth"}
step() { echo; echo "=== $(date +%T) $*"; }
save() { for f in bench/results/device-*.json; do [ -f "$f" ] && mv "$f" "$OUT/$1.json"; done; }
{
step env
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv
nproc
python3 -c "import numba, numpy, cupy, torch; from numba import cuda; print('numba', numba.__version__, 'numpy', numpy.__version__, 'cupy', cupy.__version__, 'torch', torch.__version__, 'gpu', cuda.get_current_device().name)"
for s in $STEPS; do case $s in
bench)
  step "bench_device: the issue's job (2 M rows, 26 fields, dim 32, mini-batch 4096) on cuda; with its products through cuBLAS, the dense step and the layers' bias, ReLU and mask in hps launches, all holding the GIL (held); with those and the pass as CUDA graphs (graphs); and the PyTorch peer, two rounds in turn"
  H=HPS_CUDA_GEMM=cublas-gil,HPS_DENSE_STEP=kernel,HPS_CUDA_LAYERS=kernel
  timeout 220 python3 -m bench.bench_device --no-cpu --repeat 2 --variant held:$H --variant graphs:$H,HPS_CUDA_GRAPHS=1 2>&1 \
    | grep -v -i "warn\|sparse_coo" | tail -20; save device-mb4096 ;;
tests)
  step "gpu-marked tests"
  timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider --durations=8 -W ignore::DeprecationWarning \
    tests/gpu tests/test_model_kernels.py tests/test_model_zoo.py tests/test_comm.py 2>&1 | tee "$OUT/pytest.txt" | tail -40 ;;
table)
  step "hash table (batches of 2^20 keys, 2^26 slots)"
  PYTHONWARNINGS=ignore timeout 90 python3 .device/table_bench.py "$OUT/table.json" 2>&1 | tail -8 ;;
switch)
  step "bench_device, hps alone, with --gil-switch-interval 0.005 (Python's) and 0.0002 (the cuda default 0.001 above)"
  for sw in 0.005 0.0002; do
    timeout 60 python3 -m bench.bench_device --no-cpu --no-peer --gil-switch-interval $sw 2>&1 | tail -3
    save device-mb4096-switch$sw
  done ;;
big)
  step "bench_device at mini-batch 16384, batch 262144, two rounds"
  timeout 120 python3 -m bench.bench_device --no-cpu --repeat 2 --minibatch-size 16384 --batch-size 262144 2>&1 \
    | grep -v -i "warn\|sparse_coo" | tail -10
  save device-mb16384 ;;
graphs)
  step "what a CUDA graph of the dense part would save: hps's eager pass against PyTorch eager and replayed, alone and beside a Python thread (bench.graph_probe)"
  for mb in 4096 16384; do
    timeout 90 python3 -m bench.graph_probe --minibatch $mb --out "$OUT/graph-probe-$mb.json" 2>&1 | tail -3
  done ;;
launch)
  step "the host's cost of one kernel launch in each launch mode, alone and beside a busy thread (bench.launch_cost)"
  timeout 120 python3 -m bench.launch_cost --launches 300 --out "$OUT/launch.json" 2>&1 | tail -6 ;;
modes)
  step "bench_device, hps alone, launching through Numba, through the driver releasing the GIL (the default, driver-gil, in 'bench'), and with each dense tensor stepped in one launch"
  for m in numba driver; do
    HPS_CUDA_LAUNCH=$m timeout 60 python3 -m bench.bench_device --no-cpu --no-peer 2>&1 | tail -3
    save device-mb4096-$m
  done
  HPS_DENSE_STEP=kernel timeout 60 python3 -m bench.bench_device --no-cpu --no-peer 2>&1 | tail -3
  save device-mb4096-dense-kernel ;;
calls)
  step "CUDA table: kernel against blocking call (bench.table_cuda_calls)"
  timeout 60 python3 -m bench.table_cuda_calls --out "$OUT/calls.json" 2>&1 | tail -4 ;;
tenth)
  step "bench_device with --hbm-budget a tenth of the table, beside the same job in HBM (batch 16384)"
  timeout 70 python3 -m bench.bench_device --no-cpu --no-peer --batch-size 16384 2>&1 | tail -4; save device-b16k
  for part in 10 5; do  # a fifth when a tenth cannot hold the batches in flight (the log says so)
    B=$(python3 -c "import json; from hps.train._hbm_budget import hbm_row_bytes; m = json.load(open('$OUT/device-b16k.json'))['cuda']; print(hbm_row_bytes(64, 4) * (m['table_rows'] // $part))")
    echo "1/$part of the table (dim 32 + Adagrad state): --hbm-budget $B"
    timeout 70 python3 -m bench.bench_device --no-cpu --no-peer --batch-size 16384 --hbm-budget "$B" 2>&1 | tail -4
    save device-b16k-1of$part; [ -f "$OUT/device-b16k-1of$part.json" ] && break
  done ;;
profile)
  step "where the prepare, place and train stages' time goes, the issue's job at mini-batch 4096 (bench.profile_stages, sampled)"
  timeout 90 python3 -m bench.profile_stages --stages place,train --top 45 --out "$OUT" -- --rows 1048576 \
    --fields 26 --vocab-per-field 1000000 --batch-size 65536 --minibatch-size 4096 --hidden 512,256 \
    --embedding-dim 32 --no-progress --device cuda --ssd-path /tmp/hps-prof-ssd 2>&1 | grep -v "^ " | tail -8 ;;
blocking)
  step "the same under CUDA_LAUNCH_BLOCKING=1: each launch then waits for its kernel, so its line holds the GPU time"
  mkdir -p "$OUT/blocking"
  CUDA_LAUNCH_BLOCKING=1 timeout 100 python3 -m bench.profile_stages --stages prepare,place,train --top 45 \
    --out "$OUT/blocking" -- --rows 1048576 --fields 26 --vocab-per-field 1000000 --batch-size 65536 \
    --minibatch-size 4096 --hidden 512,256 --embedding-dim 32 --no-progress --device cuda \
    --ssd-path /tmp/hps-prof-ssd2 2>&1 | grep -v "^ " | tail -8 ;;
scaling)
  step "#25: strong scaling, each rank pinned to 2 cores of its own, 1 BLAS thread (bench_train scaling)"
  [ -x /tmp/mv/bin/mpiexec ] || python3 -m pip install -q --no-index --no-deps --prefix /tmp/mv .device/wheels/*.whl
  PY=$(command -v python3)  # the image's (mpiexec's folder, first on PATH below, may hold another)
  MV="env PATH=/tmp/mv/bin:$PATH PYTHONPATH=$PYTHONPATH:$(echo /tmp/mv/lib/python3*/site-packages) LD_LIBRARY_PATH=/tmp/mv/lib"
  $MV $PY -c "from pathlib import Path; from bench.train_scaling import write_criteo; write_criteo(Path('/tmp/warm.txt'), 3000, 0)"
  OMP_NUM_THREADS=1 timeout 60 $MV mpiexec -n 2 $PY -m hps.train --format criteo --data /tmp/warm.txt \
    --eval-data /tmp/warm.txt --embedding-dim 16 --hidden 256,128 --no-progress 2>&1 | tail -2  # compiles the kernels
  timeout 300 $MV $PY -m bench.bench_train scaling --no-weak --rows 1000000 --epochs 2 --ranks 1,2,4,8 \
    --cores-per-rank 2 --hidden 256,128 2>&1 | tail -40
  cp bench/results/train-scaling.json "$OUT/scaling.json" ;;
equiv)
  step "cpu vs cuda equivalence (shared/device/equiv.py)"
  timeout 120 python3 .device/equiv.py /tmp/equiv 2>&1 | tail -8 ;;
esac; done
step done
} 2>&1 | tee "$OUT/log.txt"
# one archive: the device tool brings back at most eight files (2026-11-28's first call lost its log); only
# when $OUT was empty at the start, so everything in it is this script's
[ -n "$PACK" ] && (cd "$OUT" && tar czf all.tgz -- * && find . -mindepth 1 -maxdepth 1 ! -name all.tgz -exec rm -rf {} +)
