"""A custom algorithm as a run's collective: which file runs it, and one GPU's part on real data.

``--algorithm msccl:FILE`` names one MSCCL-IR file for the dims of a collective; it runs the
whole collective when its ``ngpus`` is the NPU count of the collective's group (GPU g is the
group's NPU g, dim 0 fastest). ``msccl-auto:DIR`` picks, per run, the first file of DIR (by name)
of the collective, the group's NPU count and a size window (``minBytes``..``maxBytes``) that
holds the run's size, as RCCL picks one; none: the dims' built-in algorithms run (`choose`).

The run's size is the collective's: each of its C chunks (`collectives.Collective.chunk_bounds`)
is one iteration of the file's loop, on its elements split in ``nchunksperloop`` chunks
(`layout`). `run_gpu` runs one GPU's program on numpy data, its messages moved by the caller
(over MPI on the emulator), and counts the output elements that differ from what the collective
puts there (`verify.input_values` in, the collective's contributions reduced out).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..collectives import Collective, block_bounds, priced_chunks
from ..errors import UsageError
from ..topology import Topology, is_custom
from ..verify import input_values
from .check import require
from .execute import REDOPS, Algebra, Memory, apply, expected, require_proof
from .ir import Algorithm, read_algorithm
from .program import GpuProgram, Ref, schedule, storage_chunks, views

MSCCL, AUTO = "msccl:", "msccl-auto:"
MAX_AUTO_FILES = 256  # files of a msccl-auto directory read at most


@dataclass(frozen=True)
class Custom:
    """The custom algorithm a run takes: its file, the algorithm and every GPU's program.

    Attributes:
        source: the file's path.
        algo: the algorithm, checked.
        progs: every GPU's program (`program.programs`).
        order: (gpu, threadblock, step) in an order every runtime may follow (`program.schedule`).
    """

    source: str
    algo: Algorithm
    progs: tuple[GpuProgram, ...]
    order: tuple[tuple[int, int, int], ...]

    @property
    def label(self) -> str:
        """``msccl:PATH``, as the run was asked."""
        return MSCCL + self.source


def custom_spec(topology: Topology, collective: Collective) -> str:
    """The custom algorithm the collective's dims name ("" for none); one line if they differ."""
    specs = {topology.dims[d].custom for d in collective.dims if topology.dims[d].npus > 1}
    if not specs - {""}:
        return ""
    if len(specs) > 1:
        raise UsageError(
            "a custom algorithm runs a whole collective: give one --algorithm msccl:FILE for every "
            f"dim of the collective (dims {', '.join(map(str, collective.dims))} name "
            f"{', '.join(sorted(s or 'built-in' for s in specs))}); "
            "per-dim custom stages are not supported yet"
        )
    return specs.pop()


def _fits(algo: Algorithm, collective: Collective, npus: int) -> str:
    """Why the algorithm cannot run the collective on `npus` NPUs ("" when it can)."""
    if algo.collective.op != collective.op:
        return f"it computes {algo.coll}, not {collective.op}"
    if algo.ngpus != npus:
        return f"it runs on {algo.ngpus} GPUs, the collective on {npus} NPUs"
    return ""


_LOADED: dict[tuple, Custom] = {}  # (path, its mtime and size, op, NPUs) -> a proved file


def load(path: str, collective: Collective, npus: int, prove: bool) -> Custom:
    """Read and check a file for the collective (and with `prove`, run the symbolic proof).

    A file proved once is taken again while it is unchanged (a sweep checks it before running).
    """
    try:
        stat = os.stat(path)
    except OSError:
        stat = None
    key = (path, stat and stat.st_mtime_ns, stat and stat.st_size, collective.op, npus)
    if key in _LOADED:
        return _LOADED[key]
    algo = read_algorithm(path)
    why = _fits(algo, collective, npus)
    if why:
        raise UsageError(f"{path}: {why}")
    progs = require(algo, path)
    custom = Custom(path, algo, progs, schedule(progs).order)
    if prove:
        require_proof(algo, progs, path)
        if stat is not None:
            _LOADED[key] = custom
    return custom


