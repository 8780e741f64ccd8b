"""Where chosen pipeline stages of one training job spend their time, by function (by default the wall clock, so a
stage waiting on the GPU, a lock or the GIL shows it where it waits).

    python -m bench.profile_stages [--stages place,train] [--mode sample|cprofile] [--top 30] [--out DIR] \\
        -- <python -m hps.train arguments>

Only the timed job's stages are measured: the warm-up's scratch job (``hps.train._warmup``), which
compiles the kernels, is not (a 2026-11-27 H200 run without this filter charged the train stage with
~4 s of kernel compiles that belong to the warm-up). The stages: ``read`` (the source: each step of the batch
iterator, in the read thread; with ``--readers`` above 1 the parsing runs in the reader pool's threads, which
are not measured), ``prepare``, ``place``, ``train``. Two modes:

- ``sample`` (default): a sampler thread reads the named stages' threads' Python stacks
  (``sys._current_frames``) every ``--interval`` seconds while they work, each sample weighted by the time
  since the previous one, and reports per stage the seconds spent in each function, inclusive (anywhere
  on the stack) and self (on top). Per thread, on every Python version; the GIL switch interval is set to
  the sampling interval for the run so a stage busy in Python is sampled that often.
- ``cprofile``: each named stage's work runs under a ``cProfile.Profile`` of its own, timed by the wall
  clock or (``--clock thread``) by the thread's CPU clock, which leaves out the time a thread waits for
  a core: what to read where ranks outnumber the cores. Up to Python
  3.11 a profiler sees its own thread only. From 3.12 cProfile is one ``sys.monitoring`` tool per process:
  one stage a run, and its report also counts what the other threads called while that stage worked.

Each report is printed after the job (and written to ``DIR/profile-<stage>.txt`` with ``--out``). A
development tool: its figures are for finding costs, not for reporting speed.
"""

from __future__ import annotations

import collections
import cProfile
import io
import os
import pstats
import sys
import threading
import time

from hps._argparse import ArgumentParser

#: The stages of a training job's pipeline (``hps.train._trainer``): the source, then the three stages.
STAGES = ("read", "prepare", "place", "train")


class Sampler:
    """Samples the stacks of the threads in ``active`` (thread id -> stage name) every ``interval`` s."""

    def __init__(self, interval: float):
        self.interval, self.active, self.stop = interval, {}, threading.Event()
        self.roots = set()  # the codes of the wrappers around the stages' work: stacks are walked up to one
        self.incl = collections.defaultdict(collections.Counter)   # stage -> function -> seconds
        self.self_ = collections.defaultdict(collections.Counter)
        self.total = collections.Counter()                         # stage -> seconds sampled
        self.thread = threading.Thread(target=self._run, name="profile-sampler", daemon=True)

    def _run(self) -> None:
        last = time.perf_counter()
        while not self.stop.wait(self.interval):
            now = time.perf_counter()
            weight, last = now - last, now
            frames = sys._current_frames()
            for tid, stage in list(self.active.items()):
                f = frames.get(tid)
                if f is None:
                    continue
                self.total[stage] += weight
                self.self_[stage][_where(f)] += weight
                seen = set()
                while f is not None and f.f_code not in self.roots:
                    w = _where(f)
                    if w not in seen:
                        seen.add(w)
                        self.incl[stage][w] += weight
                    f = f.f_back

    def report(self, stage: str, top: int) -> str:
        total = self.total[stage] or 1e-12
        lines = [f"=== stage {stage}: {self.total[stage]:.3f} s sampled while it worked (timed job only)"]
        for title, table in (("inclusive", self.incl[stage]), ("self", self.self_[stage])):
            lines.append(f"--- {title} seconds")
            lines += [f"{s:9.3f} {100 * s / total:6.1f}%  {w}" for w, s in table.most_common(top)]
        return "\n".join(lines) + "\n"


class _Measured:
    """An iterator over ``source`` whose every step is ``step(it)`` (the read stage's ``next``, measured);
    ``close`` reaches the source's iterator, as the pipeline's would."""

    def __init__(self, source, step):
        self._it, self._step = iter(source), step

    def __iter__(self):
        return self

    def __next__(self):
        return self._step(self._it)

    def close(self) -> None:
        close = getattr(self._it, "close", None)
        if close is not None:
            close()


