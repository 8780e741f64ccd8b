"""HDF5 export/import of a whole :class:`~hps.ssd.SSDStore` (h5py): datasets "keys" (n,) uint64 and
"rows" (n, dim), attributes ``dim`` (int) and ``dtype`` (str), for backups and interoperability."""

from __future__ import annotations

import numpy as np

from ..errors import StoreFormatError


def export_h5(store, path) -> int:
    """Write every live row (``store.iter_rows``, file by file, in chunks) -> number of rows.
    ``path``: a file name, or an open writable ``h5py.File`` (the caller closes it)."""
    import h5py

    if isinstance(path, h5py.File):
        return _write_rows(store, path)
    with h5py.File(path, "w") as h:
        return _write_rows(store, h)


def _write_rows(store, h) -> int:
    h.attrs["dim"] = store.dim
    h.attrs["dtype"] = str(store.dtype)
    ks = h.create_dataset("keys", shape=(0,), maxshape=(None,), dtype=np.uint64, chunks=(1 << 16,))
    ds = h.create_dataset("rows", shape=(0, store.dim), maxshape=(None, store.dim), dtype=store.dtype,
                          chunks=(max(1, (1 << 20) // max(1, store.dim * store.dtype.itemsize)), store.dim))
    n = 0
    for keys, rows in store.iter_rows():
        m = keys.shape[0]
        ks.resize((n + m,))
        ds.resize((n + m, store.dim))
        ks[n:n + m] = keys
        ds[n:n + m] = rows
        n += m
    return n


def import_h5(store, path) -> int:
    """Dump every (key, row) of ``path`` into the store, in chunks -> number of rows."""
    import h5py

    with h5py.File(path, "r") as h:
        if "keys" not in h or "rows" not in h:
            raise StoreFormatError(f"{path!r} has no 'keys' and 'rows' datasets")
        dim, dtype = int(h.attrs.get("dim", h["rows"].shape[-1])), np.dtype(h["rows"].dtype)
        if dim != store.dim or dtype != store.dtype:
            raise StoreFormatError(f"{path!r} holds dim={dim} dtype={dtype}, the store dim={store.dim} "
                                   f"dtype={store.dtype}")
        n = h["keys"].shape[0]
        step = 16 * store.rows_per_file
        for a in range(0, n, step):
            store.dump(h["keys"][a:a + step], h["rows"][a:a + step])
    return int(n)
