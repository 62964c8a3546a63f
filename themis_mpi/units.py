"""Units and the size vocabulary shared by every command, table and file.

Sizes are bytes with binary suffixes as nccl-tests reads them (``64M`` = 64 * 2^20 B; ``-b``
first size, ``-e`` last, ``-f`` the factor between sizes); bandwidths are GB/s with
1 GB = 2^30 B (ASTRA-sim's convention); times are us in tables and ns inside the engine.
"""

from __future__ import annotations

import math
import re

from .errors import UsageError
from .limits import MAX_FACTOR, MAX_SIZE_BYTES

BYTES_PER_GB = 2**30
UNITS = "sizes in bytes (suffixes K/M/G are binary); bandwidth in GB/s with 1 GB = 2^30 B; times in us"
MAX_SIZES = 4096  # sizes in one -b/-e/-f sweep
_SIZE = re.compile(r"^\s*(\d+)\s*([KMG]?)B?\s*$", re.IGNORECASE)


def parse_size(text: str) -> int:
    """``64M`` -> 67108864; plain numbers are bytes."""
    match = _SIZE.match(text)
    if not match:
        raise UsageError(f"bad size {text!r}: use a byte count with an optional K, M or G suffix")
    digits = match.group(1)
    if len(digits) > 20:
        raise UsageError(f"size {text[:24]}... is out of range (at most {MAX_SIZE_BYTES} B per NPU)")
    value = int(digits) * {"": 1, "K": 2**10, "M": 2**20, "G": 2**30}[match.group(2).upper()]
    if value <= 0:
        raise UsageError(f"size must be positive, got {text!r}")
    if value > MAX_SIZE_BYTES:
        raise UsageError(f"size {text!r} is out of range (at most {MAX_SIZE_BYTES} B = 1 PiB per NPU)")
    return value


def size_sweep(first: int, last: int | None, factor: float) -> list[int]:
    """Sizes from first to last, multiplied by factor (nccl-tests' -b/-e/-f), each larger than the last."""
    last = first if last is None else last
    if last < first:
        raise UsageError(f"last size ({last} B) is smaller than the first ({first} B)")
    if not math.isfinite(factor) or factor > MAX_FACTOR or (factor <= 1 and last > first):
        raise UsageError(f"size factor must be > 1 and at most {MAX_FACTOR:g} to sweep, got {factor}")
    sizes, size = [], first
    while size <= last:
        sizes.append(size)
        if len(sizes) > MAX_SIZES:
            raise UsageError(
                f"the sweep from {first} to {last} B by {factor:g} has more than {MAX_SIZES} sizes"
            )
        size = max(size + 1, int(size * factor)) if factor > 1 else last + 1
    return sizes


def format_size(n_bytes: int) -> str:
    """The one size format of every table and plot: binary units, e.g. 64 MiB, 1.5 KiB, 512 B."""
    for suffix, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n_bytes >= scale:
            value = n_bytes / scale
            return f"{value:.0f} {suffix}" if n_bytes % scale == 0 else f"{value:.3g} {suffix}"
    return f"{n_bytes} B"
