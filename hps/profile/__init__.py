"""FAE hot-embedding profiler (``seeds/003`` §4.1-4.2): ``python -m hps.profile`` or :func:`profile`."""

from ._estimate import CHUNK_ENTRIES, CHUNKS, ChunkSample, Estimate, search_threshold, t_quantile
from ._kernels import examples_all_hot
from ._profile import (PROFILE_FORMAT, PROFILE_VERSION, SAMPLER_BLOCKS, Profile, digest, hot_mask, profile,
                       read_profile, reader_record, row_bytes_of, write_profile)

__all__ = ["profile", "Profile", "read_profile", "write_profile", "hot_mask", "digest", "reader_record", "row_bytes_of",
           "examples_all_hot", "ChunkSample", "Estimate", "search_threshold", "t_quantile", "CHUNKS",
           "CHUNK_ENTRIES", "SAMPLER_BLOCKS", "PROFILE_FORMAT", "PROFILE_VERSION"]
