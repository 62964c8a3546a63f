"""Replay of Chakra execution graphs (`et`) on the engine, as one process per node.

Rules (docs/workloads.md#chakra-execution-traces):

- A node starts once every node it depends on (``ctrl_deps`` and ``data_deps``) has finished.
  Dependencies on ids absent from the trace are ignored (and counted); a cycle is refused.
  Any number of collectives are in flight at once, sharing the dims' queues as in the
  text-workload replay.
- COMP nodes wait their duration: the ``themis_duration_ns`` attribute when present (written by
  ``themis-mpi convert``, which needs sub-microsecond times), else ``duration_micros``. As in
  ASTRA-sim 2.x (``HardwareResource``), an NPU runs one CPU op (``is_cpu_op``) and one GPU
  compute node at a time; when one ends, the ready node with the smallest id goes next. A COMP
  node with ``themis_overlap`` true takes neither (``convert`` writes the weight update after a
  collective so, a timer in ASTRA-sim 1.0); nodes of zero duration take no time. GPU compute
  nodes count as compute; exposed communication is the iteration time minus that compute.
- COMM_COLL nodes with ``comm_type`` ALL_REDUCE, REDUCE_SCATTER, ALL_GATHER or ALL_TO_ALL run as
  collectives of ``comm_size`` bytes per NPU (an all-gather's input, as in the text format) over
  the dims from ``pg_name`` (a communicator group: a sub-grid of the topology) and
  ``involved_dim`` (a bool per dim; missing entries count as involved, extra entries are
  ignored). BROADCAST is a delay of its duration (as ASTRA-sim does); a COMM_COLL node without
  ``comm_type`` (PyTorch's CPU-side launch of a collective) is a delay too. Other types are
  refused.
- COMM_SEND / COMM_RECV nodes are point-to-point messages (`engine.MessageRun`) from
  ``comm_src`` to ``comm_dst`` (this NPU by default) of ``comm_size`` bytes, tag ``comm_tag``.
- METADATA, MEM_LOAD, MEM_STORE and INVALID nodes take no time.

A collective's `policies.Need` (what a communication scheduler ranks by) is its first consumer:
that node's place in the topological order and the compute (non-CPU COMP) time before it there;
with ``TrainingSpec.partition_mib`` every collective is sliced into partitions
(`training.partitions`).

Every rank knows every collective it will issue before the first one (`graph_collectives`), so
rank 0 chooses all chunk orders up front and a graph that does not fit is refused on every rank
before MPI starts. A symmetric graph (one file) runs the same nodes on every rank; per-rank
files are ``prefix.<rank>.et``. The model replays rank 0's graph.
"""

from __future__ import annotations

import heapq
import json
import math
import os
import weakref
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np

from ..collectives import Collective
from ..engine import Engine, Event, ProcessGenerator
from ..errors import UsageError, shown
from ..limits import MAX_TIME_NS
from ..output import read_json
from ..policies import UNKNOWN, Need, Schedule
from ..progress import Progress, tell
from ..topology import Topology
from .et import (
    COMM_COLL_NODE,
    COMM_RECV_NODE,
    COMM_SEND_NODE,
    COMM_TYPES,
    COMP_NODE,
    NODE_TYPES,
    EtTrace,
    Node,
    read_et,
)
from .training import TrainingSpec, partitions

COLLECTIVE_OPS = {0: "all_reduce", 2: "all_gather", 6: "all_to_all", 7: "reduce_scatter"}
BROADCAST = 5
DELAY, COLL, SEND, RECV, NOP = "delay", "coll", "send", "recv", "nop"


@dataclass(frozen=True)
class Op:
    """What one node does on one NPU (see the module doc); `deps` index earlier ops."""

    index: int
    node_id: int
    kind: str
    deps: tuple[int, ...] = ()
    delay_ns: float = 0.0
    compute: bool = False
    resource: str = ""
    collective: Collective | None = None
    peer: int = -1
    path: tuple[tuple[int, int], ...] = ()
    nbytes: int = 0
    tag: int = 0


