"""SimAI/AICB's extended ASTRA-sim text workloads: the reader, their groups, their stages as graphs.

The header adds ``ep``, ``pp``, ``vpp``, ``ga``, ``all_gpus`` and ``pp_comm`` to
``HYBRID_TRANSFORMER_FWD_IN_BCKWD model_parallel_NPU_group: TP``; each layer line is ``name
reserved fwd_ns fwd_type fwd_bytes ig_ns ig_type ig_bytes wg_ns wg_type wg_bytes update_ns``.
A collective's group comes from its phase and suffix, as SimAI's ``Workload.cc`` reads them:
forward and input-gradient collectives run on the TP group, weight-gradient ones on DP; ``_EP``
names the expert group and ``_DP_EP`` the experts' data-parallel group (DP / EP). Sizes are
SimAI's (an all-gather's output), written as the replay's (an all-gather's input per NPU).

AICB writes the ``ga`` micro-batches out (``embedding_layer`` appears ``ga`` times), so the file
is one stage's whole iteration. `simai_graph` writes it as a symmetric Chakra graph: the forward
of every line (its compute, then its collective, waited for), the backward in reverse
(input-gradient compute and collective, weight-gradient compute), then every weight-gradient
collective in file order. That is the replay of a file with ``pp`` 1.

With ``pp`` > 1, `simai_traces` replays the pipeline: the file splits at its ``embedding_layer``
lines into ``ga`` micro-batches (the lines before the first and after the last micro-batch are
the step's: gradient norms, optimizer), every one of the ``pp`` stages runs the same file (AICB
writes one stage), and the micro-batches flow through the stages under 1F1B with a
``pp_comm``-byte message per micro-batch across each stage boundary, forward and backward, by
the generated-GPT path's schedule and builder (`llm.message_units`, `llm._Builder`)
(docs/workloads.md#simais-workloads).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from ..errors import UsageError, shown
from ..limits import MAX_NPUS, MAX_SIZE_BYTES, MAX_TIME_NS
from .et import COMM_COLL_NODE, COMP_NODE, Attr, EtTrace, Node
from .llm import Layout, _Builder, message_units

OPS = {"ALLREDUCE": 0, "ALLGATHER": 2, "ALLTOALL": 6, "REDUCESCATTER": 7}
GROUPS = ("TP", "EP", "DP", "DP_EP")
HEADER_KEYS = (
    "model_parallel_NPU_group",
    "ep",
    "pp",
    "vpp",
    "ga",
    "all_gpus",
    "checkpoints",
    "checkpoint_initiates",
)
# Each header value's range (others: 0 up to `MAX_NPUS`): parallel degrees and counts are >= 1.
HEADER_RANGES = {
    **dict.fromkeys(("model_parallel_NPU_group", "ep", "pp", "vpp", "ga", "all_gpus"), (1, MAX_NPUS)),
    "pp_comm": (0, MAX_SIZE_BYTES),
}
# Layer lines of a file: AICB's hold a few thousand; more is refused (docs/workloads.md#simais-workloads).
MAX_SIMAI_LINES = 100_000
MAX_LINE_BYTES = 4096  # a layer line is 12 short fields
_INT = re.compile(r"-?[0-9]{1,18}")  # (a longer one is out of every range)


@dataclass(frozen=True)
class SimaiLayer:
    """One layer line: compute times in ns, collective types and sizes in bytes per phase."""

    name: str
    fwd_ns: float
    fwd: tuple[str, int]
    ig_ns: float
    ig: tuple[str, int]
    wg_ns: float
    wg: tuple[str, int]
    update_ns: float


@dataclass
class SimaiWorkload:
    """A SimAI workload file: its header numbers and its layers."""

    path: str
    tp: int
    ep: int
    pp: int
    vpp: int
    ga: int
    all_gpus: int
    pp_comm: int
    layers: list[SimaiLayer] = field(default_factory=list)

    @property
    def dp(self) -> int:
        """Data parallelism: all_gpus / (TP * PP)."""
        return self.all_gpus // (self.tp * self.pp)


def _lines(path: str) -> Iterator[tuple[int, list[str]]]:
    """(line number, tokens) of each line, read a line at a time; a line that is no text is refused."""
    try:
        with open(path, "rb") as f:
            for n, raw in enumerate(iter(lambda: f.readline(MAX_LINE_BYTES + 1), b""), start=1):
                if len(raw) > MAX_LINE_BYTES:
                    raise UsageError(
                        f"{path}:{n}: a line longer than {MAX_LINE_BYTES} bytes; not a SimAI workload"
                    )
                try:
                    yield n, raw.decode("utf-8").split()
                except UnicodeDecodeError as exc:
                    raise UsageError(
                        f"{path}:{n}: not text (byte 0x{raw[exc.start]:02x} at column {exc.start + 1}); "
                        "a SimAI workload is a text file"
                    ) from None
    except OSError as exc:
        raise UsageError(f"cannot read SimAI workload {path}: {exc.strerror or exc}") from None


def _integer(token: str, what: str, lo: int, hi: int, where: str, why: str = "") -> int:
    """An integer token in [lo, hi]; one line naming the field and the range (and `why`) otherwise."""
    if not _INT.fullmatch(token) or not lo <= int(token) <= hi:
        raise UsageError(f"{where}: {what} must be an integer between {lo} and {hi}{why}, got {shown(token)}")
    return int(token)


def _time_ns(token: str, what: str, where: str) -> float:
    """A compute time in ns: a finite number between 0 and a day."""
    try:
        value = float(token)
    except ValueError:
        value = math.nan
    if not 0 <= value <= MAX_TIME_NS:  # (NaN fails it)
        raise UsageError(
            f"{where}: {what} must be a time between 0 and {MAX_TIME_NS:g} ns, got {shown(token)}"
        )
    return value


def _collective(tokens: list[str], at: int, phase: str, where: str) -> tuple[str, int]:
    """A phase's (type, bytes): a known type, and a size between 0 and `MAX_SIZE_BYTES`."""
    kind = tokens[at]
    if kind != "NONE" and split_type(kind, phase)[0] not in OPS:
        raise UsageError(
            f"{where}: {phase} collective type {shown(kind)} is unknown "
            f"(NONE, or {', '.join(OPS)} with an optional _EP or _DP_EP)"
        )
    return kind, _integer(tokens[at + 1], f"{phase} collective bytes", 0, MAX_SIZE_BYTES, where)


