"""``hps.formats``: the files a training job leaves for others to read, shared by ``hps.train`` (which
writes them) and ``hps.predict`` (which reads them); the specification is docs/formats.md.

- checkpoints under ``--checkpoint-dir`` (``_checkpoint``: consistent cuts at a batch boundary, ``LATEST``
  switched atomically);
- the model export of ``--export DIR`` (``_export``: written like a checkpoint, read back by
  :func:`load_export` and :func:`read_model`, from an export, a checkpoint or a ``--checkpoint-dir``);
- the checksummed manifest of both (``_manifest``: ``meta.json``, ``model.json``);
- HDF5 output that turns a failed write (a full disk) into one exception (``_h5out``).

Every name written to disk here is a constant: never rename or renumber it.
"""

from ._checkpoint import BEST_DIR, checkpoint_name, fsync_path, last_checkpoint, point_latest
from ._export import export_trained, load_export, read_model
from ._h5out import h5_output
from ._manifest import CHECKPOINT_VERSION, EXPORT_META, EXPORT_VERSION, read_meta, write_meta

__all__ = ["load_export", "read_model", "export_trained", "last_checkpoint", "checkpoint_name", "point_latest",
           "fsync_path", "h5_output", "read_meta", "write_meta", "BEST_DIR", "CHECKPOINT_VERSION", "EXPORT_META",
           "EXPORT_VERSION"]
