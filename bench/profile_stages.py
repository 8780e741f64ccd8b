"""cProfile of chosen pipeline stages of one training job: where each stage's busy time goes, by
function (wall clock, so a stage waiting on the GPU or on the GIL shows it where it waits).

    python -m bench.profile_stages [--stages place,train] [--top 30] [--sort tottime] [--out DIR] \\
        -- <python -m hps.train arguments>

Each named stage's work (``hps.pipeline.Stage.fn``) runs under a ``cProfile.Profile`` of its own,
enabled while that stage works; the report of each is printed after the job (and written to
``DIR/profile-<stage>.txt`` with ``--out``). Up to Python 3.11 a profiler sees its own thread only, so
several stages profile at once. From 3.12 cProfile is one ``sys.monitoring`` tool per process: one stage
a run, and its report also counts what the other threads called while that stage worked (a second
profiler would fail the job: an H200 run of 2026-11-27 did). A development tool: its figures are for
finding costs, not for reporting speed (profiling slows every Python call).
"""

from __future__ import annotations

import cProfile
import io
import os
import pstats
import sys

from hps._argparse import ArgumentParser


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    cut = argv.index("--") if "--" in argv else len(argv)
    p = ArgumentParser(prog="python -m bench.profile_stages", description=__doc__.split("\n\n")[0])
    p.add_argument("--stages", default="place,train", help="comma-separated stage names (place,train)")
    p.add_argument("--top", type=int, default=30, help="functions listed per stage (30)")
    p.add_argument("--sort", default="tottime", help="pstats sort key (tottime; cumtime)")
    p.add_argument("--out", default=None, help="also write profile-<stage>.txt into this folder")
    a = p.parse_args(argv[:cut])
    job = argv[cut + 1:]
    names = [n for n in a.stages.split(",") if n]
    if sys.version_info >= (3, 12) and len(names) > 1:
        p.error(f"Python {sys.version_info.major}.{sys.version_info.minor} runs one profiler per process: "
                f"name one stage a run (--stages {names[0]})")

    import hps.pipeline as pipeline
    from hps.train._main import main as train

    profiles = {name: cProfile.Profile() for name in names}
    init = pipeline.Stage.__init__

    def profiled_init(self, name, fn, *args, **kw):
        prof = profiles.get(name)
        if prof is not None:
            work = fn

            def fn(item):  # noqa: F811 - the stage's work, profiled in its own thread
                prof.enable()
                try:
                    return work(item)
                finally:
                    prof.disable()
        init(self, name, fn, *args, **kw)

    pipeline.Stage.__init__ = profiled_init
    try:
        rc = train(job)
    finally:
        pipeline.Stage.__init__ = init
    for name, prof in profiles.items():
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).sort_stats(a.sort).print_stats(a.top)
        text = f"=== stage {name} (sorted by {a.sort})\n{buf.getvalue()}"
        print(text)
        if a.out:
            os.makedirs(a.out, exist_ok=True)
            with open(os.path.join(a.out, f"profile-{name}.txt"), "w") as f:
                f.write(text)
    return rc


if __name__ == "__main__":
    sys.exit(main())
