"""A training job's figures: what each rank measured (:func:`rank_figures`) and the job's, over every
rank (:func:`job_figures`). Per-rank figures are lists in rank order; SSD-PS figures and bytes sent are
summed over ranks; cache figures and the pipeline's wall seconds are the calling rank's (rank 0's in the
job's metrics)."""

from __future__ import annotations

from ._collectives import STAGE_CHANNELS
from ..gpu import transfer_metrics

#: The SSD-PS figures each rank reports (``SSDStore.stats``).
SSD_FIGURES = ("bytes_read", "bytes_written", "disk_bytes", "files", "live_rows")


def rank_figures(coll, pipeline, feed, store, memps, resident_rows: int, transfers, features: dict,
                 examples: int = 0, hier=None, hbm_rows: int | None = None) -> dict:
    """This rank's share of the work: the ``examples`` it trained (its shards'), bytes parsed, peak
    ``resident_rows``, bytes sent by kind, CPU
    seconds of each stage outside MPI (its thread's and its helpers', ``StageTimes.helper_cpu``), wall
    and CPU seconds inside MPI, SSD-PS figures, the backend's ``transfers()`` (read last: the count of
    ``table_rows`` below lists the HBM-PS's keys, 8 B each as ``writeback``), the ``features``' figures
    and the HBM-PS cache's (``hier``, the ``ParameterHierarchy``; None before the first batch, when the
    budget is the plan's ``hbm_rows``): ``hbm`` (rows ``fetched`` into it, of them ``born`` on the
    device -- new keys' rows a GPU HBM-PS made itself --, ``evicted`` for its budget, ``budget_rows``) and ``table_rows``, the rows this rank owns over the three tiers
    (``ParameterHierarchy.owned_rows``; without ``hier`` the SSD-PS's live rows): what the SSD-PS would
    hold with every row written back, which a job does only when a reader needs it (``--export``,
    ``--keep-ssd``), so the SSD-PS figures count only the writes the job made."""
    chans = coll.channels()
    times = pipeline.stage_times()
    cpu = {s: times[s].cpu + times[s].helper_cpu - (chans[c].mpi_cpu_seconds if c else 0.0)
           for s, c in STAGE_CHANNELS.items()}
    mpi = {s: chans[c].mpi_seconds for s, c in STAGE_CHANNELS.items() if c}
    mpi_cpu = {s: chans[c].mpi_cpu_seconds for s, c in STAGE_CHANNELS.items() if c}
    st = store.stats()
    return {"examples": int(examples), "bytes_parsed": feed.bytes_parsed, "resident_rows": resident_rows, "bytes_sent": coll.bytes_sent(),
            "stage_cpu_seconds": cpu, "mpi_seconds": mpi, "mpi_cpu_seconds": mpi_cpu, "malformed": feed.malformed(),
            "ssd_rows_loaded": memps.stats()["ssd_loads"], "ssd": {k: st[k] for k in SSD_FIGURES},
            "table_rows": hier.owned_rows() if hier is not None else st["live_rows"],
            "transfers": transfers(), "features": features,
            "hbm": {"fetched": getattr(hier, "fetched", 0), "born": getattr(hier, "born", 0),
                    "evicted": getattr(hier, "evicted", 0),
                    "budget_rows": getattr(hier, "budget_rows", hbm_rows)}}


def job_figures(per: list, coll, pipeline, memps) -> dict:
    """The job's figures from every rank's :func:`rank_figures` ``per`` (rank order), with this rank's
    pipeline and MEM-PS."""
    ssd = {k: sum(r["ssd"][k] for r in per) for k in SSD_FIGURES}
    ms = memps.stats()
    times = pipeline.stage_times()
    return {
        "stage_seconds": {name: t.busy for name, t in times.items()},
        "stage_wait_seconds": {n: t.wait_in + t.wait_out for n, t in times.items()},
        "bottleneck": pipeline.bottleneck(),
        "cache_hit_rate": ms["hit_rate"],
        "cache_hit_rate_per_batch": [float(x) for x in ms["per_batch_hit_rate"]],
        "ssd_bytes_read": ssd["bytes_read"],
        "ssd_bytes_read_per_rank": [r["ssd"]["bytes_read"] for r in per],
        "ssd_bytes_written": ssd["bytes_written"],
        "ssd_disk_bytes": ssd["disk_bytes"],
        "ssd_files": ssd["files"],
        "table_rows": sum(r["table_rows"] for r in per),
        "ssd_rows_loaded": sum(r["ssd_rows_loaded"] for r in per),
        "ranks": coll.size,
        "mpi_wait": coll.wait_mode,
        "comm_seconds": coll.mpi_seconds(),
        "examples_per_rank": [r["examples"] for r in per],
        "bytes_parsed": [r["bytes_parsed"] for r in per],
        "resident_rows": [r["resident_rows"] for r in per],
        "hbm_budget_rows": [r["hbm"]["budget_rows"] for r in per],
        "hbm_fetched_rows": sum(r["hbm"]["fetched"] for r in per),
        "hbm_born_rows": sum(r["hbm"]["born"] for r in per),
        "hbm_evicted_rows": sum(r["hbm"]["evicted"] for r in per),
        "bytes_sent": {k: sum(r["bytes_sent"][k] for r in per) for k in per[0]["bytes_sent"]},
        "bytes_sent_per_rank": [r["bytes_sent"] for r in per],
        "stage_cpu_seconds": [r["stage_cpu_seconds"] for r in per],
        "mpi_seconds": [r["mpi_seconds"] for r in per],
        "mpi_cpu_seconds": [r["mpi_cpu_seconds"] for r in per],
        "malformed_lines": sum(r["malformed"][0] for r in per),
        "malformed_first": [x for r in per for x in r["malformed"][1]],
        **transfer_metrics([r["transfers"] for r in per]),  # host <-> device bytes by purpose
    }