@dataclass
class Plan:
    """One NPU's ops in a topological order, with what the replay reports.

    `shift`: what its messages' peers move by, where it is another rank's plan shared (`shifted`).
    """

    path: str
    rank: int
    ops: list[Op]
    missing_deps: int = 0
    dropped_ctrl_deps: int = 0
    shift: int = 0
    _needs: dict[int, Need] | None = field(default=None, repr=False, compare=False)

    @property
    def needs(self) -> dict[int, Need]:
        """Each collective's `Need` (`graph_needs`), computed once per plan and shared with its shifts."""
        if self._needs is None:
            self._needs = graph_needs(self)
        return self._needs

    def shifted(self, rank: int) -> Plan:
        """This plan as NPU `rank`'s: the same ops, its messages' peers moved by ``rank - self.rank``.

        For ranks whose graphs differ from this one's by that move alone (`run.training.graph_kinds`:
        ranks of one kind); the ops are shared, not copied, so ranks of a kind hold one plan.
        """
        if rank == self.rank:
            return self
        shift = self.shift + rank - self.rank
        return Plan(self.path, rank, self.ops, self.missing_deps, self.dropped_ctrl_deps, shift, self.needs)

    @property
    def compute_ns(self) -> float:
        """Compute time of the graph (non-CPU COMP nodes)."""
        return sum(op.delay_ns for op in self.ops if op.compute)

    @property
    def collectives(self) -> int:
        """Collective nodes that run on the network."""
        return sum(1 for op in self.ops if op.kind == COLL)

    @property
    def messages(self) -> int:
        """Point-to-point sends and receives."""
        return sum(1 for op in self.ops if op.kind in (SEND, RECV))


@dataclass
class Graph:
    """One trace for every rank (symmetric), or one per rank, with its communicator groups."""

    source: str
    traces: list[EtTrace]
    groups: dict[str, tuple[int, ...]] = field(default_factory=dict)

    @property
    def symmetric(self) -> bool:
        """One trace that every rank runs."""
        return len(self.traces) == 1

    def trace(self, rank: int) -> EtTrace:
        """The trace rank `rank` runs."""
        return self.traces[0] if self.symmetric else self.traces[rank]

    @property
    def iterations(self) -> int:
        """Training iterations the graph holds (``themis_iterations`` metadata, else 1)."""
        value = self.traces[0].attr("themis_iterations", 1)
        return value if isinstance(value, int) and value >= 1 else 1

    @property
    def model_parallel_group(self) -> int | None:
        """A converted transformer's model-parallel group (it may split a dim), else None."""
        value = self.traces[0].attr("themis_model_parallel_group")
        return value if isinstance(value, int) and value >= 1 else None


def is_et_source(path: str) -> bool:
    """Whether `path` names a Chakra trace: a .et(.gz) file, or a prefix of prefix.<rank>.et files."""
    if path.endswith((".et", ".et.gz")):
        return True
    return not os.path.isfile(path) and _rank_file(path, 0) is not None


def _rank_file(prefix: str, rank: int) -> str | None:
    for ext in (".et", ".et.gz"):
        if os.path.isfile(f"{prefix}.{rank}{ext}"):
            return f"{prefix}.{rank}{ext}"
    return None


def load_comm_groups(path: str | None) -> dict[str, tuple[int, ...]]:
    """ASTRA-sim's --comm-group-configuration JSON: {"group id": [npu, ...], ...}."""
    if not path:
        return {}
    try:
        doc = read_json(path)
    except (OSError, ValueError) as exc:
        raise UsageError(f"cannot read communicator groups {path}: {exc}") from None
    if not isinstance(doc, dict):
        raise UsageError(f"{path}: communicator groups must be an object of id -> list of NPUs")
    out = {}
    for name, members in doc.items():
        if (
            not isinstance(members, list)
            or not members
            or not all(isinstance(m, int) and not isinstance(m, bool) for m in members)
        ):
            raise UsageError(
                f"{path}: group {shown(name)} must be a non-empty list of NPU ids (integers), "
                f"got {shown(json.dumps(members))}"
            )
        out[str(name)] = tuple(members)
    return out


