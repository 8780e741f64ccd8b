"""HDF5 export/import of a whole :class:`~hps.ssd.SSDStore` (h5py): datasets "keys" (n,) uint64 and
"rows" (n, dim), attributes ``dim`` (int) and ``dtype`` (str), for backups and interoperability."""

from __future__ import annotations

import numpy as np

from ..errors import StoreFormatError


def export_h5(store, path) -> int:
    """Write every live row, grouped by parameter file (one read per file) -> number of rows."""
    import h5py

    with store._mu:
        store._check_open()
        keys, loc = store._index.items()
        order = np.argsort(loc[:, 0], kind="stable")
        keys, fseq, slots = keys[order], loc[order, 0], loc[order, 1]
        useq, starts = np.unique(fseq, return_index=True)
        files = [store._files[int(s)] for s in useq]
        for f in files:
            f.refs += 1
    bounds = np.append(starts, keys.shape[0])
    try:
        with h5py.File(path, "w") as h:
            h.attrs["dim"] = store.dim
            h.attrs["dtype"] = str(store.dtype)
            h.create_dataset("keys", data=keys.astype(np.uint64))
            ds = h.create_dataset("rows", shape=(keys.shape[0], store.dim), dtype=store.dtype)
            for i, f in enumerate(files):
                rows = store._read_rows(f)
                ds[bounds[i]:bounds[i + 1]] = rows[slots[bounds[i]:bounds[i + 1]]]
    finally:
        store._release(files, count_read=True)
    return int(keys.shape[0])


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
