"""LLM training as per-rank Chakra graphs: tensor, pipeline, data and expert parallelism from a shape.

`LlmConfig` holds a model's shape (GPT/Llama-like decoder, optionally MoE) and its parallel
layout; `write_llm` writes one ET file per rank (``PREFIX.<rank>.et``) that `train PREFIX`
replays. Sizes follow Megatron-LM's accounting (Narayanan et al., SC'21), ``e`` bytes per
element (docs/workloads.md#llm-training-generated-from-a-models-shape):

- TP: per layer and micro-batch, 2 all-reduces of ``b*S*H*e`` bytes forward and 2 backward
  (2 more with recompute, whose forward repeats them);
- PP: ``b*S*H*e`` bytes per micro-batch across each stage boundary, forward and backward;
- DP: each rank's gradients (its stage's parameters / TP) all-reduced once the pipeline has
  drained, or with ``overlap_dp`` (Megatron's ``--overlap-grad-reduce``) one bucket per layer
  (the stage's gradients split evenly) issued after the layer's last backward and waited for
  before the step, so that they run beside the last backward's compute and messages; ZeRO-1/2
  reduce-scatter them and all-gather the parameters after the step; ZeRO-3
  reduce-scatters them and all-gathers each layer's parameters before its forward and backward
  of every micro-batch;
- EP: per MoE layer and micro-batch, an all-to-all of ``b*S*H*k*e`` bytes to dispatch tokens
  and one to combine them, forward and backward; experts' gradients are reduced over DP / EP;
- FLOPs per iteration ``6*P*T + 12*L*S*H*T`` (``8*P*T + 16*L*S*H*T`` with recompute), P the
  parameters a token meets (the input embedding excluded, k of X experts), T tokens.

The pipeline schedule (gpipe, 1f1b, interleaved:V) is written into the files: each rank's graph
is a chain of steps in its schedule's order, every step waiting for the previous one; the sends
after a compute and the receives before the next go together in one step (Megatron's batched
``send_forward_recv_backward``). Ranks are numbered TP fastest, then DP, then PP by default
(Megatron's order, ``order="tp-dp-pp"``): TP takes the first dims, DP the next, PP the
outermost; another order (e.g. ``tp-pp-dp``) places the groups inner to outer as it lists them.
A dim is split where a group ends inside it (`fit_groups`).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from ..errors import UsageError
from ..limits import MAX_NPUS, MAX_SIZE_BYTES, MAX_TIME_NS, in_range
from ..topology import Dim, Topology
from .et import COMM_COLL_NODE, COMM_RECV_NODE, COMM_SEND_NODE, COMP_NODE, Attr, EtTrace, Node, write_et

ALL_REDUCE, ALL_GATHER, ALL_TO_ALL, REDUCE_SCATTER = 0, 2, 6, 7
# Each shape flag's range (`check_config`): wider than any model trained so far. The degrees come
# first, so that a default made of them (the global batch) is never blamed for them.
RANGES: dict[str, tuple[int, int]] = {
    **dict.fromkeys(("tp", "pp", "dp", "ep"), (1, MAX_NPUS)),
    "layers": (1, 1 << 20),
    "hidden": (1, 1 << 20),
    "heads": (1, 1 << 16),
    "seq": (1, 1 << 24),
    "vocab": (0, 1 << 24),  # 0: no embedding or output layer
    "ffn": (0, 1 << 24),  # 0: 4 * hidden
    "experts": (0, 1 << 16),  # 0: dense
    "topk": (1, 1 << 16),
    "micro_batch": (1, 1 << 20),
    "global_batch": (1, 1 << 40),
    "bytes_per_element": (1, 16),
}
MAX_VIRTUAL_CHUNKS = 1024  # interleaved:V
MIN_TFLOPS, MAX_TFLOPS = 1e-6, 1e9  # --peak-tflops
# One rank's graph (`rank_nodes`): the GPT-3 175B preset on 8 x 8 x 16 GPUs holds about 10,000
# nodes, and building a million takes tens of seconds, so a shape past it is refused.
MAX_LLM_NODES = 1_000_000
SCHEDULES = ("gpipe", "1f1b", "interleaved")
PARALLELISMS = ("TP", "PP", "DP", "EP")
GROUPS = ("tp", "dp", "pp")
DEFAULT_ORDER = "tp-dp-pp"  # Megatron-LM: TP fastest, then DP, then PP


@dataclass(frozen=True)
class LlmConfig:
    """A decoder-only model's shape and its parallel layout (flags of `themis-mpi workload gpt`)."""

    layers: int
    hidden: int
    heads: int
    seq: int
    vocab: int
    micro_batch: int
    global_batch: int
    tp: int = 1
    pp: int = 1
    dp: int = 1
    ep: int = 1
    experts: int = 0
    topk: int = 1
    ffn: int = 0  # 0: 4 * hidden
    zero: int = 0
    schedule: str = "1f1b"
    chunks: int = 1  # virtual pipeline chunks per device (interleaved:V)
    recompute: bool = False
    overlap_dp: bool = False  # gradients reduced layer by layer during the last backward
    peak_tflops: float = 989.0
    efficiency: float = 0.5
    bytes_per_element: int = 2
    order: str = DEFAULT_ORDER  # the groups inner to outer: which takes the first dims

    def __post_init__(self) -> None:
        check_config(self)

    @property
    def ffn_hidden(self) -> int:
        """The MLP's hidden size."""
        return self.ffn or 4 * self.hidden

    @property
    def moe(self) -> bool:
        """Whether every layer's MLP is a mixture of experts."""
        return self.experts > 0

    @property
    def npus(self) -> int:
        """TP * PP * DP."""
        return self.tp * self.pp * self.dp

    @property
    def strides(self) -> dict[str, int]:
        """Rank stride of each group ("tp", "dp", "pp") under `order`: 1 for the innermost."""
        return group_strides(parse_order(self.order), {"tp": self.tp, "dp": self.dp, "pp": self.pp})

    @property
    def micro_batches(self) -> int:
        """Micro-batches per iteration on each pipeline: B / (b * DP)."""
        return self.global_batch // (self.micro_batch * self.dp)

    @property
    def tokens(self) -> int:
        """Tokens per iteration: B * S."""
        return self.global_batch * self.seq

    @property
    def attention_params(self) -> int:
        """Parameters of one layer's attention (QKV and output projections): 4 H^2."""
        return 4 * self.hidden * self.hidden

    @property
    def mlp_params(self) -> int:
        """Parameters of one MLP (or one expert): 2 H F."""
        return 2 * self.hidden * self.ffn_hidden

    @property
    def layer_params(self) -> int:
        """Parameters one layer holds (all its experts)."""
        return self.attention_params + self.mlp_params * (self.experts if self.moe else 1)

    @property
    def active_layer_params(self) -> int:
        """Parameters of one layer a token meets (k experts)."""
        return self.attention_params + self.mlp_params * (self.topk if self.moe else 1)

    @property
    def params(self) -> int:
        """Parameters in all: L layers, the input embedding and the (untied) output layer, V H each."""
        return self.layers * self.layer_params + 2 * self.vocab * self.hidden

    @property
    def flop_params(self) -> int:
        """P of the FLOP formula: what a token multiplies by (no embedding lookup)."""
        return self.layers * self.active_layer_params + self.vocab * self.hidden

    @property
    def flops(self) -> float:
        """FLOPs per iteration: 6 P T + 12 L S H T, or 8 P T + 16 L S H T with recompute."""
        k = 4 if self.recompute else 3
        attention = 4 * k * self.layers * self.seq * self.hidden * self.tokens
        return 2 * k * self.flop_params * self.tokens + attention

    @property
    def activation_bytes(self) -> int:
        """Bytes b * S * H * e of one micro-batch's activations (TP all-reduce, PP message)."""
        return self.micro_batch * self.seq * self.hidden * self.bytes_per_element

    @property
    def stages(self) -> int:
        """Virtual pipeline stages: PP * V."""
        return self.pp * self.chunks

    @property
    def layers_per_stage(self) -> int:
        """Layers per virtual stage."""
        return self.layers // self.stages

    def stage_params(self, stage: int) -> tuple[int, int]:
        """(dense, expert) parameters of a pipeline stage (all its chunks), over all TP ranks."""
        n = self.layers // self.pp
        dense = n * (self.attention_params + (0 if self.moe else self.mlp_params))
        expert = n * self.mlp_params * self.experts if self.moe else 0
        if stage == 0:
            dense += self.vocab * self.hidden
        if stage == self.pp - 1:
            dense += self.vocab * self.hidden
        return dense, expert

    def ns(self, flops: float) -> float:
        """Time of `flops` on one NPU at ``peak_tflops * efficiency``, in ns."""
        return flops / (self.peak_tflops * self.efficiency * 1e3)

    @property
    def layer_forward_ns(self) -> float:
        """One layer's forward of one micro-batch on one TP rank."""
        t = self.micro_batch * self.seq
        return self.ns((2 * self.active_layer_params * t + 4 * self.seq * self.hidden * t) / self.tp)

    @property
    def head_forward_ns(self) -> float:
        """The output layer's forward of one micro-batch on one TP rank (last stage)."""
        return self.ns(2 * self.vocab * self.hidden * self.micro_batch * self.seq / self.tp)


