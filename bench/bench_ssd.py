"""SSD-PS ``dump``/``load`` beside the disk's own limit and beside RocksDB and LMDB, in the same run.

Run: ``pytest bench/bench_ssd.py --benchmark-only`` (``HPS_BENCH_SMALL=1``: 16 MiB tables, a check that
every case runs; ``HPS_BENCH_DIR``: where the stores go, default the temp directory). Figures in
``benchmark.extra_info`` and the closing summary:

- ``fill``     dump GB/s beside a plain write + fsync of the same bytes (target >= 0.7x).
- ``read``     for uniform and Zipf(1.0) key sets, rows of 128 B to 4 KiB, 1 % and 10 % of the keys:
               ``read_amp_vs_pages`` = bytes read / bytes of the distinct 4 KiB pages holding the
               asked rows (target <= 1.5), ``read_amp_vs_rows`` = bytes read / bytes of the distinct
               rows asked, and ``vs_disk`` = load rows/s / the rows/s of a pool of 32 threads doing
               O_DIRECT preads of those same pages (target >= 0.7x). Read amplification is a byte
               count: it does not depend on the machine's load.
- ``queue_depth`` a cold load of 1 % of the 512 B rows with 1, 8 and 32 reads in flight.
- ``busy_neighbour`` loads of 2,000 random 128 B rows alone and beside a thread running pure Python
               (the GIL: what the nogil read kernels of ``hps.ssd._native`` are for).
- ``page_cache`` a load of 10 % of the 128 B rows with ``page_cache`` = dontneed / direct / keep,
               the store's files out of the page cache (cold) or in it (warm): rows/s and the
               store's bytes in the page cache before and after.
- ``peers``    batch put and multi-get of the same rows through RocksDB (``rocksdict``: WriteBatch
               with one sync, bloom filters, multi-get of a key list) and LMDB (``lmdb``: putmulti in
               one synced transaction, getmulti), each ratio to SSDStore's dump / load (page_cache
               "direct", the default, and "dontneed", which finds the just-dumped rows cached).
               Needs ``pip install -e ".[bench]"``; skipped when absent. Caveat
               (``PEER_CAVEAT``, printed with the results): both peers are driven through Python with
               one object per key (rocksdict has no batched put, its multi-get returns one ``bytes``
               per key; lmdb's putmulti/getmulti take and return per-key tuples), so the ratios are
               against these engines through Python, not against the engines alone.
"""

import ctypes
import mmap
import os
import shutil
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from hps.ssd import SSDOptions, SSDStore
from hps.ssd._format import Layout

SMALL = bool(os.environ.get("HPS_BENCH_SMALL"))
TABLE_BYTES = (16 << 20) if SMALL else (1 << 30)   # bytes of rows per store
PAGE = 4096
QD = 32
ROW_BYTES = [128, 512, 4096]
FRACS = [0.01, 0.10]
DISTS = ["uniform", "zipf"]
RPF_BYTES = 64 << 20                                # rows per file: 64 MiB files
OPTS = SSDOptions(background=False)
PEER_CAVEAT = ("the RocksDB (rocksdict) and LMDB (lmdb) peers are driven through Python with one object "
               "per key (no batched put in rocksdict; per-key tuples in lmdb's putmulti/getmulti), so the "
               "ratios are against these engines through Python, not against the engines alone; the "
               "peers read through the page cache (just written, warm), as hps 'dontneed' does; hps 'direct' reads "
               "from the device")


def _dir():
    return tempfile.mkdtemp(prefix="hps-bench-ssd-", dir=os.environ.get("HPS_BENCH_DIR"))


def _data(n, dim, seed=0):
    rng = np.random.default_rng(seed)
    keys = rng.choice(2**40, size=n, replace=False).astype(np.uint64)
    return keys, rng.standard_normal((n, dim)).astype(np.float32)


def _ask(n, frac, dist, seed=1):
    """Positions of the asked rows: ``frac`` of the table, distinct."""
    rng = np.random.default_rng(seed)
    m = max(1, int(frac * n))
    if dist == "uniform":
        return rng.choice(n, m, replace=False)
    p = 1.0 / np.arange(1, n + 1)       # Zipf(1.0) over ranks, ranks scattered over the rows
    draws = rng.permutation(n)[rng.choice(n, 4 * m, p=p / p.sum())]
    return np.unique(draws)[:m]


