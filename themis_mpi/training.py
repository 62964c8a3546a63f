"""Training iterations of a workload on the engine: compute as delays, collectives overlapping.

Per iteration, as in ASTRA-sim 1.0's layer loop:

- Forward, layer by layer: a layer starts once the previous layer is done and its own weights are
  updated (its previous weight-gradient collective finished, plus the update time). Compute, then
  the forward collective, which the next layer waits for. (DLRM: the embedding layer's all-to-all
  overlaps the bottom MLP and is waited for after the last bottom layer.)
- Backward, last layer first: weight-gradient compute, then its collective is issued and runs in
  the background; then input-gradient compute and its collective, which the next (earlier) layer
  waits for. Layer 0 has no input gradient. With activation checkpointing, a layer that initiates
  a recompute first runs the forward again from the nearest checkpoint at or before it.
- The next iteration's forward starts right after the backward of layer 0.

Several collectives are in flight at once and share the dims' queues. Every collective's chunk
orders are computed up front by the coordinator (the Themis loads reset per collective, so this is
what computing them at issue gives) and broadcast once.
"""

from __future__ import annotations

import numpy as np

from .collectives import DTYPES, Collective
from .errors import UsageError
from .policies import chunk_orders
from .workload import PHASES, Workload


class Event:
    """Something the layer loop may have to wait for (DLRM's embedding all-to-all)."""

    def __init__(self, done: bool = True):
        self.done, self._waiters = done, []

    def set(self) -> None:
        """Mark it done and run whoever waited."""
        self.done = True
        waiters, self._waiters = self._waiters, []
        for callback in waiters:
            callback()

    def then(self, callback) -> None:
        """Run `callback` now if done, else when set."""
        if self.done:
            callback()
        else:
            self._waiters.append(callback)


class TrainingRun:
    """Drives `iterations` training iterations of a workload on one NPU's engine.

    Args:
        workload: the parsed workload.
        topology: the network.
        engine: the engine to issue on (model or MPI transport).
        policy: baseline or themis.
        chunks: chunks per collective.
        dtype: element type of the collectives (sizes are bytes).
        iterations: iterations to run.
        compute_scale: factor on every compute and update time.
        comm_scale: factor on every collective's size (ASTRA-sim's comm-scale).
        orders: the broadcast orders, by `collective_key` (see `plan_orders`).
        issue: ``issue(collective, orders, on_done)``; defaults to ``engine.issue``.
    """

    def __init__(self, workload: Workload, topology, engine, policy: str, chunks: int, dtype: str,
                 iterations: int, compute_scale: float, orders: dict, issue=None, comm_scale: float = 1.0):
        if iterations < 1:
            raise UsageError(f"iterations must be >= 1, got {iterations}")
        if not compute_scale >= 0:
            raise UsageError(f"compute scale must be >= 0, got {compute_scale}")
        self.wl, self.topology, self.engine = workload, topology, engine
        self.policy, self.chunks, self.dtype = policy, chunks, dtype
        self.iterations, self.scale, self.orders = iterations, compute_scale, orders
        self.issue_fn = issue or engine.issue
        if not comm_scale > 0:
            raise UsageError(f"comm scale must be > 0, got {comm_scale}")
        self.comm_scale = comm_scale
        n = len(workload.layers)
        self.weights_ready = [0.0] * n  # time, or None while a weight-gradient collective runs
        self.waiting_for_weights: dict[int, object] = {}
        self.iteration_starts: list[float] = []
        self.compute_ns = 0.0
        self.collectives_issued = 0
        self.iteration = 0
        self.embedding = Event()  # DLRM: the embedding all-to-all the top layers wait for

    # --- helpers -------------------------------------------------------------------------------

    def _after(self, delay_ns: float, then) -> None:
        self.compute_ns += delay_ns
        self.engine.at(self.engine.now_ns + delay_ns, lambda engine: then())

    def _collective(self, layer, phase: str, then) -> None:
        """Issue the layer's phase collective and call `then` when it is done (or at once)."""
        coll = collective_of(self.wl, layer, phase, self.topology, self.chunks, self.dtype, self.comm_scale)
        if coll is None:
            then()
            return
        self.collectives_issued += 1
        self.issue_fn(coll, self.orders[collective_key(coll)], lambda engine, run: then())

    # --- forward -------------------------------------------------------------------------------

    def start(self) -> None:
        """Begin the first iteration now."""
        self.iteration_starts.append(self.engine.now_ns)
        self._forward(0, recompute_until=None)

    def _forward(self, i: int, recompute_until) -> None:
        if recompute_until is None:  # a real forward waits for the layer's updated weights
            ready = self.weights_ready[i]
            if ready is None:
                self.waiting_for_weights[i] = lambda: self._forward(i, None)
                return
            if ready > self.engine.now_ns:
                self.engine.at(ready, lambda engine: self._forward(i, None))
                return
        layer = self.wl.layers[i]
        self._after(layer.fwd.compute_ns * self.scale, lambda: self._forward_comm(i, recompute_until))

    def _forward_comm(self, i: int, recompute_until) -> None:
        layer = self.wl.layers[i]
        dlrm = self.wl.dlrm_last_bottom_layer
        if dlrm is not None and i == 0 and recompute_until is None:  # overlaps the bottom MLP
            self.embedding = Event(done=False)
            self._collective(layer, "fwd", self.embedding.set)
            self._forward_next(i, recompute_until)
            return
        self._collective(layer, "fwd", lambda: self._forward_next(i, recompute_until))

    def _forward_next(self, i: int, recompute_until) -> None:
        dlrm = self.wl.dlrm_last_bottom_layer
        if dlrm is not None and i == dlrm and recompute_until is None and not self.embedding.done:
            self.embedding.then(lambda: self._forward_next(i, recompute_until))
            return
        if recompute_until is not None:
            if i < recompute_until:
                self._forward(i + 1, recompute_until)
            else:
                self._backward_layer(i)
            return
        if i + 1 < len(self.wl.layers):
            self._forward(i + 1, None)
        else:
            self._backward(len(self.wl.layers) - 1)

    # --- backward ------------------------------------------------------------------------------

    def _backward(self, i: int) -> None:
        if i in self.wl.checkpoint_initiates:
            start = max([c for c in self.wl.checkpoints if c <= i], default=0)
            self._forward(start, recompute_until=i)
            return
        self._backward_layer(i)

    def _backward_layer(self, i: int) -> None:
        layer = self.wl.layers[i]
        self._after(layer.wg.compute_ns * self.scale, lambda: self._weight_gradient(i))

    def _weight_gradient(self, i: int) -> None:
        layer = self.wl.layers[i]
        self.weights_ready[i] = None

        def updated():
            self.weights_ready[i] = self.engine.now_ns + layer.update_ns * self.scale
            waiting = self.waiting_for_weights.pop(i, None)
            if waiting:
                waiting()

        self._collective(layer, "wg", updated)
        if i == 0:
            self._iteration_done()
            return
        self._after(layer.ig.compute_ns * self.scale,
                    lambda: self._collective(layer, "ig", lambda: self._backward(i - 1)))

    def _iteration_done(self) -> None:
        self.iteration += 1
        if self.iteration < self.iterations:
            self.iteration_starts.append(self.engine.now_ns)
            self._forward(0, None)