def parse_simai(path: str) -> SimaiWorkload:
    """Read a SimAI workload file; a malformed one is refused with one line naming file, line and field.

    Every number is checked as it is read (sizes, times and header values in range, finite), and
    a file of more than `MAX_SIMAI_LINES` layer lines is refused from its second line on.
    """
    lines = _lines(path)
    _, first = next(lines, (1, []))
    if not first or first[0] != "HYBRID_TRANSFORMER_FWD_IN_BCKWD":
        raise UsageError(f"{path}:1: a SimAI workload starts with HYBRID_TRANSFORMER_FWD_IN_BCKWD")
    head = first[1:]
    values: dict[str, int] = {}
    for i in range(0, len(head), 2):
        key = head[i].rstrip(":")
        if i + 1 >= len(head):
            raise UsageError(f"{path}:1: header key {shown(key)} has no value")
        lo, hi = HEADER_RANGES.get(key, (0, MAX_NPUS))
        values[key] = _integer(head[i + 1], f"header {key}", lo, hi, f"{path}:1")
    tp = values.get("model_parallel_NPU_group")
    if tp is None or "all_gpus" not in values:
        raise UsageError(f"{path}:1: the header needs model_parallel_NPU_group: and all_gpus:")
    wl = SimaiWorkload(
        path,
        tp,
        values.get("ep", 1),
        values.get("pp", 1),
        values.get("vpp", 1),
        values.get("ga", 1),
        values["all_gpus"],
        values.get("pp_comm", 0),
    )
    if wl.all_gpus % (wl.tp * wl.pp) or wl.dp % wl.ep:
        raise UsageError(
            f"{path}:1: TP {wl.tp} x PP {wl.pp} must divide all_gpus {wl.all_gpus}, and EP {wl.ep} the DP"
        )
    _, second = next(lines, (2, []))
    if not second:
        raise UsageError(f"{path}:2: expected the number of layers")
    cap = " (a cap of this reader: AICB's files hold a few thousand)"
    count = _integer(second[0], "the number of layers", 1, MAX_SIMAI_LINES, f"{path}:2", cap)
    for n, t in lines:
        if not t:
            continue
        where = f"{path}:{n}"
        if len(wl.layers) == count:
            raise UsageError(f"{where}: more layer lines than the {count} the header says")
        if len(t) != 12:
            raise UsageError(f"{where}: a layer line has 12 fields, got {len(t)}")
        wl.layers.append(
            SimaiLayer(
                t[0],
                _time_ns(t[2], "fwd compute time", where),
                _collective(t, 3, "fwd", where),
                _time_ns(t[5], "ig compute time", where),
                _collective(t, 6, "ig", where),
                _time_ns(t[8], "wg compute time", where),
                _collective(t, 9, "wg", where),
                _time_ns(t[11], "update time", where),
            )
        )
    if len(wl.layers) != count:
        raise UsageError(f"{path}: the header says {count} layers, the file has {len(wl.layers)}")
    return wl


