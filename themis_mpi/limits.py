"""Physically meaningful ranges of every number a user can give, checked once at the boundary.

A value outside its range is refused with one line naming the range, so no overflow, NaN or
absurd amount of work reaches the engine: sizes up to 1 PiB per NPU, up to 2^24 NPUs in up to
16 dims, bandwidths from 1 MB/s to 1 PB/s, latencies up to 1 s, times up to a day.
"""

from __future__ import annotations

import math

from .errors import UsageError
from .launch import env_local_size

MAX_SIZE_BYTES = 2**50  # per NPU
MAX_DIM_NPUS = 2**20
MAX_NPUS = 2**24
MAX_DIMS = 16
MIN_BANDWIDTH_GBPS, MAX_BANDWIDTH_GBPS = 1e-3, 1e6
MAX_LATENCY_NS = 1e9
MAX_MTU_BYTES = 2**30  # --mtu, MTU(...): a packet of the packet rule
MIN_INA_EFFICIENCY = 0.01  # share of a Switch dim's bandwidth an in-switch reduction reaches
MIN_HBM_GBPS, MAX_HBM_GBPS = 1.0, 1e6  # --hbm-gbps: NPU memory bandwidth (endpoint model)
MAX_COMPUTE_SHARE = 0.95  # --compute-share: share of HBM kept for compute while both run
MAX_TIME_NS = 86_400e9  # compute, update and endpoint delays
MAX_CHUNKS = 65_536
MAX_SCALE = 1e6  # --compute-scale, --comm-scale
MAX_JITTER_SIGMA = 2.0  # --compute-jitter: lognormal sigma of the compute-time factor
MIN_LINK_SCALE, MAX_LINK_SCALE = 1e-3, 1e3  # --link-scale: one NPU's links, times their dim's bandwidth
MIN_BUCKET_MIB, MAX_BUCKET_MIB = 2.0**-20, MAX_SIZE_BYTES / 2**20  # --bucket-mib, --first-bucket-mib (1 B..)
MAX_ITERS = 1_000_000
MAX_FACTOR = 1024.0  # -f
MAX_TIMEOUT_S = 86_400.0
MAX_TIME_SCALE = 1e9
RANK_OVERHEAD_BYTES = 64 * 2**20  # Python, numpy, mpi4py and MPI per rank (scripts/memory_phases.py)


def in_range(what: str, value: float, lo: float, hi: float, unit: str = "") -> float:
    """`value` if finite and in [lo, hi]; otherwise one line naming the range."""
    if not isinstance(value, (int, float)) or not math.isfinite(value) or not lo <= value <= hi:
        suffix = f" {unit}" if unit else ""
        raise UsageError(f"{what} must be between {lo:g} and {hi:g}{suffix}, got {value!r}")
    return value


def meminfo_bytes(field: str) -> int | None:
    """A field of /proc/meminfo (Linux) in bytes, e.g. MemTotal, or None when unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith(f"{field}:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def available_memory_bytes() -> int | None:
    """MemAvailable of this machine now (a diagnostic: it moves as the job's own ranks start)."""
    return meminfo_bytes("MemAvailable")


def check_memory(bytes_per_rank: int, what: str) -> None:
    """Refuse, before allocating, a run whose ranks on this machine would not fit in its memory.

    The yardstick is the machine's total memory, not what is available now: every rank checks
    before MPI starts, while the job's other ranks are starting and taking memory, so
    MemAvailable differs from rank to rank and a job near the limit was refused by some ranks
    only (seen at 256 ranks). MemTotal gives every rank of a machine the same answer.
    """
    total = meminfo_bytes("MemTotal")
    ranks = env_local_size()
    need = ranks * (bytes_per_rank + RANK_OVERHEAD_BYTES)
    if total is not None and need > total:
        raise UsageError(
            f"{ranks} ranks on this machine need about {need / 2**30:.1f} GiB ({what}: "
            f"{bytes_per_rank / 2**30:.2f} GiB per rank) but it has {total / 2**30:.1f} GiB"
        )
