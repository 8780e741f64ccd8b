"""Shared pytest-benchmark plumbing: hardware info on every result and a closing summary table.

Run: ``pytest bench/ --benchmark-only`` (add ``-k`` to pick operations, ``--benchmark-json FILE`` to keep).
"""

import os
import platform

import pytest

_ROWS = []


def hardware() -> dict:
    info = {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
            "python": platform.python_version()}
    try:
        from numba import cuda

        if cuda.is_available():
            info["gpu"] = cuda.get_current_device().name.decode()
    except Exception:
        pass
    return info


@pytest.fixture
def record(benchmark, request):
    """``record(**extra)``: put measured figures (keys/s, ratios vs peers) and the hardware into
    ``benchmark.extra_info`` and into the summary printed at the end of the run."""

    def _record(**extra):
        benchmark.extra_info.update(hardware())
        benchmark.extra_info.update(extra)
        _ROWS.append((request.node.name, extra))

    return _record


def pytest_terminal_summary(terminalreporter):
    if not _ROWS:
        return
    terminalreporter.section("hps benchmark figures (peers measured in the same run)")
    for name, extra in _ROWS:
        figures = "  ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in extra.items())
        terminalreporter.write_line(f"{name:<60} {figures}")