def load_graph(source: str, comm_groups: str | None = None) -> Graph:
    """A .et file (symmetric) or a prefix of prefix.0.et, prefix.1.et, ... (one per rank)."""
    groups = load_comm_groups(comm_groups)
    if os.path.isfile(source):
        return Graph(source, [read_et(source)], groups)
    paths: list[str] = []
    while (path := _rank_file(source, len(paths))) is not None:
        paths.append(path)
    if not paths:
        raise UsageError(f"no Chakra trace {source}: neither a file nor the prefix of {source}.0.et, ...")
    return Graph(source, [read_et(p) for p in paths], groups)


# --- planning: nodes to ops ----------------------------------------------------------------------


def coords(topology: Topology, npu: int) -> tuple[int, ...]:
    """An NPU's coordinate per dim (dim 0 varies fastest, as the MPI grid numbers ranks)."""
    out = []
    for dim in topology.dims:
        out.append(npu % dim.npus)
        npu //= dim.npus
    return tuple(out)


def group_dims(topology: Topology, members: Sequence[int], rank: int, what: str) -> tuple[int, ...]:
    """The dims a communicator group spans; it must be the sub-grid through `rank` over them."""
    if any(not 0 <= m < topology.npus for m in members):
        raise UsageError(f"{what}: an NPU of the group is outside 0..{topology.npus - 1}")
    if rank not in members:
        raise UsageError(f"{what}: NPU {rank} runs the node but is not in the group {list(members)}")
    mine = coords(topology, rank)
    dims = tuple(d for d in range(len(mine)) if any(coords(topology, m)[d] != mine[d] for m in members))
    expected = {
        n
        for n in range(topology.npus)
        if all(c == m for d, (c, m) in enumerate(zip(coords(topology, n), mine)) if d not in dims)
    }
    if set(members) != expected or len(members) != len(set(members)):
        raise UsageError(
            f"{what}: group {list(members)} is not the sub-grid of {topology.label()} through NPU {rank} "
            f"over dims {', '.join(map(str, dims))}"
        )
    return dims


def _int_attr(node: Node, name: str, where: str, default: int | None = None) -> int:
    value = node.attr(name, default)
    if isinstance(value, bool) or not isinstance(value, int):
        if value is None:
            raise UsageError(f"{where}: missing attribute {name}")
        raise UsageError(f"{where}: attribute {name} must be an integer, got {value!r}")
    return value


def duration_ns(node: Node, where: str = "") -> float:
    """The node's duration: ``themis_duration_ns`` if present, else ``duration_micros`` in ns.

    Durations beyond `MAX_TIME_NS` (a day), infinite or not a number are refused with one line.
    """
    value = node.attr("themis_duration_ns")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        ns = float(value)
    else:
        ns = node.duration_micros * 1e3
    if not (0 <= ns <= MAX_TIME_NS):  # (NaN fails both)
        raise UsageError(
            f"{where or 'a node'}: duration {ns:g} ns is out of range (at most {MAX_TIME_NS:g} ns)"
        )
    return ns


def _collective(
    node: Node, topology: Topology, rank: int, spec: TrainingSpec, groups: dict, where: str
) -> Collective | None:
    comm_type = _int_attr(node, "comm_type", where)
    op = COLLECTIVE_OPS[comm_type]
    size = _int_attr(node, "comm_size", where)
    if size < 0:
        raise UsageError(f"{where}: comm_size must be >= 0, got {size}")
    n = len(topology.dims)
    dims = tuple(range(n))
    involved = node.attr("involved_dim")
    if involved is not None:
        if not isinstance(involved, list) or not all(isinstance(v, bool) for v in involved):
            raise UsageError(f"{where}: involved_dim must be a bool list")
        dims = tuple(d for d in dims if d >= len(involved) or involved[d])
    pg = node.attr("pg_name", "")
    if pg not in ("", "0", None):
        if str(pg) not in groups:
            raise UsageError(f"{where}: communicator group {pg!r} is not defined (--comm-group)")
        spanned = group_dims(topology, groups[str(pg)], rank, f"{where}: group {pg}")
        dims = tuple(d for d in dims if d in spanned)
    dims = tuple(d for d in dims if topology.dims[d].npus > 1)
    if size == 0 or not dims:
        return None
    size_bytes = size * (topology.group_npus(dims) if op == "all_gather" else 1)
    return Collective.of_bytes(op, int(size_bytes * spec.comm_scale), spec.dtype, spec.chunks, dims)


