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

from ..algorithms import COPY, REDUCE, plan, plan_all_to_all
from ..collectives import Collective, owned_region
from ..cost import A2A, AG, RS
from ..engine import StageRun
from ..topology import Topology

# one step: its sub-communicator, mode, receives (peer, start, stop, scratch start, scratch stop)
# and sends (peer, start, stop), in absolute elements of the collective's buffer
_Step = tuple[MPI.Comm, str, tuple[tuple[int, int, int, int, int], ...], tuple[tuple[int, int, int], ...]]


class Program:
    """Every step of one symmetric collective on this rank, in the model's stage start order.

    Args:
        topology: the network.
        coords: this rank's coordinate in each dim.
        comms: each dim's sub-communicator.
        collective: what runs.
        regions: every chunk's region stack as the collective opens (`MpiTransport.open`).
        order: the model's stage runs in start order.
    """

    __slots__ = ("stages", "scratch_elems", "where")

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
        self.stages: list[tuple[_Step, ...]] = []
        self.where: list[tuple[int, str, int]] = []  # (chunk, op, dim) of each stage: what a wait names
        self.scratch_elems = 0
        for run in order:
            s = run.stage
            dim, stack = topology.dims[s.dim], stacks[s.chunk]
            if s.op == AG:
                stack.pop()
            lo, hi = stack[-1]
            if s.op == A2A:
                stride = topology.group_strides(collective.dims)[s.dim]
                group = topology.group_npus(collective.dims)
                steps = plan_all_to_all(dim.npus, coords[s.dim], stride, group, lo, hi)
            else:
                steps = plan(dim.algorithm, s.op, dim.npus, coords[s.dim], lo, hi)
            if s.op == RS:
                stack.append(owned_region(dim.npus, coords[s.dim], lo, hi))
            compiled = []
            for st in steps:
                recvs, at = [], 0
                for peer, a, b in st.recvs:  # (copies land in place; the rest in scratch first)
                    span = 0 if st.mode == COPY else b - a
                    recvs.append((peer, a, b, at, at + span))
                    at += span
                self.scratch_elems = max(self.scratch_elems, at)
                compiled.append((comms[s.dim], st.mode, tuple(recvs), tuple(st.sends)))
            self.stages.append(tuple(compiled))
            self.where.append((s.chunk, s.op, s.dim))

    def run(
        self,
        buf: np.ndarray,
        scratch: np.ndarray,
        ufunc: np.ufunc,
        tag: int,
        wait: Callable[[list[MPI.Request], int], None],
    ) -> np.ndarray:
        """Move and reduce the data of every stage in order; each stage's wall start and end (s).

        `wait(requests, stage)` completes a step's requests (stage: its index, for messages).
        """
        walls = np.empty((len(self.stages), 2))
        clock = time.perf_counter
        for i, steps in enumerate(self.stages):
            walls[i, 0] = clock()
            for comm, mode, recvs, sends in steps:
                irecv, isend = comm.Irecv, comm.Isend
                if mode == COPY:
                    reqs = [irecv(buf[a:b], peer, tag) for peer, a, b, _, _ in recvs]
                else:
                    reqs = [irecv(scratch[sa:sb], peer, tag) for peer, _, _, sa, sb in recvs]
                reqs += [isend(buf[a:b], peer, tag) for peer, a, b in sends]
                wait(reqs, i)
                if mode == REDUCE:
                    for _, a, b, sa, sb in recvs:
                        part = buf[a:b]
                        ufunc(part, scratch[sa:sb], out=part)
                elif mode != COPY:  # a swap: in place once the sends are done
                    for _, a, b, sa, sb in recvs:
                        buf[a:b] = scratch[sa:sb]
            walls[i, 1] = clock()
        return walls
