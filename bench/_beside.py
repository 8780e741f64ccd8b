"""A thread that keeps the interpreter busy beside a measurement (``bench.launch_cost``,
``bench.gil_convoy``): what a call that hands the GIL back meets in the training pipeline."""

from __future__ import annotations

import threading
from contextlib import contextmanager


def python_loop(stop: threading.Event) -> None:
    """Run Python bytecode (holding the GIL but at forced switches) until ``stop`` is set."""
    x = 0
    while not stop.is_set():
        for i in range(1000):
            x += i


@contextmanager
def beside(target=None, *args):
    """Run ``target(stop, *args)`` in a daemon thread for the block (nothing if ``target`` is None);
    ``stop`` is set and the thread joined when the block ends."""
    if target is None:
        yield
        return
    stop = threading.Event()
    thread = threading.Thread(target=target, args=(stop, *args), daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
