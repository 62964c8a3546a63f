"""Each GPU's program: its threadblocks' operations in order, with peers, chunk ranges and waits.

An MSCCL algorithm becomes one `GpuProgram` per GPU. An `Op` is a step ready to run: what it
reads and writes (a `Ref`: a buffer, an offset and a count in chunks), whom it sends to and
receives from on which channel, its place in that connection's order (the k-th send from a to
b on channel c pairs with the k-th receive on b from a on c), and the steps of its own GPU it
waits for. A wait is resolved as RCCL's runtime resolves it: a step signals only when it has
``hasdep`` (and is not a nop), and a step waiting for step s of a threadblock waits for the
first signalling step at or after s.

This is what a runtime needs and no more: `execute` runs the programs of all GPUs in one process
on numpy or symbolic data, `timing` times them, and the emulator (issue 44, part 2) runs each
rank's program over MPI. `schedule` is the abstract execution: it runs every threadblock as far
as it can, sends buffered and receives blocking, and returns an order every runtime may follow,
or the threadblocks that wait forever.

Buffers: ``i``, ``o`` and ``s`` are views of a GPU's memory (`views`). Out of place, the input
and the output are two storages; in place, they share one storage of C chunks and the smaller
of them is the GPU's block of it (an all-gather's input is block ``rank`` of its output, a
reduce-scatter's output block ``rank`` of its input), as msccl-tools lays them out.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from .ir import INPUT, NOP, OUTPUT, READS_SRC, SCRATCH, WRITES_DST, Algorithm, Collective

IN, OUT, SCR, DATA = "in", "out", "scratch", "data"  # storages of a GPU's memory


@dataclass(frozen=True)
class Ref:
    """Chunks ``[offset, offset + count)`` of a buffer (``i``, ``o`` or ``s``)."""

    buffer: str
    offset: int
    count: int


@dataclass(frozen=True)
class Op:
    """One step of a threadblock, ready to run.

    Attributes:
        tb: its threadblock.
        step: its index in the threadblock.
        type: the MSCCL step type (s, r, rcs, rrs, rrc, rrcs, cpy, re, nop).
        send_peer: the GPU it sends to (-1: it does not send).
        recv_peer: the GPU it receives from (-1: it does not receive).
        chan: the threadblock's channel.
        src: the local chunks it reads (None: none).
        dst: the local chunks it writes (None: none); a ``re`` reads them too.
        count: chunks it moves.
        waits: (threadblock, step) of this GPU that must be done before it starts.
        send_seq: its place among the sends to `send_peer` on `chan` (-1: no send).
        recv_seq: its place among the receives from `recv_peer` on `chan` (-1: no receive).
        signals: whether a step waiting for it can go on once it is done.
    """

    tb: int
    step: int
    type: str
    send_peer: int
    recv_peer: int
    chan: int
    src: Ref | None
    dst: Ref | None
    count: int
    waits: tuple[tuple[int, int], ...]
    send_seq: int
    recv_seq: int
    signals: bool


@dataclass(frozen=True)
class GpuProgram:
    """One GPU's threadblocks, each a tuple of `Op` in order."""

    gpu: int
    threadblocks: tuple[tuple[Op, ...], ...]

    def ops(self):
        """Every op, threadblock by threadblock."""
        return (op for tb in self.threadblocks for op in tb)


def signal_step(algo: Algorithm, gpu: int, tb: int, step: int) -> int | None:
    """The step of threadblock `tb` whose signal a wait for `step` of it waits for; None: never."""
    steps = algo.gpus[gpu].threadblocks[tb].steps
    return next((k for k in range(step, len(steps)) if steps[k].hasdep and steps[k].type != NOP), None)


def programs(algo: Algorithm) -> tuple[GpuProgram, ...]:
    """Every GPU's program. The algorithm must have passed `check.structure`."""
    out = []
    for gpu in algo.gpus:
        tbs = []
        for tb in gpu.threadblocks:
            ops, sends, recvs = [], 0, 0
            for k, st in enumerate(tb.steps):
                waits: tuple[tuple[int, int], ...] = ()
                if st.depid >= 0:
                    target = signal_step(algo, gpu.id, st.depid, st.deps)
                    waits = ((st.depid, -1 if target is None else target),)
                ops.append(
                    Op(
                        tb=tb.id,
                        step=k,
                        type=st.type,
                        send_peer=tb.send if st.sends else -1,
                        recv_peer=tb.recv if st.receives else -1,
                        chan=tb.chan,
                        src=Ref(st.srcbuf, st.srcoff, st.cnt) if st.type in READS_SRC else None,
                        dst=Ref(st.dstbuf, st.dstoff, st.cnt) if st.type in WRITES_DST else None,
                        count=st.cnt,
                        waits=waits,
                        send_seq=sends if st.sends else -1,
                        recv_seq=recvs if st.receives else -1,
                        signals=st.hasdep and st.type != NOP,
                    )
                )
                sends += st.sends
                recvs += st.receives
            tbs.append(tuple(ops))
        out.append(GpuProgram(gpu.id, tuple(tbs)))
    return tuple(out)


