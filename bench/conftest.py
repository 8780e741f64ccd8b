"""Shared pytest-benchmark plumbing: hardware info on every result and a closing summary.

Run: ``pytest bench/ --benchmark-only`` (add ``-k`` to pick operations, ``--benchmark-json FILE`` to keep).

The summary, printed after the run (no pseudo-benchmark, so pytest-benchmark's own table holds only
real cases): one line per recorded case, rates (``*_per_s`` figures) in millions per second, then
the table of every benchmark module that defines ``summary_lines(figures) -> list[str]`` (called with
the ``record``-ed dicts of its cases, in run order). ``extra_info`` in the JSON keeps plain units.
"""

import os
import platform

import pytest

from .bench_device import gpu_name

_ROWS = []   # (test name, module, figures) per recorded case


def hardware() -> dict:
    info = {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
            "python": platform.python_version()}
    gpu = gpu_name()
    if gpu:
        info["gpu"] = gpu
    return info


@pytest.fixture
def record(benchmark, request):
    """``record(**extra)``: put measured figures (keys/s, ratios vs peers) and the hardware into
    ``benchmark.extra_info`` and into the summary printed at the end of the run."""

    def _record(**extra):
        benchmark.extra_info.update(hardware())
        benchmark.extra_info.update(extra)
        _ROWS.append((request.node.name, request.module, extra))

    return _record


def format_figure(name: str, value) -> str:
    """``keys_per_s=9.4e6`` -> ``keys=9.40 M/s``; other floats to 4 significant digits."""
    if name.endswith("_per_s") and isinstance(value, (int, float)):
        return f"{name[:-len('_per_s')]}={value / 1e6:.2f} M/s"
    if isinstance(value, float):
        return f"{name}={value:.4g}"
    return f"{name}={value}"


def pytest_terminal_summary(terminalreporter):
    if not _ROWS:
        return
    terminalreporter.section("hps benchmark figures (peers measured in the same run)")
    for name, _, extra in _ROWS:
        figures = "  ".join(format_figure(k, v) for k, v in extra.items())
        terminalreporter.write_line(f"{name:<60} {figures}")
    modules = {}
    for _, module, extra in _ROWS:
        modules.setdefault(module, []).append(extra)
    for module, figures in modules.items():
        if hasattr(module, "summary_lines"):
            terminalreporter.write_line("")
            for line in module.summary_lines(figures):
                terminalreporter.write_line(line)
