"""SSD-PS ``dump``/``load`` throughput (dim 32 float32, 262,144 rows = 32 MiB of rows per case).

Run: ``pytest bench/bench_ssd.py --benchmark-only``. Figures in ``benchmark.extra_info``:
- ``fill``   dump GB/s beside a plain sequential write + fsync of the same bytes (target >= 0.7x).
- ``read``   load rows/s and read amplification (bytes read / bytes of the rows asked for) for
             uniform and Zipf(1.0) batches of 65,536 keys across rows_per_file.
- ``rocksdb`` the same batch put (WriteBatch, sync) and multi-get through ``rocksdict`` (skipped when
             absent); targets: dump >= 3x, load >= 1x its throughput. Caveat (``ROCKSDICT_CAVEAT``,
             printed with the results): this peer is dominated by per-key Python calls, not by
             RocksDB. It already uses rocksdict's batch calls (``Rdict.write`` of a ``WriteBatch``,
             multi-get ``Rdict.get(list)``), but rocksdict has no batched put: filling the
             WriteBatch is one Python ``put`` per key, and the multi-get returns one Python
             ``bytes`` per key.
"""

import os
import shutil
import tempfile
import time

import numpy as np
import pytest

from hps.ssd import SSDOptions, SSDStore

DIM = 32
N_ROWS = 262_144
BATCH = 65_536
RPFS = [4096, 16384, 65536]
DISTS = ["uniform", "zipf"]
OPTS = SSDOptions(background=False)
ROW_BYTES = DIM * 4
ROCKSDICT_CAVEAT = ("the rocksdict peer is dominated by per-key Python calls (rocksdict has no batched put: "
                    "one WriteBatch.put per key; its multi-get returns one bytes object per key), so these "
                    "ratios are against RocksDB through Python, not against RocksDB itself")


def _data(seed=0):
    rng = np.random.default_rng(seed)
    keys = rng.choice(2**40, size=N_ROWS, replace=False).astype(np.uint64)
    rows = rng.standard_normal((N_ROWS, DIM)).astype(np.float32)
    return keys, rows


def _batch(keys, dist, seed=1):
    rng = np.random.default_rng(seed)
    if dist == "uniform":
        idx = rng.integers(0, keys.shape[0], BATCH)
    else:   # Zipf(1.0) over ranks, ranks scattered over the keys (hot keys live in many files)
        p = 1.0 / np.arange(1, keys.shape[0] + 1)
        idx = rng.permutation(keys.shape[0])[rng.choice(keys.shape[0], BATCH, p=p / p.sum())]
    return keys[idx]


