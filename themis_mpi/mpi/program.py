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
from ..collectives import Collective, owned_region
from ..cost import A2A, AG, RS
from ..engine import StageRun
from ..topology import Topology

# one step: its sub-communicator, mode, receives (peer, start, stop, scratch start, scratch stop)
# and sends (peer, start, stop), in absolute elements of the collective's buffer
_Step = tuple[MPI.Comm, str, tuple[tuple[int, int, int, int, int], ...], tuple[tuple[int, int, int], ...]]


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

    __slots__ = ("waves", "scratch_elems", "where")

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
        steps: list[list[Step]] = []
        # (chunk, op, dim, peers in the dim) of each stage: what a wait names
        self.where: list[tuple[int, str, int, tuple[int, ...]]] = []
        for run in order:  # (a chunk's regions narrow and widen in the order its stages start)
            s = run.stage
            dim, stack = topology.dims[s.dim], stacks[s.chunk]
            if s.op == AG:
                stack.pop()
            lo, hi = stack[-1]
            if s.op == A2A:
                stride = topology.group_strides(collective.dims)[s.dim]
                group = topology.group_npus(collective.dims)
                steps.append(plan_all_to_all(dim.npus, coords[s.dim], stride, group, lo, hi))
            else:
                steps.append(plan(dim.algorithm, s.op, dim.npus, coords[s.dim], lo, hi))
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

    def run(
        self,
        buf: np.ndarray,
        scratch: np.ndarray,
        ufunc: np.ufunc,
        tag: int,
        wait: Callable[[list[MPI.Request], int], None],
    ) -> np.ndarray:
        """Move and reduce the data of every stage, wave by wave; each stage's wall start and end (s).

        `wait(requests, stage)` completes a round's requests (stage: the place in the order of
        the wave's first stage, which a stalled wait names).
        """
        walls = np.empty((len(self.where), 2))
        clock = time.perf_counter
        for stages, rounds in self.waves:
            t0_s = clock()
            for steps in rounds:
                reqs = []
                for comm, mode, recvs, sends in steps:
                    irecv, isend = comm.Irecv, comm.Isend
                    if mode == COPY:
                        reqs += [irecv(buf[a:b], peer, tag) for peer, a, b, _, _ in recvs]
                    else:
                        reqs += [irecv(scratch[sa:sb], peer, tag) for peer, _, _, sa, sb in recvs]
                    reqs += [isend(buf[a:b], peer, tag) for peer, a, b in sends]
                wait(reqs, stages[0])
                for _, mode, recvs, _ in steps:
                    if mode == REDUCE:
                        for _, a, b, sa, sb in recvs:
                            part = buf[a:b]
                            ufunc(part, scratch[sa:sb], out=part)
                    elif mode != COPY:  # a swap: in place once the sends are done
                        for _, a, b, sa, sb in recvs:
                            buf[a:b] = scratch[sa:sb]
            walls[list(stages)] = (t0_s, clock())
        return walls
