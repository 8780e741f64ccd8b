"""``FdCache``: the open read handles of one store's parameter files, shared by its I/O threads
(``hps.ssd._fileio.FileIO``). Opening a file per read would cost a syscall pair per block; keeping
every file open would run out of descriptors on a store of many files. Every handle is opened and
closed through the store's ``Env``."""

from __future__ import annotations

import threading
from collections import OrderedDict


class FdCache:
    """Open read handles keyed by (path, direct): idle ones beyond ``cap`` are closed (least recently
    used first); a handle in use is never closed. Thread-safe (its own lock)."""

    def __init__(self, env, random: bool, cap: int = 256):
        self._env, self._random, self._cap = env, random, cap
        self._mu = threading.Lock()
        self._open: OrderedDict = OrderedDict()  # (path, direct) -> [handle, users]

    def acquire(self, keys) -> list:
        """Handles of ``keys`` ((path, direct) pairs), marked in use until :meth:`release`."""
        out = []
        with self._mu:
            try:
                for key in keys:
                    entry = self._open.get(key)
                    if entry is None:
                        entry = self._open[key] = [self._env.open_read(key[0], key[1], self._random), 0]
                    entry[1] += 1
                    self._open.move_to_end(key)
                    out.append(entry[0])
            except BaseException:
                self._unuse(keys[:len(out)])
                raise
        return out

    def release(self, keys) -> None:
        with self._mu:
            self._unuse(keys)

    def _unuse(self, keys) -> None:
        """REQUIRES: ``_mu`` held."""
        for key in keys:
            self._open[key][1] -= 1
        while len(self._open) > self._cap:
            idle = next((k for k, e in self._open.items() if e[1] == 0), None)
            if idle is None:
                return
            self._env.close(self._open.pop(idle)[0])

    def drop(self, path: str) -> None:
        """Close the idle handles of a file about to be deleted."""
        with self._mu:
            for key in [(path, False), (path, True)]:
                entry = self._open.get(key)
                if entry is not None and entry[1] == 0:
                    del self._open[key]
                    self._env.close(entry[0])

    def close_all(self) -> None:
        with self._mu:
            for handle, _ in self._open.values():
                self._env.close(handle)
            self._open.clear()
