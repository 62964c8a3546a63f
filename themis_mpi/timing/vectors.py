"""Every NPU at once in numpy vectors: the emulator's rule on ``ideal`` links, a time per NPU (`NpuVectors`).

Stragglers (a late NPU, a scaled link, slower compute) break the symmetry one NPU's view relies
on. Under an agreed order (`engine.Engine.agree`) the engine is a dataflow: a stage starts at the
later of its chunk's and its dim's previous ends, a process resumes at the later of its clock and
its event's, so each time is a max and sum of others and the same program runs on every NPU. Run
once with vectors for times (`engine.later`), it times all NPUs together; a stage's step ends
come from every NPU's start by the emulator's rule (`greenlets.NpuWorld`'s), step by step for all
NPUs at once, as gathers over per-step peer tables. It equals `greenlets.NpuWorld` exactly (a
test).

Shortcuts: NPUs alike in their coordinate and region size share a step plan (`_step_tables`);
chunks of one size share their region sizes (`_size`); a stage's record keeps NPU 0's times once
the engine has processed it (only stages in flight hold vectors).
"""

from __future__ import annotations

import math
from collections import deque
from typing import Any

import numpy as np

from ..algorithms import plan, plan_all_to_all
from ..collectives import rs_dims
from ..config import RunConfig
from ..cost import A2A, AG, RS
from ..engine import CollectiveRun, Engine, StageRun
from ..model import ModelTransport
from ..topology import Topology
from .greenlets import refuse_messages
from .ideal import LinkScales


