"""A custom algorithm as a run's collective: which file runs it, and one GPU's part on real data.

``--algorithm msccl:FILE`` names one MSCCL-IR file for the dims of a collective; it runs the
whole collective when its ``ngpus`` is the NPU count of the collective's group (GPU g is the
group's NPU g, dim 0 fastest). ``msccl-auto:DIR`` picks, per run, the first file of DIR (by name)
of the collective, the group's NPU count and a size window (``minBytes``..``maxBytes``) that
holds the run's size, as RCCL picks one; none: the dims' built-in algorithms run (`choose`).
A file of one dim's size (``msccl:RS.xml+AG.xml`` on that dim) runs that dim's stages instead:
`dim_algorithms` picks each stage's file, `stage_rounds` and `stage_steps` map its ops onto the
steps a built-in algorithm gives the MPI transport (`algorithms.Step`).

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
from dataclasses import dataclass, replace

import numpy as np

from ..algorithms import COPY, REDUCE, Step
from ..collectives import Collective, block_bounds, priced_chunks
from ..cost import AG, AR, RS
from ..errors import UsageError
from ..topology import Topology, is_custom
from ..verify import input_values
from .check import require
from .execute import REDOPS, Algebra, Memory, apply, expected, require_proof
from .ir import (
    NOP,
    RECV,
    RECV_COPY_SEND,
    RECV_REDUCE_COPY,
    RECV_REDUCE_COPY_SEND,
    SEND,
    Algorithm,
    read_algorithm,
)
from .program import DATA, GpuProgram, Op, Ref, connection, schedule, storage_chunks, views

MSCCL, AUTO, PLUS = "msccl:", "msccl-auto:", "+"
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
    """The custom algorithm of the whole collective ("" for none, or custom stages per dim).

    One spec on every dim of the collective, of one file whose ``ngpus`` is not a dim's size,
    runs the whole collective; anything else is per dim (`dim_algorithms`).
    """
    specs = {topology.dims[d].custom for d in collective.dims if topology.dims[d].npus > 1}
    if len(specs) != 1 or not specs - {""}:
        return ""
    spec = next(iter(specs))
    if spec.startswith(MSCCL) and PLUS not in spec and len(collective.dims) > 1:
        npus = {topology.dims[d].npus for d in collective.dims}
        if read_algorithm(spec[len(MSCCL) :]).ngpus in npus - {topology.group_npus(collective.dims)}:
            return ""  # (a dim's algorithm, given once for every dim)
    return "" if PLUS in spec else spec


def _fits(algo: Algorithm, collective: Collective, npus: int) -> str:
    """Why the algorithm cannot run the collective on `npus` NPUs ("" when it can)."""
    if algo.collective.op != collective.op:
        return f"it computes {algo.coll}, not {collective.op}"
    if algo.ngpus != npus:
        return f"it runs on {algo.ngpus} GPUs, the collective on {npus} NPUs"
    return ""


_LOADED: dict[tuple, tuple[Custom, bool]] = {}  # (path, mtime, size, op, NPUs) -> (checked file, proved)


def load(path: str, collective: Collective, npus: int, prove: bool) -> Custom:
    """Read and check a file for the collective (and with `prove`, run the symbolic proof).

    A file checked (or proved) once is taken again while it is unchanged (a sweep checks it
    before running, a dim's stages are planned from it once: `stage_rounds`).
    """
    try:
        stat = os.stat(path)
    except OSError:
        stat = None
    key = (path, stat and stat.st_mtime_ns, stat and stat.st_size, collective.op, npus)
    if key in _LOADED and (_LOADED[key][1] or not prove):
        return _LOADED[key][0]
    custom = _LOADED[key][0] if key in _LOADED else None
    if custom is None:
        algo = read_algorithm(path)
        why = _fits(algo, collective, npus)
        if why:
            raise UsageError(f"{path}: {why}")
        progs = require(algo, path)
        custom = Custom(path, algo, progs, schedule(progs).order)
    if prove:
        require_proof(custom.algo, custom.progs, path)
    if stat is not None:
        _LOADED[key] = (custom, prove)
    return custom


def choose(topology: Topology, collective: Collective, prove: bool = True) -> Custom | None:
    """The custom algorithm that runs the whole collective (module doc); None: the dims' stages do."""
    spec = custom_spec(topology, collective)
    if not spec:
        dim_algorithms(topology, collective, prove)  # (a dim's files: checked here, before anything runs)
        return None
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


# --- a custom algorithm as one dim's stages -----------------------------------------------------

STAGE_OPS = {RS: "reduce_scatter", AG: "all_gather", AR: "all_reduce"}  # a stage's op -> its file's
STAGE_NAMES = {RS: "reduce-scatter", AG: "all-gather", AR: "all-reduce"}
MAPPED = frozenset({SEND, RECV, RECV_REDUCE_COPY, RECV_COPY_SEND, RECV_REDUCE_COPY_SEND, NOP})
RankRound = tuple[list, list, list]  # one GPU's round: sends, copied receives, reduced receives


def dim_algorithms(topology: Topology, collective: Collective, prove: bool) -> dict[int, dict[str, Custom]]:
    """Each dim's custom stages by stage op (RS, AG, AR), for a collective no file runs whole.

    A dim names ``msccl:FILE`` or ``msccl:RS.xml+AG.xml``: files for its own size (``ngpus``),
    one per collective; its reduce-scatter stages run the reduce_scatter file, its all-gather
    stages the allgather file, an all-reduce stage the allreduce file, else the two in turn.
    Every file must map onto steps (`stage_rounds`). One line for anything else.
    """
    out: dict[int, dict[str, Custom]] = {}
    if custom_spec(topology, collective):  # (a whole collective's file, or msccl-auto's fallback)
        return out
    for d in collective.dims:
        dim = topology.dims[d]
        if not dim.custom or dim.npus == 1:
            continue
        where = f"dim {d} ({dim.custom})"
        if not dim.custom.startswith(MSCCL):
            raise UsageError(f"{where}: msccl-auto runs whole collectives; name a dim's files with msccl:")
        if collective.op not in ("all_reduce", "reduce_scatter", "all_gather"):
            raise UsageError(f"{where}: a dim's custom stages run all_reduce, reduce_scatter and all_gather")
        if topology.flat:
            raise UsageError(f"{where}: custom stages run on per-dim topologies, not nccl dims")
        files: dict[str, Custom] = {}
        for path in dim.custom[len(MSCCL) :].split(PLUS):
            algo = read_algorithm(path)
            if algo.ngpus != dim.npus:
                raise UsageError(f"{path}: it runs on {algo.ngpus} GPUs, dim {d} has {dim.npus} NPUs")
            op = next((o for o, name in STAGE_OPS.items() if name == algo.collective.op), None)
            if op is None or op in files:
                why = "a second file of" if op in files else "no dim stage computes"
                raise UsageError(f"{path}: {why} {algo.coll} on dim {d}")
            files[op] = load(path, replace(collective, op=STAGE_OPS[op]), dim.npus, prove)
            stage_rounds(files[op])
        for op in _stage_ops(collective):
            if op not in files and not (op == AR and RS in files and AG in files):
                names = ", ".join(sorted(f.algo.coll for f in files.values()))
                raise UsageError(
                    f"{where}: its {STAGE_NAMES[op]} stages need a {STAGE_OPS[op]} file "
                    f"(given: {names}); write msccl:RS.xml+AG.xml"
                )
        out[d] = files
    return out


def _stage_ops(collective: Collective) -> tuple[str, ...]:
    """The stage ops a dim needs files for (an all-reduce's AR stage may run its RS and AG files)."""
    if collective.op == "reduce_scatter":
        return (RS,)
    if collective.op == "all_gather":
        return (AG,)
    return (RS, AG)


def _storage(custom: Custom, gpu: int, ref: Ref | None) -> tuple[int, int]:
    """Storage chunks ``[a, b)`` a step's chunks are, in place."""
    assert ref is not None
    view = views(custom.algo, gpu, True)[ref.buffer]
    return view.base + ref.offset, view.base + ref.offset + ref.count


def _mappable(custom: Custom) -> None:
    """Refuse in one line a file whose steps do not map onto a stage's steps."""
    algo, path = custom.algo, custom.source
    if not algo.inplace:
        raise UsageError(f"{path}: a dim's custom stage runs in place; the file is out of place only")
    if algo.nchunksperloop % algo.ngpus:
        raise UsageError(f"{path}: a dim's stage needs nchunksperloop a multiple of ngpus ({algo.ngpus})")
    for prog in custom.progs:
        for op in prog.ops():
            at = f"{path}: GPU {prog.gpu} threadblock {op.tb} step {op.step}"
            if op.type not in MAPPED:
                raise UsageError(
                    f"{at}: a dim's stage maps s, r, rrc, rcs, rrcs and nop steps, not {op.type}"
                )
            if any(
                ref is not None and views(algo, prog.gpu, True)[ref.buffer].storage != DATA
                for ref in (op.src, op.dst)
            ):
                raise UsageError(f"{at}: a dim's stage uses no scratch buffer")
            if (
                op.src is not None
                and op.dst is not None
                and _storage(custom, prog.gpu, op.src) != _storage(custom, prog.gpu, op.dst)
            ):
                raise UsageError(f"{at}: a dim's stage maps {op.type} with source = destination only")


_ROUNDS: dict[int, tuple[tuple, list[list[RankRound]]]] = {}  # id(progs) -> (progs, its rounds)


def stage_rounds(custom: Custom) -> list[list[RankRound]]:
    """The file's ops in rounds every GPU runs in lock step: per round, per GPU, its messages.

    In a round a threadblock sends what its next sends (``s``, or the send of an ``rcs`` or
    ``rrcs`` received in an earlier round) and then takes at most one receive; a message is in
    a round only if its receive is too, so each send leaves with the receive it pairs with (a
    stage's step waits for its sends). What a round receives is stored when it ends, so a send
    reads what earlier rounds left. A step waiting for another starts a round after it ended.
    Sends and receives are storage chunk ranges with (peer, channel, place) to order them.
    """
    key = id(custom.progs)
    if key in _ROUNDS and _ROUNDS[key][0] is custom.progs:  # (held, so no other file takes its id)
        return _ROUNDS[key][1]
    _mappable(custom)
    progs = custom.progs
    pc = [[0] * len(p.threadblocks) for p in progs]
    sending = [[False] * len(p.threadblocks) for p in progs]  # a fused op received, its send due
    done: dict[tuple[int, int, int], int] = {}
    rounds: list[list[RankRound]] = []
    total = sum(len(tb) for p in progs for tb in p.threadblocks)
    r = 0

    def ready(g: int, op: Op) -> bool:
        return all(done.get((g, u, k), r) < r for u, k in op.waits)

    while len(done) < total:
        plans: dict[tuple[int, int], list[tuple[Op, bool]]] = {}  # (gpu, tb) -> (op, sends)
        for g, prog in enumerate(progs):
            for t, ops in enumerate(prog.threadblocks):
                i = pc[g][t]
                while i < len(ops) and ops[i].type == NOP and not sending[g][t] and ready(g, ops[i]):
                    done[g, t, i] = r - 1
                    i += 1
                pc[g][t] = i
                items: list[tuple[Op, bool]] = []
                due = sending[g][t]
                while i < len(ops) and (due or (ops[i].type == SEND and ready(g, ops[i]))):
                    items.append((ops[i], True))
                    i, due = i + 1, False
                sent = [_storage(custom, g, op.src or op.dst) for op, _ in items]
                if i < len(ops) and ops[i].recv_peer >= 0 and not due and ready(g, ops[i]):
                    a, b = _storage(custom, g, ops[i].dst)
                    if not any(a < y and x < b for x, y in sent):
                        items.append((ops[i], False))
                plans[g, t] = items
        changed = True
        while changed:  # a message whose other side is not in the round leaves it, and what follows
            changed = False
            posted = {(connection(op, g, s), s) for (g, _), items in plans.items() for op, s in items}
            for items_key, items in plans.items():
                g = items_key[0]
                cut = next(
                    (n for n, (op, s) in enumerate(items) if (connection(op, g, s), not s) not in posted),
                    None,
                )
                if cut is not None:
                    del items[cut:]
                    changed = True
        if not any(plans.values()):
            raise UsageError(
                f"{custom.source}: its steps do not map onto a dim's stage (no message can pair in "
                f"round {r}); a dim's stage needs each send to leave with the receive it pairs with"
            )
        ranks: list[RankRound] = [([], [], []) for _ in progs]
        for (g, t), items in plans.items():
            for op, s in items:
                if s:
                    ranks[g][0].append(
                        (op.send_peer, op.chan, op.send_seq, *_storage(custom, g, op.src or op.dst))
                    )
                    sending[g][t] = False
                    done[g, t, op.step] = r
                    pc[g][t] = op.step + 1
                else:
                    reduces = op.type in (RECV_REDUCE_COPY, RECV_REDUCE_COPY_SEND)
                    ranks[g][2 if reduces else 1].append(
                        (op.recv_peer, op.chan, op.recv_seq, *_storage(custom, g, op.dst))
                    )
                    if op.send_peer >= 0:
                        sending[g][t] = True
                        pc[g][t] = op.step
                    else:
                        done[g, t, op.step] = r
                        pc[g][t] = op.step + 1
        rounds.append(ranks)
        r += 1
    _ROUNDS[key] = (custom.progs, rounds)
    return rounds


def stage_steps(custom: Custom, c: int, lo: int, hi: int) -> list[Step]:
    """GPU c's rounds (`stage_rounds`) as a stage's steps on ``[lo, hi)`` (`algorithms.plan`'s form).

    The region is split in P blocks (`block_bounds`, block c the rank's after a reduce-scatter)
    and each block in C / P chunks. A round is a step of its reduced receives, then a step of its
    copied ones (received apart, stored once its sends are done); each send goes with its
    receiver's kind. Messages of a step are ordered by (peer, channel, place) on both sides.
    """
    bounds = _chunk_bounds(custom, lo, hi)
    rounds = stage_rounds(custom)
    steps = []
    for ranks in rounds:
        sends, copies, reduces = ranks[c]
        for mode, recvs, kind in ((REDUCE, reduces, 2), (COPY, copies, 1)):
            outs = [m for m in sends if _received(ranks[m[0]][kind], c, m)]
            if outs or recvs:
                steps.append(
                    Step(
                        tuple((q, bounds[a], bounds[b]) for q, _, _, a, b in sorted(outs)),
                        tuple((q, bounds[a], bounds[b]) for q, _, _, a, b in sorted(recvs)),
                        mode,
                    )
                )
    return steps


def _chunk_bounds(custom: Custom, lo: int, hi: int) -> list[int]:
    """Where each storage chunk of a stage on ``[lo, hi)`` starts (and the region's end): `stage_steps`."""
    algo = custom.algo
    p, k = algo.ngpus, algo.nchunksperloop // algo.ngpus
    blocks = block_bounds(lo, hi, p)
    return [x for b in range(p) for x in block_bounds(blocks[b], blocks[b + 1], k)[:-1]] + [hi]


def stage_levels(custom: Custom, lo: int, hi: int) -> list[list[Step]]:
    """Every GPU's messages level by level, as its programs send them: per GPU, a step per level.

    As `timing.programs` runs a file, a step starts once its threadblock's previous step has
    ended (a send ends when its message has arrived), its waits have, and the message it
    receives has arrived. A message sent at level L arrives at L + 1: a step's level is the
    longest such chain of messages before it. Level L of a GPU is a step of the messages it
    sends at L (`Step.sends`) and of those it receives that were sent at L (`Step.recvs`, empty
    where it has none), so every NPU's links time the levels in turn, each NPU waiting for what
    it receives (`timing.routes.NpuRoutes.custom_stage`). Unlike `stage_rounds` (the data's
    steps), a send does not wait for its receiver's turn: a sender ahead of its peer runs ahead.
    """
    _mappable(custom)
    bounds, progs = _chunk_bounds(custom, lo, hi), custom.progs
    ends: dict[tuple[int, int, int], int] = {}
    sent: dict[tuple[int, int, int, int], int] = {}
    messages = []
    for g, t, i in custom.order:  # (every step after those it needs: `program.schedule`)
        op = progs[g].threadblocks[t][i]
        level = max([ends[g, t, i - 1] if i else 0] + [ends[g, u, k] for u, k in op.waits])
        if op.recv_peer >= 0:
            level = max(level, sent[connection(op, g, False)] + 1)
        ends[g, t, i] = level
        if op.send_peer >= 0:
            sent[connection(op, g, True)] = level
            messages.append((level, g, op.send_peer, *_storage(custom, g, op.src or op.dst)))
            ends[g, t, i] = level + 1
    levels = 1 + max((m[0] for m in messages), default=-1)
    out: list[list[tuple[list, list]]] = [[([], []) for _ in range(levels)] for _ in progs]
    for level, g, q, a, b in sorted(messages):
        out[g][level][0].append((q, bounds[a], bounds[b]))
        out[q][level][1].append((g, bounds[a], bounds[b]))
    return [[Step(tuple(sends), tuple(recvs), COPY) for sends, recvs in gpu] for gpu in out]


def _received(recvs: list, src: int, send: tuple) -> bool:
    """Whether a send of GPU src (peer, channel, place, ...) is among its peer's receives."""
    return any(r[0] == src and r[1:3] == send[1:3] for r in recvs)