def collective_of(workload: Workload, layer, phase: str, topology, chunks: int, dtype: str,
                  comm_scale: float = 1.0):
    """The Collective a layer's phase issues, or None (no collective, no size, or no dims)."""
    p = layer.phase(phase)
    dims = tuple(d for d in workload.dims(layer, phase, topology) if topology.dims[d].npus > 1)
    if p.op is None or p.size_bytes <= 0 or not dims:
        return None
    itemsize = np.dtype(dtype).itemsize
    count = max(1, int(p.size_bytes * comm_scale) // itemsize)
    return Collective(p.op, count, dtype, chunks, dims)


def collective_key(coll: Collective) -> tuple:
    """What a collective's chunk orders depend on."""
    return (coll.op, coll.count, coll.dtype, coll.n_chunks, coll.dims)


def plan_orders(workload: Workload, topology, policy: str, chunks: int, dtype: str,
                comm_scale: float = 1.0) -> dict:
    """Chunk orders of every distinct collective the workload issues (the coordinator's job)."""
    if dtype not in DTYPES:
        raise UsageError(f"unknown dtype {dtype!r}")
    out = {}
    for layer in workload.layers:
        for phase in PHASES:
            coll = collective_of(workload, layer, phase, topology, chunks, dtype, comm_scale)
            if coll is not None and collective_key(coll) not in out:
                out[collective_key(coll)] = chunk_orders(policy, topology, coll.op, coll.size_bytes,
                                                         coll.n_chunks, coll.dims)
    return out


def summarize_training(run: TrainingRun, topology, records, total_ns: float) -> dict:
    """Iteration time, compute, exposed communication and per-dim utilization of a finished run."""
    starts = run.iteration_starts + [total_ns]
    iteration_ns = [b - a for a, b in zip(starts, starts[1:])]
    compute_per_iter = run.compute_ns / run.iterations
    dims = []
    for d in range(len(topology.dims)):
        busy = sum(r.end_ns - r.start_ns for r in records if r.stage.dim == d)
        dims.append({"dim": d, "busy_us": busy / 1e3,
                     "utilization": busy / total_ns if total_ns > 0 else 0.0})
    mean_ns = total_ns / run.iterations
    return {
        "iterations": run.iterations,
        "total_us": total_ns / 1e3,
        "iteration_us": mean_ns / 1e3,
        "last_iteration_us": iteration_ns[-1] / 1e3,
        "compute_us": compute_per_iter / 1e3,
        "exposed_comm_us": max(0.0, mean_ns - compute_per_iter) / 1e3,
        "collectives": run.collectives_issued,
        "dims": dims,
    }


def model_training(workload: Workload, topology, policy: str, intra: str, chunks: int = 64,
                   dtype: str = "float32", iterations: int = 2, compute_scale: float = 1.0,
                   active_per_dim: int = 1, endpoint_delay_ns: float = 0.0, comm_scale: float = 1.0) -> dict:
    """Training iterations on the model transport; returns the summary row."""
    from .cost import CostModel
    from .engine import Engine
    from .model import run_engine

    engine = Engine(topology, intra, active_per_dim)
    orders = plan_orders(workload, topology, policy, chunks, dtype, comm_scale)
    itemsize = np.dtype(dtype).itemsize
    run = TrainingRun(workload, topology, engine, policy, chunks, dtype, iterations, compute_scale, orders,
                      comm_scale=comm_scale)
    run.start()
    run_engine(engine, CostModel(topology, itemsize, endpoint_delay_ns))
    row = summarize_training(run, topology, engine.records, engine.now_ns)
    row.update(policy=policy, intra=intra, chunks=chunks, wrong=None, transport="model")
    return row



def mpi_training(grid, workload: Workload, policy: str, intra: str, chunks: int = 64,
                 dtype: str = "float32", iterations: int = 2, compute_scale: float = 1.0,
                 active_per_dim: int = 1, endpoint_delay_ns: float = 0.0, comm_scale: float = 1.0,
                 timeout_s: float = 60.0) -> dict:
    """Training iterations on the emulator, every collective on real data and checked.

    Returns the same summary row on every rank, with ``wrong`` summed over ranks and
    collectives.
    """
    import pickle

    from mpi4py import MPI

    from .collectives import count_wrong, fill_input
    from .cost import CostModel
    from .emulator import MpiTransport, allreduce, wait
    from .engine import Engine

    topo = grid.topology
    payload = pickle.dumps(plan_orders(workload, topo, policy, chunks, dtype, comm_scale)
                           if grid.rank == 0 else None)
    size = np.array([len(payload)], np.int64)
    wait(grid.cart.Ibcast(size, root=0), timeout_s, "the broadcast of the chunk orders")
    data = np.frombuffer(payload, np.uint8).copy() if grid.rank == 0 else np.empty(int(size[0]), np.uint8)
    wait(grid.cart.Ibcast(data, root=0), timeout_s, "the broadcast of the chunk orders")
    orders = pickle.loads(data.tobytes())
    itemsize = np.dtype(dtype).itemsize
    engine = Engine(topo, intra, active_per_dim)
    transport = MpiTransport(grid, CostModel(topo, itemsize, endpoint_delay_ns), timeout_s=timeout_s)
    wrong = [0]

    def issue(coll, coll_orders, on_done):
        buffer = np.empty(coll.count, dtype=coll.dtype)
        fill_input(buffer, topo, coll, grid.coords, coll_orders)
        coll_id = len(engine.collectives)
        transport.attach(coll_id, coll, buffer, coll_orders)

        def done(engine_, run):
            wrong[0] += count_wrong(buffer, topo, coll, grid.coords, coll_orders)
            transport.detach(coll_id)
            on_done(engine_, run)

        engine.issue(coll, coll_orders, done)

    run = TrainingRun(workload, topo, engine, policy, chunks, dtype, iterations, compute_scale, orders,
                      issue, comm_scale)
    wait(grid.cart.Ibarrier(), timeout_s, "the barrier before training")
    t0 = transport.t0_wall = MPI.Wtime()
    run.start()
    engine.run(transport)
    wall_s = float(allreduce(grid.cart, [MPI.Wtime() - t0], MPI.MAX, timeout_s)[0])
    row = summarize_training(run, topo, engine.records, engine.now_ns)
    row.update(policy=policy, intra=intra, chunks=chunks, transport="mpi", wall_s=wall_s,
               wrong=int(allreduce(grid.cart, np.array(wrong, np.int64), timeout_s=timeout_s)[0]))
    return row
