"""A symmetric collective's data movement on one rank, as one precompiled program.

With NPUs alike under a sharing rule (`timing.planner.Plan.programmed`) every rank's stages end
when one NPU's view of the links says, the same view on every rank: the data only has to move.
So the model's run (memoised by the driver, `run.collective`) gives the order in which stages
start, and this rank runs their steps one after another in that order: each step's messages
posted at once, waited for together, the received data reduced or copied into place. That is
the floor of one message per emulated step (`scripts/bench_overhead.py`), with nothing per step
but the calls and the numpy views' slicing.

Deadlock-free because every rank runs the same sequence of (stage, step), the model's: a step's
peers run that step at the same place in theirs, and MPI matches the messages of one pair and
tag in order. Data dependencies hold because a chunk's stage starts after its previous one ends,
so it comes later in the start order. Runs the planner does not call symmetric take the
general path (`mpi.transport.MpiTransport.start`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import numpy as np
from mpi4py import MPI

from ..algorithms import COPY, REDUCE, Step, plan, plan_all_to_all
from ..collectives import Collective, Stage, owned_region
from ..cost import A2A, AG, RS
from ..engine import StageRun
from ..topology import Topology

# one step: its sub-communicator, mode, receives (peer, start, stop, scratch start, scratch stop)
# and sends (peer, start, stop), in absolute elements of the collective's buffer
_Step = tuple[MPI.Comm, str, tuple[tuple[int, int, int, int, int], ...], tuple[tuple[int, int, int], ...]]


def stage_steps(
    topology: Topology, collective: Collective, stage: Stage, coord: int, lo: int, hi: int
) -> list[Step]:
    """The steps of a stage on ``[lo, hi)`` for the NPU at `coord` of its dim (`algorithms`)."""
    dim = topology.dims[stage.dim]
    if stage.op == A2A:
        stride = topology.group_strides(collective.dims)[stage.dim]
        return plan_all_to_all(dim.npus, coord, stride, topology.group_npus(collective.dims), lo, hi)
    return plan(dim.algorithm, stage.op, dim.npus, coord, lo, hi)


class Program:
    """Every step of one symmetric collective on this rank, in waves of the model's stage order.

    A wave holds at most one stage per dim, as a dim runs one stage at a time in the model (per
    slot): each dim's next stage in the model's start order, once its chunk's previous stage
    is done (in an earlier wave). Its steps go in rounds: round j posts step j of each of its
    stages at once and waits for all of them. Every rank forms the same waves, and the stage of
    the model's order that comes first is always free to join, so the waves take every stage.

    Args:
        topology: the network.
        coords: this rank's coordinate in each dim.
        comms: each dim's sub-communicator.
        collective: what runs.
        regions: every chunk's region stack as the collective opens (`MpiTransport.open`).
        order: the model's stage runs in start order.
    """

    __slots__ = ("waves", "scratch_elems", "where", "_bound")

    def __init__(
        self,
        topology: Topology,
        coords: Sequence[int],
        comms: Sequence[MPI.Comm],
        collective: Collective,
        regions: list[list[tuple[int, int]]],
        order: Sequence[StageRun],
    ):
        stacks = [list(stack) for stack in regions]
        self._bound: tuple | None = None  # (buffer, scratch, waves of persistent requests): `bind`
        steps: list[list[Step]] = []
        # (chunk, op, dim, peers in the dim) of each stage: what a wait names
        self.where: list[tuple[int, str, int, tuple[int, ...]]] = []
        for run in order:  # (a chunk's regions narrow and widen in the order its stages start)
            s = run.stage
            dim, stack = topology.dims[s.dim], stacks[s.chunk]
            if s.op == AG:
                stack.pop()
            lo, hi = stack[-1]
            steps.append(stage_steps(topology, collective, s, coords[s.dim], lo, hi))
            if s.op == RS:
                stack.append(owned_region(dim.npus, coords[s.dim], lo, hi))
            peers = sorted({p for st in steps[-1] for p, _, _ in st.recvs + st.sends})
            self.where.append((s.chunk, s.op, s.dim, tuple(peers)))
        queues: list[list[int]] = [[] for _ in topology.dims]
        for i, run in enumerate(order):
            queues[run.stage.dim].append(i)
        heads = [0] * len(queues)
        done = [0] * len(regions)  # stages of each chunk in earlier waves
        self.waves: list[tuple[tuple[int, ...], tuple[tuple[_Step, ...], ...]]] = []
        self.scratch_elems = 0
        while True:
            wave = []
            for d, queue in enumerate(queues):
                if heads[d] < len(queue):
                    i = queue[heads[d]]
                    if order[i].stage.index == done[order[i].stage.chunk]:
                        wave.append(i)
            if not wave:
                break
            for i in wave:
                heads[order[i].stage.dim] += 1
                done[order[i].stage.chunk] += 1
            self.waves.append(
                (
                    tuple(wave),
                    self._rounds([steps[i] for i in wave], [order[i].stage.dim for i in wave], comms),
                )
            )
        assert sum(len(w) for w, _ in self.waves) == len(order), "a stage joined no wave"

    def _rounds(
        self, wave: list[list[Step]], dims: list[int], comms: Sequence[MPI.Comm]
    ) -> tuple[tuple[_Step, ...], ...]:
        """A wave's rounds, each receive given its own scratch (copies land in place)."""
        rounds = []
        for j in range(max(len(steps) for steps in wave)):
            compiled, at = [], 0
            for steps, d in zip(wave, dims):
                if j >= len(steps):
                    continue
                st, recvs = steps[j], []
                for peer, a, b in st.recvs:
                    span = 0 if st.mode == COPY else b - a
                    recvs.append((peer, a, b, at, at + span))
                    at += span
                compiled.append((comms[d], st.mode, tuple(recvs), tuple(st.sends)))
            self.scratch_elems = max(self.scratch_elems, at)
            rounds.append(tuple(compiled))
        return tuple(rounds)

    def bind(self, buf: np.ndarray, scratch: np.ndarray, tag: int) -> None:
        """Make every round's persistent requests and reduction views on these buffers (once per pair).

        Each round becomes its requests (``Recv_init`` and ``Send_init``, started together), the
        (place, received) views it reduces and those it copies into place.
        """
        if self._bound is not None and self._bound[0] is buf and self._bound[1] is scratch:
            return
        self.free()
        waves = []
        for stages, rounds in self.waves:
            bound = []
            for steps in rounds:
                reqs: list[MPI.Prequest] = []
                reduces: list[tuple[np.ndarray, np.ndarray]] = []
                swaps: list[tuple[np.ndarray, np.ndarray]] = []
                for comm, mode, recvs, sends in steps:
                    for peer, a, b, sa, sb in recvs:
                        into = buf[a:b] if mode == COPY else scratch[sa:sb]
                        reqs.append(comm.Recv_init(into, peer, tag))
                        if mode != COPY:
                            (reduces if mode == REDUCE else swaps).append((buf[a:b], into))
                    reqs += [comm.Send_init(buf[a:b], peer, tag) for peer, a, b in sends]
                bound.append((reqs, tuple(reduces), tuple(swaps)))
            waves.append((list(stages), tuple(bound)))
        self._bound = (buf, scratch, tuple(waves))

    @property
    def buffer(self) -> np.ndarray | None:
        """The collective's buffer it is bound to (`bind`), if any."""
        return None if self._bound is None else self._bound[0]

    def free(self) -> None:
        """Free the persistent requests of `bind` (the program may be bound again)."""
        if self._bound is not None:
            for _, rounds in self._bound[2]:
                for reqs, _, _ in rounds:
                    for req in reqs:
                        req.Free()
        self._bound = None

    def run(self, ufunc: np.ufunc, wait: Callable[[list[MPI.Request], list[int]], None]) -> np.ndarray:
        """Move and reduce the data of every stage as bound (`bind`), wave by wave.

        `wait(requests, stages)` completes a round's requests (stages: the wave's places in the
        order, whose peers a stalled or failed wait names).

        Returns:
            Each stage's wall start and end (perf_counter seconds), in the model's order.
        """
        assert self._bound is not None, "bind the program to its buffers first"
        walls = np.empty((len(self.where), 2))
        clock, startall = time.perf_counter, MPI.Prequest.Startall
        for stages, rounds in self._bound[2]:
            t0_s = clock()
            for reqs, reduces, swaps in rounds:
                startall(reqs)
                wait(reqs, stages)
                for part, received in reduces:
                    ufunc(part, received, out=part)
                for part, received in swaps:  # (in place once the sends are done)
                    part[...] = received
            walls[stages] = (t0_s, clock())
        return walls