def check_config(c: LlmConfig) -> None:
    """Refuse a shape out of range, one that does not divide, or a graph past the cap, with one line.

    The line names the flag (`RANGES`); the cap is `MAX_LLM_NODES` nodes in one rank's graph.
    """
    parse_order(c.order)
    for name, (lo, hi) in RANGES.items():  # the degrees first: a default below is made of them
        value = getattr(c, name)
        if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
            raise UsageError(
                f"--{name.replace('_', '-')} must be an integer between {lo} and {hi}, got {value!r}"
            )
    if c.schedule not in SCHEDULES:
        raise UsageError(f"unknown schedule {c.schedule!r}; use gpipe, 1f1b or interleaved:V")
    if isinstance(c.chunks, bool) or not isinstance(c.chunks, int) or not 1 <= c.chunks <= MAX_VIRTUAL_CHUNKS:
        raise UsageError(f"interleaved:V needs V between 1 and {MAX_VIRTUAL_CHUNKS}, got {c.chunks!r}")
    if c.zero not in (0, 1, 2, 3):
        raise UsageError(f"--zero must be 0, 1, 2 or 3, got {c.zero}")
    in_range("--peak-tflops", c.peak_tflops, MIN_TFLOPS, MAX_TFLOPS, "TFLOP/s")
    if not (isinstance(c.efficiency, (int, float)) and 0 < c.efficiency <= 1):  # (NaN fails it)
        raise UsageError(f"--efficiency must be in (0, 1], got {c.efficiency!r}")
    if c.hidden % c.heads:
        raise UsageError(f"hidden size {c.hidden} is not divisible by {c.heads} heads")
    if c.heads % c.tp:
        raise UsageError(f"{c.heads} heads do not divide by TP {c.tp}")
    if c.layers % (c.pp * c.chunks):
        what = f"PP {c.pp}" + (f" x {c.chunks} chunks" if c.chunks > 1 else "")
        raise UsageError(f"{c.layers} layers do not divide by {what}")
    if c.global_batch % (c.micro_batch * c.dp):
        raise UsageError(
            f"global batch {c.global_batch} does not divide by micro-batch {c.micro_batch} x DP {c.dp}"
        )
    if c.schedule == "interleaved" and c.micro_batches % c.pp:
        raise UsageError(f"interleaved needs micro-batches ({c.micro_batches}) divisible by PP {c.pp}")
    if c.schedule != "interleaved" and c.chunks != 1:
        raise UsageError("virtual chunks apply to the interleaved schedule only")
    if c.ep > 1 and not c.moe:
        raise UsageError("--ep needs --experts")
    if c.moe and (c.dp % c.ep or c.experts % c.ep):
        raise UsageError(f"EP {c.ep} must divide DP {c.dp} and the {c.experts} experts")
    if c.moe and not 1 <= c.topk <= c.experts:
        raise UsageError(f"--topk must be in 1..{c.experts}, got {c.topk}")
    check_size(c)