def _message(node: Node, topology: Topology, rank: int, spec: TrainingSpec, where: str) -> Op | None:
    send = node.type == COMM_SEND_NODE
    src = _int_attr(node, "comm_src", where, rank if send else None)
    dst = _int_attr(node, "comm_dst", where, None if send else rank)
    if (src if send else dst) != rank:
        side = "sender" if send else "receiver"
        raise UsageError(f"{where}: runs on NPU {rank} but its {side} is NPU {src if send else dst}")
    peer = dst if send else src
    if not 0 <= peer < topology.npus:
        raise UsageError(f"{where}: peer NPU {peer} is outside 0..{topology.npus - 1}")
    nbytes = max(0, int(_int_attr(node, "comm_size", where) * spec.comm_scale))
    tag = _int_attr(node, "comm_tag", where, 0)
    if peer == rank or nbytes == 0:
        return None
    path = message_path(topology, rank, peer)
    return Op(0, node.id, SEND if send else RECV, peer=peer, path=path, nbytes=nbytes, tag=tag)


def message_path(topology: Topology, rank: int, peer: int) -> tuple[tuple[int, int], ...]:
    """A message's route from `rank` to `peer`: (dim, hops) per dim where their coordinates differ."""
    a, b = coords(topology, rank), coords(topology, peer)
    path = []
    for d, dim in enumerate(topology.dims):
        if a[d] != b[d]:
            k = abs(a[d] - b[d])
            path.append((d, min(k, dim.npus - k) if dim.kind == "Ring" else dim.hops))
    return tuple(path)


_PLANS: dict[int, dict[tuple, Plan]] = {}  # id of a live trace -> its plans, dropped with the trace


def plan_graph(
    trace: EtTrace, topology: Topology, rank: int, spec: TrainingSpec, groups: dict | None = None
) -> Plan:
    """One NPU's ops in topological order; a node that cannot run is refused with one line.

    A trace's plans are kept while it lives (a plan is read, never changed): one run asks for
    each NPU's plan several times (collectives, the planner, the loop), those of every NPU of a
    world among them, and a 100,000-node graph takes seconds to plan.
    """
    plans = _PLANS.get(id(trace))
    if plans is None:
        plans = _PLANS[id(trace)] = {}
        weakref.finalize(trace, _PLANS.pop, id(trace), None)  # (its id may be reused after)
    key = (rank, topology, spec, tuple(sorted((groups or {}).items())))
    if key not in plans:
        plans[key] = _plan_graph(trace, topology, rank, spec, groups or {})
    return plans[key]


