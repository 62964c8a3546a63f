"""Writing MSCCL algorithms: a builder that derives the waits, and the built-in algorithms as MSCCL-IR.

`Builder` takes each GPU's steps in an order the GPU may run them and works out the rest the way
msccl-tools does: a step waits for the last step of another threadblock that wrote a chunk it
touches, or read a chunk it writes (so no two threadblocks race), a wait already implied by an
earlier step of the threadblock is dropped, every wait past the first becomes a ``nop`` step
before it (one wait per step, RCCL's rule), and every step waited for gets ``hasdep``.

`builtin` writes ring, direct and halving-doubling exactly as `algorithms.plan` moves data:
P chunks, chunk c being the block rank c owns after a reduce-scatter; each plan step becomes its
sends then its receives (``rrc`` where the plan reduces, ``r`` where it copies), one threadblock
per peer pair (the ring: send to the next rank, receive from the previous).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..algorithms import REDUCE as PLAN_REDUCE
from ..algorithms import plan
from ..cost import AG, AR, RS
from ..errors import UsageError
from ..topology import is_power_of_two
from .ir import (
    ANY_BYTES,
    COLLECTIVES,
    INPUT,
    NOP,
    OUTPUT,
    READS_SRC,
    RECV,
    RECV_REDUCE_COPY,
    REDUCE,
    SEND,
    WRITES_DST,
    Algorithm,
    Gpu,
    Step,
    Threadblock,
)
from .program import Ref, layout

OPS = {
    "reduce_scatter": (RS, "reduce_scatter", INPUT),
    "all_gather": (AG, "allgather", OUTPUT),
    "all_reduce": (AR, "allreduce", INPUT),
}
BUILTINS = ("ring", "direct", "halving_doubling")
MAX_EXPORT_NPUS = 64  # direct: P(P-1) threadblocks, within what the checker takes


@dataclass
class _Tb:
    send: int
    recv: int
    chan: int
    steps: list[dict] = field(default_factory=list)
    waited: dict[int, int] = field(default_factory=dict)  # threadblock -> the last step waited for


class Builder:
    """An MSCCL algorithm written step by step; waits, nops and ``hasdep`` are derived (module doc).

    Args:
        name: the algorithm's name.
        coll: the collective (`ir.COLLECTIVES`).
        ngpus: GPUs.
        nchunks: chunks per loop (C).
        inplace: whether it runs in place (the only placement it declares).
        proto: LL, LL128 or Simple.
    """

    def __init__(
        self, name: str, coll: str, ngpus: int, nchunks: int, inplace: bool = True, proto: str = "Simple"
    ):
        self.name, self.coll, self.ngpus, self.nchunks = name, coll, ngpus, nchunks
        self.inplace, self.proto = inplace, proto
        self.tbs: list[list[_Tb]] = [[] for _ in range(ngpus)]
        self.tb_of: list[dict[tuple[int, int, int], int]] = [{} for _ in range(ngpus)]
        self.last_write: list[dict[tuple[str, int], tuple[int, int]]] = [{} for _ in range(ngpus)]
        self.readers: list[dict[tuple[str, int], list[tuple[int, int]]]] = [{} for _ in range(ngpus)]

    def threadblock(self, gpu: int, send: int = -1, recv: int = -1, chan: int = 0) -> int:
        """The threadblock of a GPU with these peers and channel, made on first use."""
        key = (send, recv, chan)
        if key not in self.tb_of[gpu]:
            self.tb_of[gpu][key] = len(self.tbs[gpu])
            self.tbs[gpu].append(_Tb(send, recv, chan))
        return self.tb_of[gpu][key]

    def _chunks(self, gpu: int, ref: Ref):
        view = layout(COLLECTIVES[self.coll], self.nchunks, self.ngpus, gpu, self.inplace, 0)[ref.buffer]
        return ((view.storage, view.base + c) for c in range(ref.offset, ref.offset + ref.count))

    def _needs(self, gpu: int, tb: int, reads: list[Ref], writes: list[Ref]) -> dict[int, int]:
        """Per other threadblock, the last of its steps this step must wait for (hazards)."""
        needs: dict[int, int] = {}

        def need(who: tuple[int, int]) -> None:
            if who[0] != tb:
                needs[who[0]] = max(needs.get(who[0], -1), who[1])

        for ref in reads + writes:
            for key in self._chunks(gpu, ref):
                if key in self.last_write[gpu]:
                    need(self.last_write[gpu][key])
        for ref in writes:
            for key in self._chunks(gpu, ref):
                for who in self.readers[gpu].get(key, ()):
                    need(who)
        waited = self.tbs[gpu][tb].waited
        return {u: s for u, s in needs.items() if waited.get(u, -1) < s}

    def step(
        self, gpu: int, tb: int, type_: str, src: Ref | None = None, dst: Ref | None = None, after=()
    ) -> int:
        """Append a step (``src`` for what it reads, ``dst`` for what it writes); its index.

        `after` holds more (threadblock, step) of the GPU it must wait for, beyond the data's.
        """
        reads = [
            r for r, used in ((src, type_ in READS_SRC), (dst, type_ == REDUCE)) if used and r is not None
        ]
        writes = [dst] if dst is not None and type_ in WRITES_DST else []
        found = self._needs(gpu, tb, reads, writes)
        for u, s in after:
            if u != tb and self.tbs[gpu][tb].waited.get(u, -1) < s:
                found[u] = max(found.get(u, -1), s)
        needs = sorted(found.items())
        block = self.tbs[gpu][tb]
        for u, s in needs[1:]:
            self._append(gpu, tb, NOP, None, None, (u, s))
        index = self._append(gpu, tb, type_, src, dst, needs[0] if needs else None)
        for ref in reads:
            for key in self._chunks(gpu, ref):
                self.readers[gpu].setdefault(key, []).append((tb, index))
        for ref in writes:
            for key in self._chunks(gpu, ref):
                self.last_write[gpu][key] = (tb, index)
                self.readers[gpu].pop(key, None)
        for u, s in needs:
            block.waited[u] = s
        return index

    def _append(self, gpu: int, tb: int, type_: str, src: Ref | None, dst: Ref | None, dep) -> int:
        steps = self.tbs[gpu][tb].steps
        ref = src or dst
        cnt = 0 if ref is None else ref.count
        src = src or dst
        dst = dst or src
        steps.append(
            {
                "s": len(steps),
                "type": type_,
                "srcbuf": src.buffer if src else INPUT,
                "srcoff": src.offset if src else -1,
                "dstbuf": dst.buffer if dst else OUTPUT,
                "dstoff": dst.offset if dst else -1,
                "cnt": cnt,
                "depid": dep[0] if dep else -1,
                "deps": dep[1] if dep else -1,
                "hasdep": False,
            }
        )
        if dep:
            self.tbs[gpu][dep[0]].steps[dep[1]]["hasdep"] = True
        return len(steps) - 1

    def send(self, gpu: int, tb: int, ref: Ref, after=()) -> int:
        """``s``: send chunks to the threadblock's send peer (after `after`, as `step`)."""
        return self.step(gpu, tb, SEND, src=ref, after=after)

    def recv(self, gpu: int, tb: int, ref: Ref, reduce: bool = False) -> int:
        """``r`` (or ``rrc`` with `reduce`: reduced into the chunks) from the threadblock's recv peer."""
        if reduce:
            return self.step(gpu, tb, RECV_REDUCE_COPY, src=ref, dst=ref)
        return self.step(gpu, tb, RECV, dst=ref)

    def algorithm(self) -> Algorithm:
        """The algorithm written so far; buffers declared as large as the steps use them."""
        gpus = []
        for g, tbs in enumerate(self.tbs):
            used = {INPUT: 0, OUTPUT: 0, "s": 0}
            for tb in tbs:
                for st in tb.steps:
                    if st["type"] in READS_SRC:
                        used[st["srcbuf"]] = max(used[st["srcbuf"]], st["srcoff"] + st["cnt"])
                    if st["type"] in WRITES_DST:
                        used[st["dstbuf"]] = max(used[st["dstbuf"]], st["dstoff"] + st["cnt"])
            threadblocks = tuple(
                Threadblock(t, tb.send, tb.recv, tb.chan, tuple(Step(**st) for st in tb.steps))
                for t, tb in enumerate(tbs)
            )
            gpus.append(Gpu(g, used[INPUT], used[OUTPUT], used["s"], threadblocks))
        channels = max((tb.chan + 1 for tbs in self.tbs for tb in tbs), default=1)
        return Algorithm(
            self.name,
            self.coll,
            self.ngpus,
            channels,
            self.nchunks,
            self.proto,
            self.inplace,
            not self.inplace,
            tuple(gpus),
            min_bytes=0,
            max_bytes=ANY_BYTES,
        )