def check_size(c: LlmConfig) -> None:
    """Refuse a shape whose messages, gradients or kernels leave their ranges, or whose graph is too big."""
    biggest = max(
        c.activation_bytes * c.topk, max(sum(c.stage_params(s)) for s in (0, c.pp - 1)) * c.bytes_per_element
    )
    if biggest > MAX_SIZE_BYTES:
        raise UsageError(
            f"this shape moves {biggest} bytes in one collective; at most {MAX_SIZE_BYTES} (2^50): "
            "a smaller --hidden, --seq, --micro-batch or --ffn, or more --pp"
        )
    longest = max(c.layer_forward_ns * (3 if c.recompute else 2), c.head_forward_ns * 3)
    if longest > MAX_TIME_NS:
        raise UsageError(
            f"one kernel of this shape takes {longest:g} ns; at most {MAX_TIME_NS:g} (a day): "
            "a larger --peak-tflops or a smaller shape"
        )
    nodes = rank_nodes(c)
    if nodes > MAX_LLM_NODES:
        raise UsageError(
            f"one rank's graph of this shape holds up to {nodes} nodes ({c.micro_batches} micro-batches "
            f"of {c.layers_per_stage * c.chunks} layers per device); workload gpt builds at most "
            f"{MAX_LLM_NODES}: fewer --layers or a smaller --global-batch, or more --pp or --dp"
        )