def _plan_graph(trace: EtTrace, topology: Topology, rank: int, spec: TrainingSpec, groups: dict) -> Plan:
    """`plan_graph` itself."""
    index_of: dict[int, int] = {}
    for i, node in enumerate(trace.nodes):
        if node.id in index_of:
            raise UsageError(f"{trace.path}: node {i} (id {node.id}): duplicate node id")
        index_of[node.id] = i
    missing = 0
    ctrl: list[set[int]] = []
    data: list[set[int]] = []
    for i, node in enumerate(trace.nodes):
        c = {index_of[d] for d in node.ctrl_deps if d in index_of}
        a = {index_of[d] for d in node.data_deps if d in index_of}
        missing += sum(1 for d in node.deps if d not in index_of)
        if i in a:
            raise UsageError(f"{trace.path}: node {i} (id {node.id}): depends on its own data")
        ctrl.append(c - {i})
        data.append(a)
    order, dropped = _topological(trace, ctrl, data)
    deps = [ctrl[i] | data[i] for i in range(len(trace.nodes))]
    position = {i: k for k, i in enumerate(order)}
    ops = []
    pace = (spec.npu_factor(rank), spec.jitter(rank))  # (a compute phase's draws in this order)
    for k, i in enumerate(order):
        node = trace.nodes[i]
        where = f"{trace.path}: node {i} (id {node.id}, {node.type_name} {node.name!r})"
        op = _op(node, topology, rank, spec, groups, where, pace)
        ops.append(
            Op(
                k,
                node.id,
                op.kind,
                tuple(sorted(position[d] for d in deps[i])),
                op.delay_ns,
                op.compute,
                op.resource,
                op.collective,
                op.peer,
                op.path,
                op.nbytes,
                op.tag,
            )
        )
    return Plan(trace.path, rank, ops, missing, dropped)


def _op(
    node: Node,
    topology: Topology,
    rank: int,
    spec: TrainingSpec,
    groups: dict,
    where: str,
    pace: tuple[float, Iterator],
) -> Op:
    """A node's op on NPU `rank`; its time scaled as a text workload's (`TrainingSpec.scaled_ns`).

    `pace`: the NPU's factor (a straggler's), which every delay takes with the compute scale,
    and its jitter stream, whose next draw a GPU compute node (a compute phase) takes too.
    """
    comp = node.type == COMP_NODE
    overlap = comp and node.attr("themis_overlap", False) is True
    cpu = comp and node.attr("is_cpu_op", False) is True
    phase = comp and not (overlap or cpu)
    delay = spec.scaled_ns(duration_ns(node, where), pace[0], pace[1] if phase else None)
    if comp:
        if overlap:
            return Op(0, node.id, DELAY, delay_ns=delay)
        return Op(0, node.id, DELAY, delay_ns=delay, compute=not cpu, resource="cpu" if cpu else "gpu")
    if node.type == COMM_COLL_NODE:
        if not node.has_attr("comm_type"):  # a CPU-side launch op
            return Op(0, node.id, DELAY, delay_ns=delay)
        comm_type = _int_attr(node, "comm_type", where)
        if comm_type == BROADCAST:
            return Op(0, node.id, DELAY, delay_ns=delay)
        if comm_type not in COLLECTIVE_OPS:
            name = COMM_TYPES.get(comm_type, str(comm_type))
            raise UsageError(
                f"{where}: collective {name} is not supported "
                "(all-reduce, reduce-scatter, all-gather, all-to-all, broadcast)"
            )
        coll = _collective(node, topology, rank, spec, groups, where)
        return Op(0, node.id, COLL, collective=coll) if coll is not None else Op(0, node.id, NOP)
    if node.type in (COMM_SEND_NODE, COMM_RECV_NODE):
        return _message(node, topology, rank, spec, where) or Op(0, node.id, NOP)
    if node.type in NODE_TYPES:
        return Op(0, node.id, NOP)
    raise UsageError(f"{where}: unknown node type {node.type}")