def _where(f) -> str:
    c = f.f_code
    path = c.co_filename
    for marker in ("/site-packages/", "/hps/", "/bench/"):
        if marker in path:
            path = path[path.index(marker) + (len("/site-packages/") if marker == "/site-packages/" else 1):]
            break
    return f"{path}:{c.co_firstlineno}({c.co_name})"


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    cut = argv.index("--") if "--" in argv else len(argv)
    p = ArgumentParser(prog="python -m bench.profile_stages", description=__doc__.split("\n\n")[0])
    p.add_argument("--stages", default="place,train",
                   help=f"comma-separated, among {','.join(STAGES)} (place,train)")
    p.add_argument("--mode", default="sample", choices=["sample", "cprofile"], help="(sample)")
    p.add_argument("--interval", type=float, default=0.0005, help="sample: seconds between samples (0.0005)")
    p.add_argument("--top", type=int, default=30, help="functions listed per stage (30)")
    p.add_argument("--sort", default="tottime", help="cprofile: pstats sort key (tottime; cumtime)")
    p.add_argument("--clock", default="wall", choices=["wall", "thread"],
                   help="cprofile: time functions by the wall clock or by the thread's CPU clock (wall)")
    p.add_argument("--out", default=None, help="also write profile-<stage>.txt into this folder")
    a = p.parse_args(argv[:cut])
    job = argv[cut + 1:]
    names = [n for n in a.stages.split(",") if n]
    unknown = sorted(set(names) - set(STAGES))
    if unknown or not names:
        p.error(f"--stages takes names among {','.join(STAGES)}, got {a.stages!r}")
    if a.clock == "thread" and a.mode != "cprofile":
        p.error("--clock thread times cProfile's calls: use it with --mode cprofile")
    if a.mode == "cprofile" and sys.version_info >= (3, 12) and len(names) > 1:
        p.error(f"Python {sys.version_info.major}.{sys.version_info.minor} runs one profiler per process: "
                f"name one stage a run (--stages {names[0]}), or use --mode sample")

    import hps.pipeline as pipeline
    import hps.train._warmup as warmup
    from hps.train._main import main as train

    warming = threading.Event()
    sampler = Sampler(a.interval) if a.mode == "sample" else None
    timer = time.thread_time if a.clock == "thread" else time.perf_counter
    profiles = {name: cProfile.Profile(timer) for name in names} if sampler is None else {}
    init, warm_up, pipeline_init = pipeline.Stage.__init__, warmup.warm_up, pipeline.Pipeline.__init__

    def quiet_warm_up(*args, **kw):  # the scratch job's stages are not measured
        warming.set()
        try:
            return warm_up(*args, **kw)
        finally:
            warming.clear()

    def measured(name, work):
        """``work`` measured as stage ``name``'s work, in the thread that calls it."""
        def fn(*args):
            if sampler is not None:
                sampler.active[threading.get_ident()] = name
            else:
                profiles[name].enable()
            try:
                return work(*args)
            finally:
                if sampler is not None:
                    sampler.active.pop(threading.get_ident(), None)
                else:
                    profiles[name].disable()
        if sampler is not None:
            sampler.roots.add(fn.__code__)
        return fn

    def profiled_init(self, name, fn, *args, **kw):
        if name in names and not warming.is_set():
            fn = measured(name, fn)
        init(self, name, fn, *args, **kw)

    def profiled_pipeline(self, source_name, source, *args, **kw):
        if source_name in names and not warming.is_set():  # the read stage's work: the source's next()
            source = _Measured(source, measured(source_name, next))
        pipeline_init(self, source_name, source, *args, **kw)

    pipeline.Stage.__init__, pipeline.Pipeline.__init__ = profiled_init, profiled_pipeline
    warmup.warm_up = quiet_warm_up
    switch = sys.getswitchinterval()
    if sampler is not None:
        sys.setswitchinterval(a.interval)
        sampler.thread.start()
    try:
        rc = train(job)
    finally:
        pipeline.Stage.__init__, pipeline.Pipeline.__init__, warmup.warm_up = init, pipeline_init, warm_up
        if sampler is not None:
            sampler.stop.set()
            sampler.thread.join()
            sys.setswitchinterval(switch)
    for name in names:
        if sampler is not None:
            text = sampler.report(name, a.top)
        elif not profiles[name].getstats():  # pstats refuses an empty profile
            text = f"=== stage {name}: no work measured (the job did not reach it)\n"
        else:
            buf = io.StringIO()
            pstats.Stats(profiles[name], stream=buf).sort_stats(a.sort).print_stats(a.top)
            text = f"=== stage {name} (sorted by {a.sort})\n{buf.getvalue()}"
        print(text)
        if a.out:
            os.makedirs(a.out, exist_ok=True)
            with open(os.path.join(a.out, f"profile-{name}.txt"), "w") as f:
                f.write(text)
    return rc


if __name__ == "__main__":
    sys.exit(main())
