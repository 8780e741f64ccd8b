"""Data readers (Criteo TSV, libsvm/libFM, CSV, Parquet) and the synthetic generator; all yield ``Batch``es.

Entry point: ``open_dataset(path, fmt, batch_size, shard=(index, n_shards), strict=False,
max_malformed=0.01, **options)``. Every dataset offers ``batches(start_batch=0)``, ``probe()``,
``stats``, ``n_fields`` and ``n_dense``; the text readers stream in constant memory and
``SyntheticData`` adds ``eval_batches()`` and ``bayes_auc()``. ``shard`` picks the part of the data a
reader parses (``hps.data._shards``: line-aligned byte ranges or whole files; rows of the synthetic
data); shards read one after the other give all of the data. ``op_osrp(keys, offsets, bins, seed)``
hashes any CSR block of keys into OP+OSRP features (``hps.data._oposrp``). ``infer_format(paths)``
tells the format of data files from their names, or a ``.txt``'s first line (``hps.data._detect``).
``readers=N`` parses or generates with N threads, the same batches for any N (``hps.data._parallel``).
Parquet written by ``python -m hps.convert`` (keys already hashed) is read by :class:`ConvertedReader`.
"""

from ._batch import FIELD_SHIFT, HASHING_VERSION, MAX_FIELD, MAX_FIELDS, Batch, FixedBatch, make_keys
from ._chunks import DEFAULT_CHUNK_BYTES, DEFAULT_MAX_MALFORMED, MISSING_VALUE, ReaderStats
from ._criteo import NEGATIVE_VALUE, CriteoReader
from ._dense import DENSE_TRANSFORMS
from ._csv import CsvReader
from ._detect import format_of, infer_format
from ._libsvm import LibsvmReader
from ._converted import ConvertedReader, converted_source, is_converted
from ._open import FORMATS, column_names, format_options, open_dataset
from ._oposrp import HashedReader, hash_batch, op_osrp
from ._parquet import ParquetReader
from ._shards import share_bounds
from ._sources import DataFileNotFoundError, expand_paths
from ._synthetic import SyntheticData

__all__ = [
    "Batch",
    "make_keys",
    "FixedBatch",
    "FIELD_SHIFT",
    "HASHING_VERSION",
    "MAX_FIELD",
    "MAX_FIELDS",
    "open_dataset",
    "format_options",
    "ConvertedReader",
    "is_converted",
    "converted_source",
    "column_names",
    "FORMATS",
    "infer_format",
    "format_of",
    "CriteoReader",
    "LibsvmReader",
    "CsvReader",
    "ParquetReader",
    "SyntheticData",
    "ReaderStats",
    "DataFileNotFoundError",
    "MISSING_VALUE",
    "NEGATIVE_VALUE",
    "DEFAULT_CHUNK_BYTES",
    "DEFAULT_MAX_MALFORMED",
    "DENSE_TRANSFORMS",
    "share_bounds",
    "expand_paths",
    "op_osrp",
    "hash_batch",
    "HashedReader",
]