def split_type(kind: str, phase: str) -> tuple[str, str]:
    """(op, group) of a collective type in a phase: ALLTOALL_EP -> (ALLTOALL, EP); wg without suffix -> DP."""
    for suffix in ("_DP_EP", "_EP"):
        if kind.endswith(suffix):
            return kind[: -len(suffix)], suffix[1:]
    return kind, "DP" if phase == "wg" else "TP"


def group_sizes(wl: SimaiWorkload) -> dict[str, int]:
    """NPUs of each group."""
    return {"TP": wl.tp, "EP": wl.ep, "DP": wl.dp, "DP_EP": wl.dp // wl.ep}


def census(wl: SimaiWorkload) -> dict[tuple[str, str], tuple[int, int]]:
    """(group, op) -> (collectives, bytes) of one iteration (the file's lines, once each)."""
    out: dict[tuple[str, str], tuple[int, int]] = {}
    for layer in wl.layers:
        for phase, (kind, size) in (("fwd", layer.fwd), ("ig", layer.ig), ("wg", layer.wg)):
            if kind == "NONE" or size <= 0:
                continue
            op, group = split_type(kind, phase)
            n, b = out.get((group, op), (0, 0))
            out[(group, op)] = (n + 1, b + size)
    return out


def simai_graph(wl: SimaiWorkload, layout: Layout, drop: frozenset[str] = frozenset()) -> EtTrace:
    """One stage's iteration as a symmetric graph on the layout's topology (`drop`: groups left out)."""
    n_dims = len(layout.topology.dims)
    dims = {"TP": layout.tp, "EP": layout.ep, "DP": layout.dp, "DP_EP": layout.edp}
    sizes = group_sizes(wl)
    nodes: list[Node] = []

    def add(name: str, kind: int, attrs: list[Attr]) -> None:
        nodes.append(Node(len(nodes) + 1, name, kind, [len(nodes)] if nodes else [], attrs=attrs))

    def comp(name: str, ns: float) -> None:
        if ns > 0:
            add(name, COMP_NODE, [Attr("is_cpu_op", "bool", False), Attr("themis_duration_ns", "double", ns)])

    def coll(name: str, kind: str, size: int, phase: str) -> None:
        if kind == "NONE" or size <= 0:
            return
        op, group = split_type(kind, phase)
        if group in drop or sizes[group] <= 1:
            return
        per_npu = size // sizes[group] if op == "ALLGATHER" else size
        involved = [d in dims[group] for d in range(n_dims)]
        attrs = [
            Attr("comm_type", "int64", OPS[op]),
            Attr("comm_size", "int64", per_npu),
            Attr("involved_dim", "bool", involved, is_list=True),
            Attr("themis_parallelism", "string", group),
        ]
        add(name, COMM_COLL_NODE, attrs)

    for i, layer in enumerate(wl.layers):
        comp(f"l{i}.fwd", layer.fwd_ns)
        coll(f"l{i}.fwd.{layer.fwd[0]}", *layer.fwd, "fwd")
    for i, layer in reversed(list(enumerate(wl.layers))):
        comp(f"l{i}.ig", layer.ig_ns)
        coll(f"l{i}.ig.{layer.ig[0]}", *layer.ig, "ig")
        comp(f"l{i}.wg", layer.wg_ns)
    for i, layer in enumerate(wl.layers):
        coll(f"l{i}.wg.{layer.wg[0]}", *layer.wg, "wg")
    return EtTrace(wl.path, "0.0.4", [Attr("themis_generator", "string", "simai")], nodes)


# --- the pipeline (pp > 1) -------------------------------------------------------------------------

BUILDER_GROUPS = {"TP": "tp", "EP": "ep", "DP": "dp", "DP_EP": "edp"}


@dataclass(frozen=True)
class Pipeline:
    """A file cut into its micro-batches: the step's lines before and after them, and each one's lines."""

    head: list[SimaiLayer]
    micro_batches: list[list[SimaiLayer]]
    tail: list[SimaiLayer]

    @property
    def split(self) -> bool:
        """Whether the file cut into more than one micro-batch (else it replays as one)."""
        return len(self.micro_batches) > 1


def split_micro_batches(wl: SimaiWorkload) -> Pipeline:
    """Cut at the ``ga`` ``embedding_layer`` lines; micro-batches whose line names differ give one."""
    starts = [i for i, layer in enumerate(wl.layers) if layer.name == "embedding_layer"]
    if len(starts) != wl.ga or wl.ga < 1:
        return Pipeline([], [list(wl.layers)], [])
    size = starts[1] - starts[0] if wl.ga > 1 else len(wl.layers) - starts[0]
    blocks = [wl.layers[i : i + size] for i in starts]
    names = [layer.name for layer in blocks[0]]
    if any(len(b) != size or [layer.name for layer in b] != names for b in blocks):
        return Pipeline([], [list(wl.layers)], [])
    return Pipeline(wl.layers[: starts[0]], blocks, wl.layers[starts[-1] + size :])


def chunk_lines(block: list[SimaiLayer], chunks: int) -> list[list[SimaiLayer]]:
    """A micro-batch's lines in `chunks` contiguous parts whose lengths differ by at most one line."""
    n = len(block)
    return [block[c * n // chunks : (c + 1) * n // chunks] for c in range(chunks)]


def check_schedule(wl: SimaiWorkload, pipe: Pipeline, schedule: str, chunks: int) -> None:
    """Refuse a schedule the file cannot run, with one line."""
    m, lines = len(pipe.micro_batches), len(pipe.micro_batches[0])
    if schedule == "interleaved" and m % wl.pp:
        raise UsageError(f"interleaved needs micro-batches ({m}) divisible by PP {wl.pp}")
    if chunks > lines:
        raise UsageError(f"interleaved:{chunks} needs at least {chunks} lines per micro-batch, got {lines}")


def stage_graph(
    wl: SimaiWorkload,
    pipe: Pipeline,
    layout: Layout,
    rank: int,
    drop: frozenset[str] = frozenset(),
    schedule: tuple[str, int] = ("1f1b", 1),
) -> list[Node]:
    """One rank's nodes: its stage's schedule over the micro-batches with their messages, then the step.

    Under ``interleaved:V`` every micro-batch's lines are V chunks (`chunk_lines`), chunk c of
    stage s being virtual stage c * PP + s, as `llm.rank_graph` runs the generated GPT's.
    """
    stride = wl.tp * wl.dp  # Megatron's order: TP fastest, then DP, then PP
    s, p, m = stage_of(wl, rank), wl.pp, len(pipe.micro_batches)
    name, v_chunks = schedule
    chunked = [chunk_lines(block, v_chunks) for block in pipe.micro_batches]
    last = v_chunks * p - 1
    sizes = group_sizes(wl)
    b = _Builder(layout, drop)

    def comp(name: str, ns: float) -> None:
        if ns > 0:
            b.comp(name, ns)

    def coll(name: str, kind: str, size: int, phase: str) -> None:
        if kind == "NONE" or size <= 0:
            return
        op, group = split_type(kind, phase)
        if sizes[group] <= 1:
            return
        per_npu = size // sizes[group] if op == "ALLGATHER" else size
        b.coll(name, OPS[op], per_npu, BUILDER_GROUPS[group], group)

    def forward(where: str, layers: list[SimaiLayer]) -> None:
        for i, layer in enumerate(layers):
            comp(f"{where}.l{i}.fwd", layer.fwd_ns)
            coll(f"{where}.l{i}.fwd.{layer.fwd[0]}", *layer.fwd, "fwd")

    def backward(where: str, layers: list[SimaiLayer]) -> None:
        for i, layer in reversed(list(enumerate(layers))):
            comp(f"{where}.l{i}.ig", layer.ig_ns)
            coll(f"{where}.l{i}.ig.{layer.ig[0]}", *layer.ig, "ig")
            comp(f"{where}.l{i}.wg", layer.wg_ns)

    def peer(vstage: int) -> int:
        return rank + (vstage % p - s) * stride

    def tag(kind: str, mb: int, vstage: int) -> int:
        return (mb * (last + 1) + vstage) * 2 + (kind == "B")

    act = wl.pp_comm
    for unit in message_units(name, p, s, m, v_chunks):
        for kind, mb, chunk in unit:  # receives join the batch of the previous unit's sends
            vs = chunk * p + s
            if kind == "F" and vs > 0:
                b.message(f"recv.a{mb}.s{vs}", False, rank, peer(vs - 1), act, tag("F", mb, vs))
            if kind == "B" and vs < last:
                b.message(f"recv.g{mb}.s{vs}", False, rank, peer(vs + 1), act, tag("B", mb, vs + 1))
        for kind, mb, chunk in unit:
            if kind == "F":
                forward(f"F{mb}.c{chunk}", chunked[mb][chunk])
            else:
                backward(f"B{mb}.c{chunk}", chunked[mb][chunk])
        b.flush()
        for kind, mb, chunk in unit:
            vs = chunk * p + s
            if kind == "F" and vs < last:
                b.message(f"send.a{mb}.s{vs}", True, rank, peer(vs + 1), act, tag("F", mb, vs + 1))
            if kind == "B" and vs > 0:
                b.message(f"send.g{mb}.s{vs}", True, rank, peer(vs - 1), act, tag("B", mb, vs))
    b.flush()
    step = pipe.head + pipe.tail
    forward("step", step)
    backward("step", step)
    for i, layer in enumerate(wl.layers):
        coll(f"l{i}.wg.{layer.wg[0]}", *layer.wg, "wg")
    b.flush()
    return b.nodes


def stage_of(wl: SimaiWorkload, rank: int) -> int:
    """A rank's pipeline stage: Megatron's order, TP fastest, then DP, then PP."""
    return rank // (wl.tp * wl.dp)


class SimaiTraces(Sequence):
    """Every rank's trace of a pipelined SimAI file, built when first read (the model reads one per stage)."""

    def __init__(
        self,
        wl: SimaiWorkload,
        layout: Layout,
        drop: frozenset[str] = frozenset(),
        schedule: tuple[str, int] = ("1f1b", 1),
    ):
        self.wl, self.layout, self.drop, self.schedule = wl, layout, drop, schedule
        self.pipe = split_micro_batches(wl)
        check_schedule(wl, self.pipe, *schedule)
        self._made: dict[int, EtTrace] = {}

    def __len__(self) -> int:
        return self.wl.all_gpus

    def kind(self, rank: int) -> int:
        """What sets a rank's graph apart: its pipeline stage (its peers at the same rank offsets)."""
        return stage_of(self.wl, rank)

    def __getitem__(self, rank):
        if isinstance(rank, slice):
            return [self[r] for r in range(*rank.indices(len(self)))]
        if not 0 <= rank < len(self):  # (iteration, `list()`, stops here: `Sequence`'s protocol)
            raise IndexError(f"rank {rank} of {len(self)}")
        if rank not in self._made:
            nodes = stage_graph(self.wl, self.pipe, self.layout, rank, self.drop, self.schedule)
            attrs = [Attr("themis_generator", "string", "simai")]
            self._made[rank] = EtTrace(f"<{self.wl.path} rank {rank}>", "0.0.4", attrs, nodes)
        return self._made[rank]