def _topological(trace: EtTrace, ctrl: list[set[int]], data: list[set[int]]) -> tuple[list[int], int]:
    """Kahn's order, ready nodes in file order; returns it and the ctrl deps dropped.

    Some traces (PyTorch's older converter) use ``ctrl_deps`` for the parent op, which makes
    cycles. When nothing is ready, the first waiting node in file order that waits on a ctrl
    dep loses its unmet ctrl deps (removed from `ctrl`, counted). A cycle of data deps alone is
    refused, naming one of its nodes. Linear in nodes and dependencies, however many cycles.
    """
    n = len(ctrl)
    waiting = [len(ctrl[i] | data[i]) for i in range(n)]
    users: list[list[int]] = [[] for _ in range(n)]
    for i in range(n):
        for d in ctrl[i] | data[i]:
            users[d].append(i)
    finished = [False] * n
    ready = [i for i in range(n) if waiting[i] == 0]
    heapq.heapify(ready)
    order: list[int] = []
    dropped = 0
    scan = 0  # nodes before it are finished or wait on data deps only, and stay so: linear in all
    while len(order) < n:
        if not ready:
            while scan < n and (finished[scan] or all(finished[d] for d in ctrl[scan])):
                scan += 1
            stuck = scan if scan < n else None
            if stuck is None:
                first = next(i for i in range(n) if not finished[i])
                node = trace.nodes[first]
                raise UsageError(f"{trace.path}: node {first} (id {node.id}): cycle of data dependencies")
            unmet = {d for d in ctrl[stuck] if not finished[d]}
            ctrl[stuck] -= unmet
            dropped += len(unmet)
            for d in unmet:
                users[d].remove(stuck)
                if d not in data[stuck]:
                    waiting[stuck] -= 1
            if waiting[stuck] == 0:
                heapq.heappush(ready, stuck)
            continue
        i = heapq.heappop(ready)
        finished[i] = True
        order.append(i)
        for u in users[i]:
            waiting[u] -= 1
            if waiting[u] == 0:
                heapq.heappush(ready, u)
    return order, dropped


def graph_collectives(
    graph: Graph, topology: Topology, spec: TrainingSpec, ranks: Sequence[int]
) -> list[Collective]:
    """Every distinct collective the given ranks issue, in rank then node order.

    Every rank calls this with the same ranks before the first collective, so every rank knows
    the same list (the chunk orders are broadcast for it at once), and a graph that does not fit
    the topology is refused everywhere before MPI starts.
    """
    out: dict[Collective, None] = {}
    simple = graph.symmetric and not any(
        n.type in (COMM_SEND_NODE, COMM_RECV_NODE) or n.attr("pg_name", "") not in ("", "0")
        for n in graph.traces[0].nodes
    )
    for rank in [0] if simple else ranks:
        if not 0 <= rank < topology.npus:
            continue
        if not graph.symmetric and rank >= len(graph.traces):
            raise UsageError(
                f"{graph.source}: {len(graph.traces)} per-rank traces, "
                f"but the topology has {topology.npus} NPUs"
            )
        for op in plan_graph(graph.trace(rank), topology, rank, spec, graph.groups).ops:
            if op.collective is not None:
                for part in partitions(op.collective, spec, topology.group_npus(op.collective.dims)):
                    out.setdefault(part)
    return list(out)


# --- replay ------------------------------------------------------------------------------------


class Resource:
    """One unit that runs one node at a time; waiting nodes go in order of node id."""

    def __init__(self) -> None:
        self.busy = False
        self._waiting: list[tuple[int, int, Event]] = []

    def acquire(self, node_id: int, seq: int) -> Event:
        """An event that triggers when this node holds the unit."""
        event = Event()
        if not self.busy:
            self.busy = True
            event.succeed()
        else:
            heapq.heappush(self._waiting, (node_id, seq, event))
        return event

    def release(self) -> None:
        """Hand the unit to the waiting node with the smallest id (now), or free it."""
        if self._waiting:
            heapq.heappop(self._waiting)[2].succeed()
        else:
            self.busy = False


def graph_needs(plan: Plan) -> dict[int, Need]:
    """Each collective's `Need`: its first compute consumer, through nodes that compute nothing.

    The first GPU compute node (in topological order) that depends on the collective, directly
    or through nodes that are no compute (a weight update, a CPU op, another collective), and the
    compute time before it in that order. Collectives nothing computes after are left out.
    """
    n = len(plan.ops)
    users: list[list[int]] = [[] for _ in range(n)]
    for op in plan.ops:
        for d in op.deps:
            users[d].append(op.index)
    first = [math.inf] * n  # the first compute node at or after each op, through non-compute ones
    for k in reversed(range(n)):
        for u in users[k]:
            first[k] = min(first[k], u if plan.ops[u].compute else first[u])
    compute_before = np.cumsum([0.0] + [op.delay_ns if op.compute else 0.0 for op in plan.ops])
    return {
        k: Need(int(first[k]), float(compute_before[int(first[k])]))
        for k, op in enumerate(plan.ops)
        if op.kind == COLL and first[k] < math.inf
    }