class NpuVectors(ModelTransport):
    """Every NPU at once: the engine runs a time per NPU in numpy vectors, under an agreed order (module doc).

    A stage's record keeps NPU 0's times once the engine has processed it (only stages in flight
    hold vectors), and `span_ns` leaves NPU 0's view of the rest, as the emulator's rank 0
    reports it.

    Args:
        topology: the network.
        config: the run settings (ideal network, virtual clock).
    """

    def __init__(self, topology: Topology, config: RunConfig):
        super().__init__(topology, config)
        topo, self.n = topology, topology.npus
        ranks = np.arange(self.n)
        self.strides = [int(np.prod(topo.shape[:d], dtype=np.int64)) for d in range(len(topo.dims))]
        self.coords = [(ranks // self.strides[d]) % dim.npus for d, dim in enumerate(topo.dims)]
        self.links = LinkScales(self.cost, config.link_scale)
        self.factors = [np.ones(self.n) for _ in topo.dims]
        for d, rank, f in config.link_scale:
            self.factors[d][rank] = f
        self.ranks = ranks  # (a training loop draws every NPU's compute at once)
        self.issue_ns = np.zeros(self.n)  # when each NPU starts its work (a late NPU later)
        for rank, delay_ns in config.npu_delay_ns:
            self.issue_ns[rank] = delay_ns
        # per chunk: its size and the dims it has reduce-scattered over; what that leaves every NPU
        self._regions: dict[int, list[tuple[int, list[int]]]] = {}
        self._sizes: dict[tuple[int, tuple[int, ...]], np.ndarray] = {}
        self._colls: dict[int, CollectiveRun] = {}
        self._tables: dict[tuple, list[tuple[np.ndarray, np.ndarray, np.ndarray]]] = {}  # (`_step_tables`)
        self._done: deque[tuple[np.ndarray, StageRun]] = deque()
        self._returned: StageRun | None = None  # the last stage `wait_next` returned
        self.npu_end_ns = np.full(self.n, -math.inf)  # each NPU's latest stage end so far

    def _size(self, elems: int, dims: tuple[int, ...]) -> np.ndarray:
        """Every NPU's region size in a chunk of `elems` reduce-scattered over `dims` in turn.

        Each step keeps `collectives.owned_region` of the region at the NPU's coordinate; only
        sizes matter to the step plans, so chunks of one size share these arrays.
        """
        size = self._sizes.get((elems, dims))
        if size is None:
            if not dims:
                size = np.full(self.n, elems)
            else:
                d = dims[-1]
                p, c = self.topology.dims[d].npus, self.coords[d]
                q, r = np.divmod(self._size(elems, dims[:-1]), p)
                size = q + np.minimum(c + 1, r) - np.minimum(c, r)
            self._sizes[elems, dims] = size
        return size

    def open(self, run: CollectiveRun) -> None:
        """Each chunk's size and reduce-scatter path, as `NpuTransport.open` keeps its regions."""
        coll, sizes = run.collective, np.diff(run.bounds).tolist()
        paths = [
            rs_dims(self.topology, coll, run.orders[k]) if coll.op == "all_gather" else []
            for k in range(len(sizes))
        ]
        self._regions[run.coll_id] = [(m, list(path)) for m, path in zip(sizes, paths)]
        self._colls[run.coll_id] = run

    def close(self, run: CollectiveRun) -> None:
        """No data to check."""
        del self._regions[run.coll_id], self._colls[run.coll_id]

    def start(self, run: StageRun) -> None:
        """Every NPU's end of the stage, from every NPU's start (`run.start_ns`)."""
        refuse_messages(run)
        s, n = run.stage, self.n
        coll = self._colls[s.coll].collective
        elems, path = self._regions[s.coll][s.chunk]
        if s.op == AG:
            path.pop()
        size = self._size(elems, tuple(path))
        if s.op == RS:
            path.append(s.dim)
        tables = self._step_tables(s.dim, s.op, size, coll.dims if s.op == A2A else None)
        costs = self.cost(s.itemsize).run_steps_ns(run)
        f_d = self.factors[s.dim]
        fs = np.unique(f_d)
        extras = np.array([self.links.factor_extra_ns(run, s.itemsize, f) for f in fs.tolist()])
        f_ext = np.append(f_d, fs[0])  # (the padding peer n: any factor, its time is -inf)
        t: np.ndarray = np.full(n, run.start_ns) if np.isscalar(run.start_ns) else np.asarray(run.start_ns)
        for k, step_ns in enumerate(costs):
            recvs, sends, sending_any = tables[k]
            t_ext = np.append(t, -math.inf)
            if len(fs) == 1:  # every link of the dim at one pace: one extra for every message
                arrival = (t_ext[recvs] + extras[0][k]).max(axis=1, initial=-math.inf)
                sending = np.where(sending_any, extras[0][k], -math.inf)
            else:  # a message gains what the slower of its ends adds
                rx = extras[np.searchsorted(fs, np.minimum(f_d[:, None], f_ext[recvs])), k]
                arrival = (t_ext[recvs] + rx).max(axis=1, initial=-math.inf)
                sx = extras[np.searchsorted(fs, np.minimum(f_d[:, None], f_ext[sends])), k]
                sending = np.where(sends < n, sx, -math.inf).max(axis=1, initial=-math.inf)
            t = np.maximum(np.maximum(t, t + (step_ns + sending)), arrival + step_ns)
        self._done.append((t, run))

    def _step_tables(
        self, d: int, op: str, size: np.ndarray, a2a_dims: tuple | None
    ) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """Per step, every NPU's receive and send peers (rows padded with NPU n) and who sends.

        A step's peers follow from the NPU's coordinate on dim d and the size of its region
        (`algorithms.plan`); NPUs alike in both share a plan.
        """
        key = (d, op, size.tobytes(), a2a_dims)
        tables = self._tables.get(key)
        if tables is not None:
            return tables
        topo, n, stride, c = self.topology, self.n, self.strides[d], self.coords[d]
        dim = topo.dims[d]
        keys, group = np.unique(c * (int(size.max()) + 1) + size, return_inverse=True)
        shapes = []
        for g in range(len(keys)):
            idx = np.flatnonzero(group == g)
            cg, m = int(c[idx[0]]), int(size[idx[0]])
            if op == A2A:
                steps = plan_all_to_all(
                    dim.npus, cg, topo.group_strides(a2a_dims)[d], topo.group_npus(a2a_dims), 0, m
                )
            else:
                steps = plan(dim.algorithm, op, dim.npus, cg, 0, m)
            shapes.append((cg, idx, steps))
        tables = []
        for k in range(min(len(steps) for _, _, steps in shapes)):
            recvs = np.full((n, max(len(steps[k].recvs) for _, _, steps in shapes)), n)
            sends = np.full((n, max(len(steps[k].sends) for _, _, steps in shapes)), n)
            for cg, idx, steps in shapes:
                for j, (p, _, _) in enumerate(steps[k].recvs):
                    recvs[idx, j] = idx + (p - cg) * stride
                for j, (p, _, _) in enumerate(steps[k].sends):
                    sends[idx, j] = idx + (p - cg) * stride
            tables.append((recvs, sends, np.asarray((sends < n).any(axis=1))))
        self._tables[key] = tables
        return tables

    def wait_next(self, horizon_ns: float, certain: bool = True) -> tuple[float, list[StageRun]]:
        """The next stage whose ends are known (all are, once started), or (horizon, []).

        The stage returned before has been processed by now: its record keeps NPU 0's times
        (the vectors live on where the engine still needs them: its chunk and its dim).
        """
        last = self._returned
        if last is not None:
            np.maximum(self.npu_end_ns, last.end_ns, out=self.npu_end_ns)
            last.queued_ns, last.start_ns = npu0_ns(last.queued_ns), npu0_ns(last.start_ns)
            last.end_ns = npu0_ns(last.end_ns)
            self._returned = None
        if not self._done:
            return horizon_ns, []
        t, self._returned = self._done.popleft()
        return t, [self._returned]  # type: ignore[return-value]

    def span_ns(self, engine: Engine) -> tuple[float, float]:
        """The first issue and the last end over every NPU; NPU 0's times stay in the engine."""
        self.wait_next(math.inf)  # (the last stage's record)
        first_ns = min((float(np.min(c.issued_ns)) for c in engine.collectives), default=0.0)
        last_ns = float(max(np.max(engine.now_ns), np.max(engine.last_timer_ns), self.npu_end_ns.max()))
        for coll in engine.collectives:
            coll.issued_ns, coll.end_ns = npu0_ns(coll.issued_ns), npu0_ns(coll.end_ns)
        engine.now_ns = npu0_ns(engine.now_ns)
        return first_ns, last_ns


def npu0_ns(t_ns: Any) -> float:
    """NPU 0's value of a time (a scalar stands for every NPU)."""
    return float(t_ns[0]) if isinstance(t_ns, np.ndarray) else float(t_ns)


def npu0(value: Any) -> Any:
    """NPU 0's value of a vector of every NPU's; any other value as it is."""
    return float(value[0]) if isinstance(value, np.ndarray) else value