def rank_nodes(c: LlmConfig) -> int:
    """At most how many nodes one rank's graph holds (`rank_graph`), from the shape alone.

    Per micro-batch, chunk and layer: the forward's two kernels, two TP all-reduces (TP > 1), two
    all-to-alls (EP > 1) and ZeRO-3's all-gathers (DP > 1); the backward's the same, twice with
    recompute; per micro-batch and chunk two heads and four messages (PP > 1); the gradient
    buckets of --overlap-dp and the step's collectives.
    """
    per_pass = 2 + 2 * (c.tp > 1) + 2 * (c.moe and c.ep > 1)
    gathers = (c.zero == 3) * ((c.dp > 1) + (c.moe and c.dp > c.ep))
    layer = 2 * gathers + per_pass * (3 if c.recompute else 2)
    units = c.micro_batches * c.chunks
    return units * (c.layers_per_stage * layer + 2 + 4 * (c.pp > 1)) + 2 * c.chunks * c.layers_per_stage + 4


def parse_order(text: str) -> tuple[str, ...]:
    """An order such as tp-dp-pp -> ("tp", "dp", "pp"): the groups inner to outer (tp, dp, pp once each)."""
    order = tuple(text.lower().split("-"))
    if sorted(order) != sorted(GROUPS):
        raise UsageError(
            f"--order must list tp, dp and pp once each, inner to outer (e.g. tp-dp-pp), got {text!r}"
        )
    return order


def group_strides(order: Sequence[str], sizes: dict[str, int]) -> dict[str, int]:
    """Rank stride of each group: the product of the sizes of the groups inner to it."""
    strides, stride = {}, 1
    for g in order:
        strides[g] = stride
        stride *= sizes[g]
    return strides


def parse_schedule(text: str) -> tuple[str, int]:
    """gpipe, 1f1b or interleaved:V -> (name, V)."""
    name, _, chunks = text.partition(":")
    if name == "interleaved":
        try:
            v = int(chunks or "2")
        except ValueError:
            raise UsageError(f"interleaved:V needs an integer V, got {chunks!r}") from None
        if v < 1:
            raise UsageError(f"interleaved:V needs V >= 1, got {v}")
        return name, v
    if name not in SCHEDULES or chunks:
        raise UsageError(f"unknown schedule {text!r}; use gpipe, 1f1b or interleaved:V")
    return name, 1


PRESETS: dict[str, dict] = {
    # GPT-3 175B (Brown et al. 2020): 96 layers, H 12288, 96 heads, S 2048, batch 1536 (Narayanan et al.)
    "gpt3-175b": dict(layers=96, hidden=12288, heads=96, seq=2048, vocab=51200, micro_batch=1,
                      global_batch=1536),
    # Llama-2 70B (Touvron et al. 2023) as a GPT-shaped layer of the same size: FFN 28672, S 4096
    "llama2-70b": dict(layers=80, hidden=8192, heads=64, seq=4096, vocab=32000, ffn=28672, micro_batch=1,
                       global_batch=1024),
    # Mixtral-8x7B-like MoE (Jiang et al. 2024): 32 layers, H 4096, FFN 14336, 8 experts, top-2
    "mixtral-8x7b": dict(layers=32, hidden=4096, heads=32, seq=4096, vocab=32000, ffn=14336, experts=8,
                         topk=2, micro_batch=1, global_batch=1024),
}  # fmt: skip


# --- schedules -----------------------------------------------------------------------------------