class _Waits:
    """A node waiting on a dependency: when that ends, it waits for its next ones (`GraphReplay._wait`)."""

    __slots__ = ("replay", "k", "j")

    def __init__(self, replay: GraphReplay, k: int, j: int):
        self.replay, self.k, self.j = replay, k, j

    def __call__(self, _: Event) -> None:
        self.replay._wait(self.k, self.j)


class GraphReplay:
    """One NPU's graph as engine processes: one per node, started in topological order.

    Args:
        plan: the NPU's ops (`plan_graph`).
        schedules: the schedule (chunk bounds, orders, queue policy) of every distinct collective.
        spec: with `topology`, slices collectives into partitions (``spec.partition_mib``).
        topology: the network (the group sizes of the partitions).
        progress: told each node finished, of all the NPU's nodes.
    """

    def __init__(
        self,
        plan: Plan,
        schedules: dict[Collective, Schedule],
        spec: TrainingSpec | None = None,
        topology: Topology | None = None,
        progress: Progress | None = None,
    ):
        self.plan, self.schedules = plan, schedules
        self.progress, self.nodes_done = progress, 0
        self.spec, self.topology = spec, topology
        self.collectives_issued = 0
        self.messages: list = []
        self.resources = {"cpu": Resource(), "gpu": Resource()}
        self.needs = plan.needs

    def process(self, engine: Engine) -> ProcessGenerator:
        """Start every node once the nodes it depends on have finished; end when the last has.

        A node waits on its first unfinished dependency, then on the next, as a process that
        yields each in turn does (at the same moments, in the same order), but its process is
        made only when it runs: an NPU holds an event per node, not a process (every NPU's
        links hold every NPU's graph at once, about 10,000 nodes each for GPT-3 on HGX).
        """
        self._done = [Event() for _ in self.plan.ops]
        self._engine = engine
        for op in self.plan.ops:
            self._wait(op.index, 0)
        yield from self._done

    def _wait(self, k: int, j: int) -> None:
        """Op `k` waits for its dependencies from its `j`-th on; then it runs, and its event marks its end."""
        deps, done = self.plan.ops[k].deps, self._done
        while j < len(deps):
            event = done[deps[j]]
            j += 1
            if not event.triggered:
                event.add_callback(_Waits(self, k, j))
                return
        run = self._engine.process(self._node(self._engine, self.plan.ops[k]))
        run.add_callback(lambda end: done[k].succeed(end.value, end.time_ns))

    def _node(self, engine: Engine, op: Op) -> ProcessGenerator:
        if op.kind == DELAY and op.delay_ns > 0:
            unit = self.resources.get(op.resource)
            if unit is not None:
                yield unit.acquire(op.node_id, op.index)
            yield engine.timeout(op.delay_ns)
            if unit is not None:
                unit.release()
        elif op.kind == COLL and op.collective is not None:
            coll, need = op.collective, self.needs.get(op.index, UNKNOWN)
            parts = [coll]
            if self.spec is not None and self.topology is not None:
                parts = partitions(coll, self.spec, self.topology.group_npus(coll.dims))
            self.collectives_issued += len(parts)
            yield from [engine.issue(part, self.schedules[part], need=need) for part in parts]
        elif op.kind in (SEND, RECV):
            peer, path = op.peer, op.path
            if self.plan.shift:  # (another rank's plan, shared: its peers move, and so may their routes)
                assert self.topology is not None, "a shifted plan's replay needs its topology"
                peer += self.plan.shift
                path = message_path(self.topology, self.plan.rank, peer)
            run = engine.message(peer, path, op.nbytes, op.tag, op.kind == SEND)
            self.messages.append(run)
            yield run.done
        self.nodes_done += 1
        tell(self.progress, self.nodes_done, len(self.plan.ops))