def _pages(pos, rpf, n, row_bytes, bb=4096):
    """(file index, page offset) of the distinct 4 KiB pages holding rows ``pos`` of a store made by
    one dump of ``n`` rows, ``rpf`` rows per file (format-2 layout)."""
    f, slot = pos // rpf, pos % rpf
    sizes = np.minimum(rpf, n - np.arange(-(-n // rpf)) * rpf)
    roff = np.array([Layout(2, int(m), row_bytes, False, bb).rows_offset for m in sizes])
    start = roff[f] + slot * row_bytes
    first, last = start // PAGE, (start + row_bytes - 1) // PAGE
    span = (last - first + 1).astype(np.int64)
    fid = np.repeat(f, span)
    page = np.repeat(first, span) + np.arange(span.sum()) - np.repeat(np.cumsum(span) - span, span)
    u = np.unique(fid * (1 << 40) + page)
    return u >> 40, (u & ((1 << 40) - 1)) * PAGE


def _disk_limit(paths, fid, offs) -> float:
    """Seconds for a pool of QD threads to read the pages (fid, offs) with O_DIRECT preads."""
    fds = [os.open(p, os.O_RDONLY | getattr(os, "O_DIRECT", 0)) for p in paths]
    raw = np.empty(QD * PAGE + PAGE, np.uint8)
    base = (-raw.ctypes.data) % PAGE
    jobs = list(zip(fid.tolist(), offs.tolist()))

    def work(t):
        mv = memoryview(raw[base + t * PAGE:base + (t + 1) * PAGE])
        for fi, off in jobs[t::QD]:
            os.preadv(fds[fi], [mv], off)

    t0 = time.perf_counter()
    with ThreadPoolExecutor(QD) as ex:
        list(ex.map(work, range(QD)))
    dt = time.perf_counter() - t0
    for fd in fds:
        os.close(fd)
    return dt


def _drop_cache(path):
    for name in os.listdir(path):
        fd = os.open(os.path.join(path, name), os.O_RDONLY)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)


def _resident_bytes(path) -> int:
    """Bytes of the store's files in the page cache (mincore)."""
    libc = ctypes.CDLL(None, use_errno=True)
    total = 0
    for name in os.listdir(path):
        p = os.path.join(path, name)
        size = os.path.getsize(p)
        if size == 0:
            continue
        with open(p, "rb") as fh:
            mm = mmap.mmap(fh.fileno(), size, access=mmap.ACCESS_COPY)
            n = -(-size // mmap.PAGESIZE)
            vec = (ctypes.c_ubyte * n)()
            addr = ctypes.addressof(ctypes.c_char.from_buffer(mm))
            libc.mincore(ctypes.c_void_p(addr), ctypes.c_size_t(size), vec)
            total += sum(v & 1 for v in vec) * mmap.PAGESIZE
            del addr
            mm.close()
    return total


_STORES = {}


def _store(row_bytes):
    """A store of TABLE_BYTES of rows of ``row_bytes`` (made once per row size in the session)."""
    if row_bytes not in _STORES:
        d = _dir()
        dim = row_bytes // 4
        n = TABLE_BYTES // row_bytes
        keys, rows = _data(n, dim)
        rpf = max(1, RPF_BYTES // row_bytes)
        with SSDStore(os.path.join(d, "s"), dim, rows_per_file=rpf, options=OPTS) as s:
            s.dump(keys, rows)
        _STORES[row_bytes] = (d, keys, rows, rpf)
    return _STORES[row_bytes]


@pytest.fixture(scope="module", autouse=True)
def _cleanup():
    yield
    for d, *_ in _STORES.values():
        shutil.rmtree(d, ignore_errors=True)
    _STORES.clear()


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


@pytest.mark.parametrize("row_bytes", [128])
def test_fill(benchmark, record, row_bytes):
    d = _dir()
    n = min(TABLE_BYTES, 256 << 20) // row_bytes
    keys, rows = _data(n, row_bytes // 4)
    stores, plains = [], []

    def setup():      # untimed: the plain write+fsync of this round, then a fresh, empty store
        plains.append(_plain_write_fsync(os.path.join(d, "plain"), [keys, rows]))
        stores.append(SSDStore(os.path.join(d, f"s{len(stores)}"), row_bytes // 4,
                               rows_per_file=RPF_BYTES // row_bytes, options=OPTS))
        return (stores[-1],), {}

    def fill(s):
        s.dump(keys, rows)
        fill.written = s.stats()["bytes_written"]

    benchmark.pedantic(fill, setup=setup, rounds=3 if SMALL else 7, iterations=1)
    for s in stores:
        s.close()
    shutil.rmtree(d, ignore_errors=True)
    t = benchmark.stats.stats.min
    gbs, plain_gbs = fill.written / t / 1e9, (keys.nbytes + rows.nbytes) / min(plains) / 1e9
    record(op="dump", row_bytes=row_bytes, dump_GBps=gbs, plain_write_fsync_GBps=plain_gbs,
           ratio_vs_plain=gbs / plain_gbs, rows_per_s=n / t)


@pytest.mark.parametrize("frac", FRACS)
@pytest.mark.parametrize("dist", DISTS)
@pytest.mark.parametrize("row_bytes", ROW_BYTES)
def test_read(benchmark, record, row_bytes, dist, frac):
    d, keys, rows, rpf = _store(row_bytes)
    n = keys.shape[0]
    pos = _ask(n, frac, dist)
    q = keys[pos]
    path = os.path.join(d, "s")
    with SSDStore(path, row_bytes // 4, rows_per_file=rpf, options=OPTS) as s:
        b0 = s.stats()["bytes_read"]
        got, found = s.load(q)
        assert found.all()
        np.testing.assert_array_equal(got, rows[pos])
        per_call = s.stats()["bytes_read"] - b0

        def cold():      # like the disk-limit reads below: nothing of the store in the page cache
            _drop_cache(path)
            return (q,), {}
        benchmark.pedantic(s.load, setup=cold, rounds=3, iterations=1)
    t = benchmark.stats.stats.min
    fid, offs = _pages(pos, rpf, n, row_bytes)
    names = sorted(x for x in os.listdir(path) if x.endswith(".param"))
    t_disk = min(_disk_limit([os.path.join(path, x) for x in names], fid, offs) for _ in range(3))
    floor = fid.shape[0] * PAGE
    amp = per_call / floor
    record(op="load", row_bytes=row_bytes, dist=dist, frac=frac, rows=int(q.shape[0]),
           read_amp_vs_pages=amp, read_amp_vs_rows=per_call / (q.shape[0] * row_bytes),
           rows_per_s=q.shape[0] / t, disk_limit_rows_per_s=q.shape[0] / t_disk, vs_disk=t_disk / t)
    assert amp <= 1.5


def _warm(path):
    for name in os.listdir(path):
        with open(os.path.join(path, name), "rb") as fh:
            while fh.read(1 << 24):
                pass


@pytest.mark.parametrize("state", ["cold", "warm"])
@pytest.mark.parametrize("mode", ["dontneed", "direct", "keep"])
def test_page_cache(benchmark, record, mode, state):
    """A load of 10 % of the 128 B rows (uniform) with the store's files out of the page cache
    (cold: every read goes to the device) or in it (warm: as rows a dump just wrote, which
    "dontneed" leaves cached); the store's bytes in the page cache before and after."""
    d, keys, rows, rpf = _store(128)
    pos = _ask(keys.shape[0], 0.10, "uniform")
    path = os.path.join(d, "s")
    before = []
    with SSDStore(path, 32, rows_per_file=rpf, options=SSDOptions(background=False, page_cache=mode)) as s:
        def setup():
            _drop_cache(path)
            if state == "warm":
                _warm(path)
            before.append(_resident_bytes(path))
            return (), {}
        benchmark.pedantic(lambda: s.load(keys[pos]), setup=setup, rounds=3, iterations=1)
        after = _resident_bytes(path)
    t = benchmark.stats.stats.min
    record(op="page_cache", mode=mode, state=state, rows_per_s=pos.shape[0] / t,
           cached_before_MiB=before[-1] / 2**20, cached_after_MiB=after / 2**20, table_MiB=TABLE_BYTES / 2**20)


@pytest.mark.parametrize("threads", [1, 8, 32])
def test_queue_depth(benchmark, record, threads):
    """The same cold load (1 % of the 512 B rows, uniform: one read per row) with 1, 8 and 32 preadv
    calls in flight (``io_threads``)."""
    d, keys, rows, rpf = _store(512)
    pos = _ask(keys.shape[0], 0.01, "uniform")
    opts = SSDOptions(background=False, io_threads=threads)
    with SSDStore(os.path.join(d, "s"), 128, rows_per_file=rpf, options=opts) as s:
        benchmark.pedantic(lambda: s.load(keys[pos]), rounds=3, iterations=1)
    record(op="queue_depth", io_threads=threads, rows_per_s=pos.shape[0] / benchmark.stats.stats.min)


@pytest.mark.parametrize("neighbour", ["alone", "busy"])
def test_busy_neighbour(benchmark, record, neighbour):
    """Loads of 2,000 uniform random 128 B rows (one 4 KiB read each, 32 in flight), alone or beside
    one thread running pure Python, as the trainer's stages do. A reader that takes the GIL back
    after every read waits for that thread at each one (measured before the nogil read kernels:
    69,869 reads/s alone, 3,837 busy); the kernels take it back once per thread per round."""
    import threading

    d, keys, rows, rpf = _store(128)
    rng = np.random.default_rng(3)
    stop = threading.Event()

    def spin():
        x = 0
        while not stop.is_set():
            for i in range(1000):
                x += i

    th = threading.Thread(target=spin, daemon=True) if neighbour == "busy" else None
    with SSDStore(os.path.join(d, "s"), 32, rows_per_file=rpf, options=OPTS) as s:
        if th is not None:
            th.start()
        try:
            benchmark.pedantic(lambda: s.load(keys[rng.choice(keys.shape[0], 2000, replace=False)]),
                               rounds=10, iterations=1)
        finally:
            stop.set()
    record(op="busy_neighbour", neighbour=neighbour, rows_per_s=2000 / benchmark.stats.stats.median)


def _peer_data():
    n = min(TABLE_BYTES, 32 << 20) // 128
    keys, rows = _data(n, 32)
    pos = _ask(n, 0.25, "uniform")
    return keys, rows, keys[pos], pos


def _hps_times(d, keys, rows, q, mode, benchmark=None):
    """(dump seconds, best load seconds of 3) of SSDStore with ``page_cache=mode``; the load is
    pytest-benchmark's timed function when ``benchmark`` is given."""
    with SSDStore(os.path.join(d, f"hps-{mode}"), 32, rows_per_file=RPF_BYTES // 128,
                  options=SSDOptions(background=False, page_cache=mode)) as s:
        t0 = time.perf_counter()
        s.dump(keys, rows)
        t_put = time.perf_counter() - t0
        if benchmark is None:
            return t_put, min(_timed(s.load, q) for _ in range(3))
        benchmark.pedantic(s.load, args=(q,), rounds=3, iterations=1)
        return t_put, benchmark.stats.stats.min


def test_peers(benchmark, record):
    rocksdict = pytest.importorskip("rocksdict")
    lmdb = pytest.importorskip("lmdb")
    d = _dir()
    keys, rows, q, pos = _peer_data()
    kl = [k.tobytes() for k in keys.astype(">u8")]
    vl = [r.tobytes() for r in rows]
    ql = [k.tobytes() for k in q.astype(">u8")]
    # RocksDB: bloom filters, one synced WriteBatch, multi-get of the key list
    opt = rocksdict.Options(raw_mode=True)
    tbo = rocksdict.BlockBasedOptions()
    tbo.set_bloom_filter(10, False)
    opt.set_block_based_table_factory(tbo)
    db = rocksdict.Rdict(os.path.join(d, "rocks"), options=opt)
    wo = rocksdict.WriteOptions()
    wo.sync = True
    t0 = time.perf_counter()
    wb = rocksdict.WriteBatch(raw_mode=True)
    for k, v in zip(kl, vl):
        wb.put(k, v)
    db.write(wb, wo)
    t_rput = time.perf_counter() - t0
    t_rget = min(_timed(db.get, ql) for _ in range(3))
    assert db.get(ql[:10]) == [vl[p] for p in pos[:10]]
    db.close()
    # LMDB: putmulti in one synced transaction, getmulti
    env = lmdb.open(os.path.join(d, "lmdb"), map_size=4 * (len(kl) * 200 + (64 << 20)), sync=True)
    t0 = time.perf_counter()
    with env.begin(write=True) as txn:
        txn.cursor().putmulti(list(zip(kl, vl)))
    t_lput = time.perf_counter() - t0

    def lget():
        with env.begin() as txn:
            return txn.cursor().getmulti(ql)
    t_lget = min(_timed(lget) for _ in range(3))
    assert [v for _, v in lget()[:10]] == [vl[p] for p in pos[:10]]
    env.close()
    direct = _hps_times(d, keys, rows, q, "direct", benchmark)
    dontneed = _hps_times(d, keys, rows, q, "dontneed")
    shutil.rmtree(d, ignore_errors=True)
    n, m = keys.shape[0], q.shape[0]
    record(op="peers", rows=n, asked=m, hps_dump_rows_per_s=n / direct[0],
           hps_load_direct_rows_per_s=m / direct[1], hps_load_dontneed_rows_per_s=m / dontneed[1],
           rocks_put_rows_per_s=n / t_rput, rocks_get_rows_per_s=m / t_rget,
           lmdb_put_rows_per_s=n / t_lput, lmdb_get_rows_per_s=m / t_lget,
           dump_vs_rocks=t_rput / direct[0], load_direct_vs_rocks=t_rget / direct[1],
           load_dontneed_vs_rocks=t_rget / dontneed[1], dump_vs_lmdb=t_lput / direct[0],
           load_direct_vs_lmdb=t_lget / direct[1], load_dontneed_vs_lmdb=t_lget / dontneed[1])


def summary_lines(figures: list) -> list:
    """Printed by bench/conftest.py after the run: the peers' caveat, when they ran."""
    return [f"SSD-PS vs peers: {PEER_CAVEAT}."] if any(f.get("op") == "peers" for f in figures) else []


def _timed(fn, *args):
    t0 = time.perf_counter()
    fn(*args)
    return time.perf_counter() - t0