def stage_order(schedule: str, pp: int, stage: int, micro_batches: int, chunks: int = 1) -> list[tuple]:
    """One device's compute order: ("F" or "B", micro-batch, chunk), as Megatron-LM runs them."""
    m = micro_batches
    if schedule == "gpipe":
        return [("F", i, 0) for i in range(m)] + [("B", i, 0) for i in reversed(range(m))]
    if schedule == "1f1b":
        w = min(pp - stage - 1, m)
        order = [("F", i, 0) for i in range(w)]
        for i in range(m - w):
            order += [("F", w + i, 0), ("B", i, 0)]
        return order + [("B", i, 0) for i in range(m - w, m)]
    total = m * chunks  # interleaved (Megatron's forward_backward_pipelining_with_interleaving)

    def fwd(k: int) -> tuple:
        group, pos = divmod(k, pp * chunks)
        return ("F", group * pp + pos % pp, pos // pp)

    def bwd(k: int) -> tuple:
        group, pos = divmod(k, pp * chunks)
        return ("B", group * pp + pos % pp, chunks - 1 - pos // pp)

    w = in_flight_warmup(pp, stage, m, chunks)
    order = [fwd(k) for k in range(w)]
    for k in range(total - w):
        order += [fwd(w + k), bwd(k)]
    return order + [bwd(k) for k in range(total - w, total)]


def in_flight_warmup(pp: int, stage: int, micro_batches: int, chunks: int) -> int:
    """Forwards an interleaved device runs before its first backward (Megatron's warm-up)."""
    return min((pp - stage - 1) * 2 + (chunks - 1) * pp, micro_batches * chunks)


def message_units(
    schedule: str, pp: int, stage: int, micro_batches: int, chunks: int = 1
) -> list[list[tuple]]:
    """The stage's order in units whose messages go out as one batch.

    Each op alone, but for interleaved's steady phase: a forward and a backward back to back,
    as Megatron batches them.
    """
    order = stage_order(schedule, pp, stage, micro_batches, chunks)
    if schedule != "interleaved":
        return [[op] for op in order]
    total, w = micro_batches * chunks, in_flight_warmup(pp, stage, micro_batches, chunks)
    units = [[op] for op in order[:w]]
    units += [order[w + 2 * k : w + 2 * k + 2] for k in range(total - w)]
    return units + [[op] for op in order[w + 2 * (total - w) :]]


def in_flight(order: list[tuple]) -> int:
    """The most micro-batches (chunks) a device holds activations of at once: forwards not yet backward."""
    held = peak = 0
    for kind, _, _ in order:
        held += 1 if kind == "F" else -1
        peak = max(peak, held)
    return peak


# --- groups on the topology ----------------------------------------------------------------------


@dataclass(frozen=True)
class Layout:
    """Where the groups lie: the (split) topology and the dims of each group."""

    topology: Topology
    tp: tuple[int, ...]
    dp: tuple[int, ...]
    ep: tuple[int, ...]
    edp: tuple[int, ...]  # experts' data parallelism: DP / EP
    pp: tuple[int, ...]
    split: bool = field(default=False)


def fit_groups(c: LlmConfig, topology: Topology) -> Layout:
    """The groups on the dims in `c.order` (EP within DP); a dim splits where a group ends in it."""
    return place_groups(c.tp, c.ep, c.dp, c.pp, topology, parse_order(c.order))


def place_groups(
    tp: int, ep: int, dp: int, pp: int, topology: Topology, order: Sequence[str] = GROUPS
) -> Layout:
    """`fit_groups` for given degrees (EP the first EP ranks of DP), groups inner to outer in `order`."""
    npus = tp * dp * pp
    if topology.npus != npus:
        raise UsageError(
            f"TP {tp} x PP {pp} x DP {dp} = {npus} NPUs, but {topology.label()} has {topology.npus}"
        )
    sizes = {"tp": tp, "dp": dp, "pp": pp}
    stride = group_strides(order, sizes)
    ends: dict[int, str] = {}  # a boundary in rank space -> the groups inside it, for the error
    for i in range(1, len(order) + 1):
        ends.setdefault(stride[order[i - 1]] * sizes[order[i - 1]], " x ".join(g.upper() for g in order[:i]))
    ends.setdefault(stride["dp"] * ep, " x ".join([*(g.upper() for g in order[: order.index("dp")]), "EP"]))
    bounds = sorted(set(ends) - {1})
    dims: list[Dim] = []
    product = 1
    for dim in topology.dims:
        n = dim.npus
        for b in bounds:
            if product < b < product * n:
                if b % product or n % (b // product):
                    raise UsageError(
                        f"a group of {b} NPUs ({ends[b]}) ends inside dim {len(dims)} of {topology.label()} "
                        f"({n} NPUs after {product}): it cannot be split there"
                    )
                part = b // product
                dims.append(_resized(dim, part))
                product *= part
                n //= part
        dims.append(_resized(dim, n) if n != dim.npus else dim)
        product *= n
    topo = topology if len(dims) == len(topology.dims) else topology.with_dims(dims)
    edges, p = [1], 1
    for d in topo.dims:
        p *= d.npus
        edges.append(p)

    def span(lo: int, hi: int) -> tuple[int, ...]:
        n = len(topo.dims)
        return tuple(d for d in range(n) if edges[d] >= lo and edges[d + 1] <= hi and edges[d] < hi)

    def group(g: str) -> tuple[int, ...]:
        return span(stride[g], stride[g] * sizes[g])

    return Layout(
        topo,
        group("tp"),
        group("dp"),
        span(stride["dp"], stride["dp"] * ep),
        span(stride["dp"] * ep, stride["dp"] * dp),
        group("pp"),
        topo is not topology,
    )


def _resized(dim: Dim, npus: int) -> Dim:
    try:
        return replace(dim, npus=npus)
    except UsageError:
        return replace(dim, npus=npus, algorithm="")


# --- graphs --------------------------------------------------------------------------------------


class _Builder:
    """One rank's chain of steps: every node of a step waits for every node of the previous one."""

    def __init__(self, layout: Layout, drop: frozenset[str] = frozenset()):
        self.drop = drop
        self.nodes: list[Node] = []
        self.prev: list[int] = []
        self.batch: list[int] = []
        self.behind: list[int] = []  # collectives the chain does not wait for (`coll_behind`)
        self.involved = {}
        n = len(layout.topology.dims)
        for name in ("tp", "dp", "ep", "edp"):
            dims = getattr(layout, name)
            self.involved[name] = [d in dims for d in range(n)]

    def _add(self, name: str, kind: int, attrs: list[Attr], batched: bool = False) -> None:
        node = Node(len(self.nodes) + 1, name, kind, list(self.prev), attrs=attrs)
        self.nodes.append(node)
        if batched:
            self.batch.append(node.id)
        else:
            self.prev = [node.id]

    def flush(self) -> None:
        """Close the batch of messages: the next step waits for all of them."""
        if self.batch:
            self.prev, self.batch = self.batch, []

    def comp(self, name: str, ns: float) -> None:
        """A GPU kernel of `ns` ns."""
        self.flush()
        attrs = [Attr("is_cpu_op", "bool", False), Attr("themis_duration_ns", "double", float(ns))]
        self._add(name, COMP_NODE, attrs)

    def coll(self, name: str, op: int, nbytes: int, group: str, parallelism: str) -> None:
        """A collective on a group's dims; the next step waits for it."""
        self.flush()
        if nbytes <= 0 or not any(self.involved[group]) or parallelism in self.drop:
            return
        attrs = [
            Attr("comm_type", "int64", op),
            Attr("comm_size", "int64", int(nbytes)),
            Attr("involved_dim", "bool", self.involved[group], is_list=True),
            Attr("themis_parallelism", "string", parallelism),
        ]
        self._add(name, COMM_COLL_NODE, attrs)

    def coll_behind(self, name: str, op: int, nbytes: int, group: str, parallelism: str) -> None:
        """A collective that runs behind the steps after it; `join` waits for it."""
        self.flush()
        prev = self.prev
        self.coll(name, op, nbytes, group, parallelism)
        if self.prev is not prev:  # (issued)
            self.behind.append(self.prev[0])
            self.prev = prev

    def join(self) -> None:
        """The next step waits for the collectives running behind as well."""
        self.flush()
        self.prev, self.behind = self.prev + self.behind, []

    def message(self, name: str, send: bool, me: int, peer: int, nbytes: int, tag: int) -> None:
        """A send or receive in the open batch."""
        attrs = [
            Attr("comm_src", "int64", me if send else peer),
            Attr("comm_dst", "int64", peer if send else me),
            Attr("comm_size", "int64", int(nbytes)),
            Attr("comm_tag", "int64", tag),
            Attr("themis_parallelism", "string", "PP"),
        ]
        self._add(name, COMM_SEND_NODE if send else COMM_RECV_NODE, attrs, batched=True)


def rank_coords(c: LlmConfig, rank: int) -> tuple[int, int, int]:
    """(tp, dp, pp) of a rank under `c.order` (by default TP fastest, then DP, then PP)."""
    st = c.strides
    return rank // st["tp"] % c.tp, rank // st["dp"] % c.dp, rank // st["pp"] % c.pp


def rank_graph(c: LlmConfig, layout: Layout, rank: int, drop: frozenset[str] = frozenset()) -> list[Node]:
    """One rank's nodes: its stage's schedule, then the data-parallel step (`drop`: collectives left out)."""
    _, _, s = rank_coords(c, rank)
    pp_stride = c.strides["pp"]
    b = _Builder(layout, drop)
    m, p, v_chunks, e = c.micro_batches, c.pp, c.chunks, c.bytes_per_element
    act = c.activation_bytes
    n = c.layers_per_stage
    zero3 = c.zero == 3
    dense_shard = (c.attention_params + (0 if c.moe else c.mlp_params)) * e // (c.tp * c.dp)
    expert_shard = c.mlp_params * c.experts * e // (c.tp * c.dp) if c.moe else 0  # X/EP experts over DP/EP
    fwd, head = c.layer_forward_ns, c.head_forward_ns
    a2a = act * c.topk

    def neighbour(stage: int) -> int:
        return rank + (stage - s) * pp_stride

    def tag(kind: str, mb: int, vstage: int) -> int:
        return (mb * c.stages + vstage) * 2 + (kind == "B")

    def layer(kind: str, mb: int, vs: int, i: int) -> None:
        where = f"{kind}{mb}.s{vs}.l{i}"
        if zero3:
            b.coll(f"{where}.ag", ALL_GATHER, dense_shard, "dp", "DP")
            b.coll(f"{where}.agx", ALL_GATHER, expert_shard, "edp", "DP")
        passes = ("R", kind) if kind == "B" and c.recompute else (kind,)
        for what in passes:
            scale = 2.0 if what == "B" else 1.0
            b.comp(f"{where}.{what}.attn", fwd * scale / 2)
            b.coll(f"{where}.{what}.ar1", ALL_REDUCE, act, "tp", "TP")
            if c.moe:
                b.coll(f"{where}.{what}.dispatch", ALL_TO_ALL, a2a, "ep", "EP")
                b.comp(f"{where}.{what}.mlp", fwd * scale / 2)
                b.coll(f"{where}.{what}.combine", ALL_TO_ALL, a2a, "ep", "EP")
            else:
                b.comp(f"{where}.{what}.mlp", fwd * scale / 2)
            b.coll(f"{where}.{what}.ar2", ALL_REDUCE, act, "tp", "TP")

    last = c.stages - 1
    dense, expert = c.stage_params(s)
    grads_dense = dense // c.tp * e
    grads_expert = expert // (c.tp * c.ep) * e
    dp_op = ALL_REDUCE if c.zero == 0 else REDUCE_SCATTER
    buckets = v_chunks * n  # --overlap-dp: one per layer of the device, in the order they finish
    finished = 0

    def reduce_behind(where: str) -> None:
        """The next layer's gradient bucket, reduced behind the rest of the last backward."""
        nonlocal finished
        k, finished = finished, finished + 1
        for name, total, group in (("dp", grads_dense, "dp"), ("edp", grads_expert, "edp")):
            share = total // buckets + (total % buckets if k == buckets - 1 else 0)  # (the rest: last)
            b.coll_behind(f"{where}.{name}.grads", dp_op, share, group, "DP")

    for unit in message_units(c.schedule, p, s, m, v_chunks):
        for kind, mb, chunk in unit:  # receives join the batch of the previous unit's sends
            vs = chunk * p + s
            if kind == "F" and vs > 0:
                b.message(f"recv.a{mb}.s{vs}", False, rank, neighbour((vs - 1) % p), act, tag("F", mb, vs))
            if kind == "B" and vs < last:
                peer = neighbour((vs + 1) % p)
                b.message(f"recv.g{mb}.s{vs}", False, rank, peer, act, tag("B", mb, vs + 1))
        for kind, mb, chunk in unit:
            vs = chunk * p + s
            if kind == "B" and vs == last and head:
                b.comp(f"B{mb}.head", head * (3 if c.recompute else 2))
            for i in range(n) if kind == "F" else reversed(range(n)):
                layer(kind, mb, vs, i)
                if c.overlap_dp and kind == "B" and mb == m - 1:
                    reduce_behind(f"B{mb}.s{vs}.l{i}")
            if kind == "F" and vs == last and head:
                b.comp(f"F{mb}.head", head)
        b.flush()
        for kind, mb, chunk in unit:
            vs = chunk * p + s
            if kind == "F" and vs < last:
                b.message(f"send.a{mb}.s{vs}", True, rank, neighbour((vs + 1) % p), act, tag("F", mb, vs + 1))
            if kind == "B" and vs > 0:
                b.message(f"send.g{mb}.s{vs}", True, rank, neighbour((vs - 1) % p), act, tag("B", mb, vs))
    b.join()
    if not c.overlap_dp:
        b.coll("dp.grads", dp_op, grads_dense, "dp", "DP")
        b.coll("edp.grads", dp_op, grads_expert, "edp", "DP")
    if c.zero in (1, 2):
        b.coll("dp.params", ALL_GATHER, grads_dense // c.dp, "dp", "DP")
        b.coll("edp.params", ALL_GATHER, grads_expert // (c.dp // c.ep), "edp", "DP")
    return b.nodes


def metadata(c: LlmConfig, layout: Layout) -> list[Attr]:
    """The graph's metadata: the shape and the layout, for readers and for `train`'s header."""
    return [
        Attr("themis_generator", "string", "themis-mpi workload gpt"),
        Attr("themis_topology", "string", layout.topology.spec()),
        Attr("themis_llm", "string", repr(c)),
    ]


def write_llm(c: LlmConfig, topology: Topology, prefix: str) -> Layout:
    """Write ``prefix.<rank>.et`` for every rank; returns the layout (the topology `train` needs)."""
    layout = fit_groups(c, topology)
    folder = os.path.dirname(prefix)
    if folder:
        os.makedirs(folder, exist_ok=True)
    attrs = metadata(c, layout)
    for rank in range(c.npus):
        path = f"{prefix}.{rank}.et"
        write_et(path, EtTrace(path, "0.0.4", attrs, rank_graph(c, layout, rank)))
    return layout


def traffic(nodes: list[Node]) -> dict[str, int]:
    """Bytes a rank's graph moves per parallelism (collectives' comm_size; PP: bytes sent and received)."""
    out = dict.fromkeys(PARALLELISMS, 0)
    for node in nodes:
        if node.type in (COMM_COLL_NODE, COMM_SEND_NODE, COMM_RECV_NODE):
            out[str(node.attr("themis_parallelism"))] += int(node.attr("comm_size"))
    return out


def compute_ns(nodes: list[Node]) -> float:
    """Compute time of a rank's graph (its COMP nodes)."""
    return sum(float(n.attr("themis_duration_ns")) for n in nodes if n.type == COMP_NODE)


def iteration_flops(c: LlmConfig) -> float:
    """FLOPs of one iteration from the generated graphs' compute: sum over ranks of time x throughput."""
    layout = fit_groups(c, _line(c.npus))
    total = 0.0
    for rank in range(c.npus):
        total += compute_ns(rank_graph(c, layout, rank))
    return total * c.peak_tflops * c.efficiency * 1e3


def _line(npus: int) -> Topology:
    return Topology((Dim("Switch" if npus > 1 else "Ring", npus, 100.0, 0.0),))


_BUILT: dict[tuple, EtTrace] = {}  # the last traces built, (config, layout, drop, rank) -> trace
_BUILT_KEPT = 64  # `run.priced.price_all` reads each stage's rank under 5 drops; a world 8 ranks under 5


class LazyTraces(Sequence):
    """Every rank's trace, built when first read (a model run reads one rank per stage).

    Every NPU's links read each kind's first rank too: the kind's ranks share its plan (`kind`,
    `run.training.kind_firsts`). The last traces built are shared by every `LazyTraces` of the
    same model, layout and collectives left out (a trace is read, never changed), so the runs of
    one priced iteration build and plan (`chakra.plan_graph` keeps a live trace's plans) each
    rank's graph once.
    """

    def __init__(self, c: LlmConfig, layout: Layout, drop: frozenset[str] = frozenset()):
        self.c, self.layout, self.drop = c, layout, drop
        self._made: dict[int, EtTrace] = {}
        self.attrs = metadata(c, layout)

    def __len__(self) -> int:
        return self.c.npus

    def kind(self, rank: int) -> int:
        """What sets a rank's graph apart: its pipeline stage.

        The rest of its graph, its peers at the same rank offsets, is every rank's of that stage
        (`rank_graph`).
        """
        return rank_coords(self.c, rank)[2]

    def __getitem__(self, rank):
        if isinstance(rank, slice):
            return [self[r] for r in range(*rank.indices(len(self)))]
        if not 0 <= rank < len(self):  # (iteration, `list()`, stops here: `Sequence`'s protocol)
            raise IndexError(f"rank {rank} of {len(self)}")
        if rank not in self._made:
            key = (self.c, self.layout, self.drop, rank)
            if key not in _BUILT:
                path = f"<{self.c.schedule} rank {rank}>"
                nodes = rank_graph(self.c, self.layout, rank, self.drop)
                _BUILT[key] = EtTrace(path, "0.0.4", self.attrs, nodes)
                for old in list(_BUILT)[:-_BUILT_KEPT]:
                    del _BUILT[old]
            self._made[rank] = _BUILT[key]
        return self._made[rank]