def builtin(algorithm: str, op: str, npus: int, both_ways: bool = False) -> Algorithm:
    """A built-in algorithm's stage on `npus` NPUs as MSCCL-IR: P chunks, in place (module doc).

    Args:
        algorithm: ring, direct or halving_doubling (``hd``).
        op: reduce_scatter, all_gather or all_reduce.
        npus: NPUs of the dim (halving-doubling: a power of two).
        both_ways: the ring both ways round (`cost.ring_both_ways`), as it runs on a Ring or a
            FullyConnected dim: 2P chunks, the first half of each block clockwise on channel 0,
            the second half counter-clockwise on channel 1.
    """
    algorithm = {"hd": "halving_doubling", "halving-doubling": "halving_doubling"}.get(algorithm, algorithm)
    if algorithm not in BUILTINS:
        raise UsageError(f"unknown algorithm {algorithm!r} to export; use one of {', '.join(BUILTINS)}")
    if op not in OPS:
        raise UsageError(f"cannot export {op!r} as MSCCL-IR; use one of {', '.join(OPS)}")
    if not 2 <= npus <= MAX_EXPORT_NPUS:
        raise UsageError(f"an exported algorithm takes 2 to {MAX_EXPORT_NPUS} NPUs, got {npus}")
    if algorithm == "halving_doubling" and not is_power_of_two(npus):
        raise UsageError(f"halving_doubling needs a power-of-two number of NPUs, got {npus}")
    stage, coll, buffer = OPS[op]
    both = both_ways and algorithm == "ring"
    chunks = 2 * npus if both else npus
    b = Builder(f"{algorithm}{'_2ch' if both else ''}_{op}_{npus}", coll, npus, chunks)
    for c in range(npus):
        # a ring's k-th message of a step is on channel k: 0 to the next NPU, 1 to the previous
        ring: tuple[int, ...] = ()
        if algorithm == "ring":
            ring = (b.threadblock(c, (c + 1) % npus, (c - 1) % npus, 0),)
        ring += (b.threadblock(c, (c - 1) % npus, (c + 1) % npus, 1),) if both else ()
        for st in plan(algorithm, stage, npus, c, 0, chunks, both):
            for k, (peer, lo, hi) in enumerate(st.sends):
                b.send(c, ring[k] if ring else b.threadblock(c, peer, peer), Ref(buffer, lo, hi - lo))
            for k, (peer, lo, hi) in enumerate(st.recvs):
                tb = ring[k] if ring else b.threadblock(c, peer, peer)
                b.recv(c, tb, Ref(buffer, lo, hi - lo), reduce=st.mode == PLAN_REDUCE)
    return b.algorithm()