def choose(topology: Topology, collective: Collective, prove: bool = True) -> Custom | None:
    """The custom algorithm that runs the collective (module doc); None: the built-in ones do."""
    spec = custom_spec(topology, collective)
    if not spec:
        return None
    if topology.flat:
        raise UsageError(f"{spec} runs on per-dim topologies; nccl dims time a collective flat")
    npus = topology.group_npus(collective.dims)
    if npus != topology.npus:
        raise UsageError(
            f"{spec} runs a collective over every NPU for now; drop --dims "
            f"(dims {', '.join(map(str, collective.dims))} are {npus} of {topology.npus} NPUs)"
        )
    if spec.startswith(MSCCL):
        return load(spec[len(MSCCL) :], collective, npus, prove)
    folder = spec[len(AUTO) :]
    if not os.path.isdir(folder):
        raise UsageError(f"{spec}: {folder} is not a directory")
    names = sorted(n for n in os.listdir(folder) if n.endswith(".xml"))[:MAX_AUTO_FILES]
    for name in names:
        path = os.path.join(folder, name)
        algo = read_algorithm(path)
        lo = algo.min_bytes or 0
        hi = math.inf if algo.max_bytes is None else algo.max_bytes
        if not _fits(algo, collective, npus) and lo <= collective.size_bytes <= hi:
            return load(path, collective, npus, prove)
    return None


def uses_custom(topology: Topology) -> bool:
    """Whether any dim names a custom algorithm."""
    return any(is_custom(d.custom) for d in topology.dims)


def chunk_bytes(custom: Custom, collective: Collective) -> list[float]:
    """Priced bytes of one chunk of the file in each iteration (each of the run's chunks)."""
    n = custom.algo.nchunksperloop
    unit, sizes, _ = priced_chunks(collective, collective.chunk_bounds())
    return [s * unit / n for s in sizes]


def layout(custom: Custom, collective: Collective, it: int) -> list[int]:
    """Element bounds of the file's chunks in iteration `it` (the run's chunk `it`)."""
    bounds = collective.chunk_bounds()
    return block_bounds(int(bounds[it]), int(bounds[it + 1]), custom.algo.nchunksperloop)


Send = Callable[[int, int, np.ndarray], None]  # (peer, channel, chunks)
Receive = Callable[[int, int, tuple[int, ...]], np.ndarray]  # (peer, channel, shape) -> chunks


def run_gpu(
    custom: Custom,
    collective: Collective,
    gpu: int,
    send: Send,
    receive: Receive,
    between: Callable[[], None] = lambda: None,
) -> tuple[int, int]:
    """GPU `gpu`'s program on numpy data, every iteration (module doc): (wrong elements, checked).

    Its steps run in `Custom.order`; `send` posts a message without waiting, `receive` blocks
    for one; `between` runs after each iteration (the caller's sends may be completed there, and
    its receive buffers taken again). Every GPU running this with the same `custom` exchanges
    matching messages.
    """
    wrong = checked = 0
    for it in range(len(collective.chunk_bounds()) - 1):
        bad, n = _iteration(custom, collective, gpu, layout(custom, collective, it), send, receive)
        wrong, checked = wrong + bad, checked + n
        between()
    return wrong, checked


def _iteration(
    custom: Custom, collective: Collective, gpu: int, cb: list[int], send: Send, receive: Receive
) -> tuple[int, int]:
    """One iteration of `run_gpu` on the elements of chunk bounds `cb`."""
    algo, prog = custom.algo, custom.progs[gpu]
    inplace = algo.placements[0]
    npus, dtype, block = algo.ngpus, collective.dtype, algo.nchunksperloop // algo.ngpus
    fill = np.nan if np.dtype(dtype).kind == "f" else -1
    e = max(1, max(b - a for a, b in zip(cb, cb[1:])))  # elements of the largest chunk (the others padded)
    algebra = Algebra(new=lambda n: np.full((n, e), fill, dtype=dtype), reduce=REDOPS[collective.redop])
    view = views(algo, gpu, inplace)
    mem = Memory(view, storage_chunks(algo, gpu, inplace), algebra)

    def values(q: int, i: int) -> np.ndarray:
        """Input chunk i of GPU q: its elements' closed-form values."""
        pos = i if algo.collective.input_whole else q * block + i
        return input_values(q, npus, cb[pos], cb[pos + 1], dtype)

    inputs = np.full((view["i"].size, e), fill, dtype=dtype)
    for i in range(view["i"].size):
        v = values(gpu, i)
        inputs[i, : len(v)] = v
    mem.write(Ref("i", 0, view["i"].size), inputs)
    for g, t, k in custom.order:
        if g != gpu:
            continue
        op = prog.threadblocks[t][k]
        got = receive(op.recv_peer, op.chan, (op.count, e)) if op.recv_peer >= 0 else None
        out = apply(op, mem, algebra, got)
        if op.send_peer >= 0:
            send(op.send_peer, op.chan, np.ascontiguousarray(out))
    result = mem.read(Ref("o", 0, view["o"].size))
    wrong = checked = 0
    for j, want in enumerate(expected(algo, gpu)):
        if want is not None:
            value = REDOPS[collective.redop].reduce([values(q, i) for q, i in want], axis=0)
            checked += len(value)
            wrong += int(np.count_nonzero(result[j, : len(value)] != value))
    return wrong, checked