@dataclass(frozen=True)
class View:
    """Where a buffer lives: `size` chunks of a storage from chunk `base`."""

    storage: str
    base: int
    size: int


def layout(
    coll: Collective, nchunks: int, ngpus: int, gpu: int, inplace: bool, s_chunks: int
) -> dict[str, View]:
    """The buffers ``i``, ``o`` and ``s`` of a GPU as views of its storages (module doc)."""
    block = nchunks // ngpus
    n_in, n_out = coll.chunks(nchunks, ngpus)
    scratch = View(SCR, 0, s_chunks)
    if not inplace:
        return {INPUT: View(IN, 0, n_in), OUTPUT: View(OUT, 0, n_out), SCRATCH: scratch}
    i_base = 0 if coll.input_whole else gpu * block
    o_base = 0 if coll.output_whole else gpu * block
    return {INPUT: View(DATA, i_base, n_in), OUTPUT: View(DATA, o_base, n_out), SCRATCH: scratch}


def views(algo: Algorithm, gpu: int, inplace: bool) -> dict[str, View]:
    """A GPU's buffers as views of its storages (`layout`)."""
    return layout(algo.collective, algo.nchunksperloop, algo.ngpus, gpu, inplace, algo.gpus[gpu].s_chunks)


def storage_chunks(algo: Algorithm, gpu: int, inplace: bool) -> dict[str, int]:
    """Chunks of each storage of a GPU's memory."""
    sizes: dict[str, int] = {}
    for v in views(algo, gpu, inplace).values():
        sizes[v.storage] = max(sizes.get(v.storage, 0), v.base + v.size)
    return sizes


def connection(op: Op, gpu: int, sending: bool) -> tuple[int, int, int, int]:
    """The message an op sends or receives: (from GPU, to GPU, channel, place in order)."""
    if sending:
        return gpu, op.send_peer, op.chan, op.send_seq
    return op.recv_peer, gpu, op.chan, op.recv_seq


@dataclass(frozen=True)
class Schedule:
    """An order every runtime may follow, or where the threadblocks wait forever.

    Attributes:
        order: (gpu, threadblock, step) in an order that respects every wait and message.
        stuck: (gpu, threadblock) -> the step it waits at forever; empty when all finish.
    """

    order: tuple[tuple[int, int, int], ...]
    stuck: dict[tuple[int, int], int]


def ready(prog: GpuProgram, op: Op, done: list[int], posted: set) -> bool:
    """Whether an op may run: its waits are done and the message it receives was sent."""
    if any(s < 0 or done[t] <= s for t, s in op.waits):
        return False
    return op.recv_peer < 0 or connection(op, prog.gpu, False) in posted


def schedule(progs: tuple[GpuProgram, ...]) -> Schedule:
    """Run every threadblock as far as it can (sends buffered, receives blocking): `Schedule`.

    Whether every threadblock finishes does not depend on the order tried: a step that may run
    stays able to run until it does (nothing is ever taken back), so one run decides it.
    """
    done = [[0] * len(p.threadblocks) for p in progs]  # steps finished per threadblock
    posted: set[tuple[int, int, int, int]] = set()
    receiver: dict[tuple[int, int, int], tuple[int, int]] = {}
    waiters: dict[tuple[int, int], list[tuple[int, int]]] = {}
    for p in progs:
        for op in p.ops():
            if op.recv_peer >= 0:
                receiver[(op.recv_peer, p.gpu, op.chan)] = (p.gpu, op.tb)
            for t, _ in op.waits:
                waiters.setdefault((p.gpu, t), []).append((p.gpu, op.tb))
    order: list[tuple[int, int, int]] = []
    queue = deque((p.gpu, t) for p in progs for t in range(len(p.threadblocks)))
    while queue:
        g, t = queue.popleft()
        prog, tb = progs[g], progs[g].threadblocks[t]
        moved = False
        while done[g][t] < len(tb) and ready(prog, tb[done[g][t]], done[g], posted):
            op = tb[done[g][t]]
            order.append((g, t, op.step))
            done[g][t] += 1
            moved = True
            if op.send_peer >= 0:
                posted.add(connection(op, g, True))
                if (g, op.send_peer, op.chan) in receiver:
                    queue.append(receiver[(g, op.send_peer, op.chan)])
        if moved:
            queue.extend(waiters.get((g, t), ()))
    stuck = {
        (p.gpu, t): done[p.gpu][t]
        for p in progs
        for t, tb in enumerate(p.threadblocks)
        if done[p.gpu][t] < len(tb)
    }
    return Schedule(tuple(order), stuck)
