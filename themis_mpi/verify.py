"""Closed-form test data: what every rank puts in, and what it must hold afterwards.

Inputs are ``rank + N * (i mod m)`` (`input_values`), integer-exact in every dtype, so the
reduced values have a closed form (`reduced_values`) and a result can be checked element by
element without any other rank's data. Checks run in blocks, so temporaries stay small.
"""

from __future__ import annotations

import numpy as np

from .collectives import Collective, owned_region, rs_dims, split_bounds
from .errors import UsageError
from .topology import Topology


def value_period(npus: int) -> int:
    """Period m of the index pattern, small enough that every sum is exact in float32."""
    return int(max(1, min(1021, (2**24 - npus * npus) // max(1, npus * npus))))


def input_values(rank, npus: int, start: int, stop: int, dtype) -> np.ndarray:
    """Inputs of elements [start, stop) on `rank`: ``rank + N * (i mod m)``, integer-exact.

    `rank` may be an array (one source rank per element).
    """
    i = np.arange(start, stop, dtype=np.int64)
    return (rank + npus * (i % value_period(npus))).astype(dtype)


def reduced_values(redop: str, npus: int, start: int, stop: int, dtype) -> np.ndarray:
    """The closed-form reduction over all ranks of `input_values` for elements [start, stop)."""
    return _reduced_pattern(redop, npus, np.arange(start, stop, dtype=np.int64), dtype)


def _reduced_pattern(redop: str, npus: int, i: np.ndarray, dtype) -> np.ndarray:
    base = npus * (i % value_period(npus))
    if redop == "sum":
        out = npus * base + npus * (npus - 1) // 2
    elif redop == "max":
        out = base + npus - 1
    else:
        out = base
    return out.astype(dtype)


def _periods(buffer: np.ndarray, lo: int, hi: int, pattern: np.ndarray):
    """Views of buffer[lo:hi] as whole periods (rows) and a tail, with the pattern aligned to lo."""
    m = len(pattern)
    aligned = np.roll(pattern, -(lo % m))
    rows = (hi - lo) // m
    return buffer[lo : lo + rows * m].reshape(rows, m), buffer[lo + rows * m : hi], aligned


def fill_periodic(buffer: np.ndarray, lo: int, hi: int, pattern: np.ndarray) -> None:
    """buffer[i] = pattern[i mod m] for i in [lo, hi), one broadcast pass."""
    rows, tail, aligned = _periods(buffer, lo, hi, pattern)
    rows[:] = aligned
    tail[:] = aligned[: len(tail)]


def count_periodic_mismatch(buffer: np.ndarray, lo: int, hi: int, pattern: np.ndarray) -> int:
    """Elements i in [lo, hi) where buffer[i] != pattern[i mod m].

    Compared in blocks, so the boolean temporary stays small.
    """
    rows, tail, aligned = _periods(buffer, lo, hi, pattern)
    step = max(1, BLOCK_ELEMS // len(pattern))
    wrong = sum(int(np.count_nonzero(rows[r : r + step] != aligned)) for r in range(0, len(rows), step))
    return wrong + int(np.count_nonzero(tail != aligned[: len(tail)]))


def group_rank(topology: Topology, dims, coords) -> int:
    """This NPU's rank within its group of the involved dims (dim 0 varies fastest)."""
    return sum(coords[d] * stride for d, stride in topology.group_strides(dims).items())


def _bounds(collective: Collective, bounds) -> np.ndarray:
    """The run's chunk bounds, or the collective's nominal ones."""
    return collective.chunk_bounds() if bounds is None else np.asarray(bounds, dtype=np.int64)


def owned_regions(
    topology: Topology, collective: Collective, coords, orders, bounds=None
) -> list[tuple[int, int]]:
    """Per chunk, the region a full reduce-scatter along the chunk's order leaves on this NPU.

    `bounds` are the run's chunk bounds (default: the collective's nominal chunks).
    """
    bounds = _bounds(collective, bounds)
    regions = []
    for k in range(len(bounds) - 1):
        lo, hi = int(bounds[k]), int(bounds[k + 1])
        for d in rs_dims(topology, collective, orders[k]):
            lo, hi = owned_region(topology.dims[d].npus, coords[d], lo, hi)
        regions.append((lo, hi))
    return regions


def owners(topology: Topology, collective: Collective, orders, bounds=None) -> np.ndarray:
    """Group rank of the NPU whose block each element is after a reduce-scatter."""
    strides = topology.group_strides(collective.dims)
    owner = np.zeros(collective.count, dtype=np.int64)
    bounds = _bounds(collective, bounds)
    for k in range(len(bounds) - 1):
        leaves = [(int(bounds[k]), int(bounds[k + 1]), 0)]
        for d in rs_dims(topology, collective, orders[k]):
            p = topology.dims[d].npus
            split = []
            for lo, hi, base in leaves:
                b = lo + split_bounds(hi - lo, p)
                split += [(int(b[j]), int(b[j + 1]), base + j * strides[d]) for j in range(p)]
            leaves = split
        for lo, hi, base in leaves:
            owner[lo:hi] = base
    return owner


SENTINEL = -7
BLOCK_ELEMS = 1 << 18


def check_range(dtype, npus: int) -> None:
    """Refuse, rather than silently wrap, inputs or sums that an integer dtype cannot hold."""
    info = np.iinfo(dtype) if np.issubdtype(np.dtype(dtype), np.integer) else None
    m = value_period(npus)
    largest = npus * (npus * (m - 1) + npus - 1)  # the sum of the largest inputs of all ranks
    if info is not None and largest > info.max:
        raise UsageError(
            f"{np.dtype(dtype).name} cannot hold the sums of {npus} NPUs' inputs "
            f"(up to {largest} > {info.max}); use int64 or a float type"
        )


def fill_input(buffer: np.ndarray, topology: Topology, collective: Collective, coords, orders, bounds=None):
    """Write this NPU's closed-form input; an all-gather fills only its own blocks (of `bounds`)."""
    if collective.op == "broadcast":
        raise UsageError("the emulator moves no broadcast: themis-mpi model times it on nccl dims")
    n = topology.group_npus(collective.dims)
    check_range(buffer.dtype, n)
    rank = group_rank(topology, collective.dims, coords)
    pattern = input_values(rank, n, 0, value_period(n), buffer.dtype)
    if collective.op == "all_gather":
        buffer[:] = SENTINEL
        for lo, hi in owned_regions(topology, collective, coords, orders, bounds):
            fill_periodic(buffer, lo, hi, pattern)
        return
    fill_periodic(buffer, 0, collective.count, pattern)


def count_wrong(
    buffer: np.ndarray, topology: Topology, collective: Collective, coords, orders, bounds=None
) -> int:
    """Elements of this NPU's result that differ from the closed form (chunks cut at `bounds`)."""
    n = topology.group_npus(collective.dims)
    if collective.op == "all_to_all":
        return _wrong_all_to_all(buffer, topology, collective, coords, bounds)
    if collective.op == "all_gather":
        owner = owners(topology, collective, orders, bounds)
        wrong = 0
        for lo in range(0, collective.count, BLOCK_ELEMS):
            hi = min(lo + BLOCK_ELEMS, collective.count)
            want = input_values(owner[lo:hi], n, lo, hi, buffer.dtype)
            wrong += int(np.count_nonzero(buffer[lo:hi] != want))
        return wrong
    pattern = _reduced_pattern(collective.redop, n, np.arange(value_period(n), dtype=np.int64), buffer.dtype)
    if collective.op == "reduce_scatter":
        regions = owned_regions(topology, collective, coords, orders, bounds)
    else:
        regions = [(0, collective.count)]
    return sum(count_periodic_mismatch(buffer, lo, hi, pattern) for lo, hi in regions)


def _wrong_all_to_all(buffer, topology: Topology, collective: Collective, coords, bounds=None) -> int:
    """All-to-all: block j of each chunk must hold what group rank j had in this NPU's block."""
    n = topology.group_npus(collective.dims)
    rank = group_rank(topology, collective.dims, coords)
    bounds = _bounds(collective, bounds)
    wrong = 0
    for k in range(len(bounds) - 1):
        lo, hi = int(bounds[k]), int(bounds[k + 1])
        b = (hi - lo) // n
        src = np.repeat(np.arange(n, dtype=np.int64), b)
        offset = np.tile(np.arange(b, dtype=np.int64), n)
        index = lo + rank * b + offset
        i = index % value_period(n)
        want = (src + n * i).astype(buffer.dtype)
        wrong += int(np.count_nonzero(buffer[lo : lo + n * b] != want))
        tail = lo + n * b
        wrong += int(np.count_nonzero(buffer[tail:hi] != input_values(rank, n, tail, hi, buffer.dtype)))
    return wrong