@pytest.fixture
def tmpdir_fast():
    d = tempfile.mkdtemp(prefix="hps-bench-ssd-", dir=os.environ.get("HPS_BENCH_DIR"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _plain_write_fsync(path, bufs) -> float:
    t0 = time.perf_counter()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    for b in bufs:
        os.write(fd, b)
    os.fsync(fd)
    os.close(fd)
    dt = time.perf_counter() - t0
    os.remove(path)
    return dt


RPF_IDS = dict(ids=lambda v: f"rows_per_file={v}")


@pytest.mark.parametrize("rpf", RPFS, **RPF_IDS)
def test_fill(benchmark, record, tmpdir_fast, rpf):
    keys, rows = _data()
    stores, plains = [], []

    def setup():      # untimed: the plain write+fsync of this round (so both see the same machine
        # state; this VM's speed drifts), then a fresh, empty store
        plains.append(_plain_write_fsync(os.path.join(tmpdir_fast, "plain"), [keys, rows]))
        stores.append(SSDStore(os.path.join(tmpdir_fast, f"s{len(stores)}"), DIM, rows_per_file=rpf,
                               options=OPTS))
        return (stores[-1],), {}

    def fill(s):
        s.dump(keys, rows)
        fill.written = s.stats()["bytes_written"]

    benchmark.pedantic(fill, setup=setup, rounds=7, iterations=1)
    for s in stores:
        s.close()
    t = benchmark.stats.stats.min
    plain = min(plains)
    gbs = fill.written / t / 1e9
    plain_gbs = (keys.nbytes + rows.nbytes) / plain / 1e9
    record(op="dump", rows_per_file=rpf, dump_GBps=gbs, plain_write_fsync_GBps=plain_gbs,
           ratio_vs_plain=gbs / plain_gbs, rows_per_s=N_ROWS / t)


@pytest.mark.parametrize("dist", DISTS)
@pytest.mark.parametrize("rpf", RPFS, **RPF_IDS)
def test_read(benchmark, record, tmpdir_fast, rpf, dist):
    keys, rows = _data()
    q = _batch(keys, dist)
    with SSDStore(os.path.join(tmpdir_fast, "s"), DIM, rows_per_file=rpf, options=OPTS) as s:
        s.dump(keys, rows)
        b0 = s.stats()["bytes_read"]
        got, found = s.load(q)
        assert found.all()
        per_call = s.stats()["bytes_read"] - b0
        benchmark.pedantic(s.load, args=(q,), rounds=5, iterations=1, warmup_rounds=1)
    t = benchmark.stats.stats.min
    needed = np.unique(q).shape[0] * ROW_BYTES
    record(op="load", dist=dist, rows_per_file=rpf, rows_per_s=BATCH / t,
           read_amplification=per_call / needed, read_GBps=per_call / t / 1e9)


def _rocks(path):
    rocksdict = pytest.importorskip("rocksdict")
    opt = rocksdict.Options(raw_mode=True)
    return rocksdict, rocksdict.Rdict(path, options=opt)


def test_rocksdb_peer(benchmark, record, tmpdir_fast):
    """The same batch put (WriteBatch + sync) and multi-get, through rocksdict, beside SSDStore."""
    keys, rows = _data()
    q = _batch(keys, "uniform")
    rocksdict, db = _rocks(os.path.join(tmpdir_fast, "rocks"))
    kb = keys.astype(">u8").tobytes()
    rb = rows.tobytes()
    kl = [kb[i * 8:(i + 1) * 8] for i in range(N_ROWS)]
    vl = [rb[i * ROW_BYTES:(i + 1) * ROW_BYTES] for i in range(N_ROWS)]
    wo = rocksdict.WriteOptions()
    wo.sync = True

    def put():
        wb = rocksdict.WriteBatch(raw_mode=True)
        for k, v in zip(kl, vl):
            wb.put(k, v)
        db.write(wb, wo)

    t0 = time.perf_counter()
    put()
    t_put = time.perf_counter() - t0
    qb = q.astype(">u8").tobytes()
    ql = [qb[i * 8:(i + 1) * 8] for i in range(BATCH)]

    def get():
        vals = db.get(ql)
        return np.frombuffer(b"".join(vals), dtype=np.float32).reshape(-1, DIM)

    benchmark.pedantic(get, rounds=5, iterations=1, warmup_rounds=1)
    t_get = benchmark.stats.stats.min
    got = get()
    idx = np.searchsorted(np.sort(keys), q)
    np.testing.assert_array_equal(got, rows[np.argsort(keys)][idx])
    db.close()
    # SSDStore on the same data, same run (rows_per_file 16384)
    with SSDStore(os.path.join(tmpdir_fast, "ssd"), DIM, rows_per_file=16384, options=OPTS) as s:
        t0 = time.perf_counter()
        s.dump(keys, rows)
        t_dump = time.perf_counter() - t0
        s.load(q)
        t_load = min(_timed(s.load, q) for _ in range(5))
    record(op="rocksdb", rocks_put_rows_per_s=N_ROWS / t_put, rocks_get_rows_per_s=BATCH / t_get,
           ssd_dump_rows_per_s=N_ROWS / t_dump, ssd_load_rows_per_s=BATCH / t_load,
           dump_vs_rocks=t_put / t_dump, load_vs_rocks=t_get / t_load)


def summary_lines(figures: list) -> list:
    """Printed by bench/conftest.py after the run: the caveat of the RocksDB peer, when it ran."""
    return [f"SSD-PS vs RocksDB: {ROCKSDICT_CAVEAT}."] if any(f.get("op") == "rocksdb" for f in figures) else []


def _timed(fn, *args):
    t0 = time.perf_counter()
    fn(*args)
    return time.perf_counter() - t0
