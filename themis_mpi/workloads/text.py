"""ASTRA-sim 1.0 text workloads: the parser and the dims each phase's collective runs on.

Grammar (whitespace-separated tokens)::

    HEADER [header arguments]
    N
    name reserved  fwd_compute fwd_type fwd_bytes  ig_compute ig_type ig_bytes
                   wg_compute wg_type wg_bytes  update_time  [policy]      (N layers)

Headers: DATA, MODEL, MICRO, HYBRID_DATA_MODEL, HYBRID_MODEL_DATA, HYBRID_CUSTOMIZED (each layer
ends with its own policy), DISTRIBUTED_INFERENCE, HYBRID_DLRM n and HYBRID_DLRM_ENHANCED n (n: the
last bottom-MLP layer), HYBRID_TRANSFORMER model_parallel_NPU_group: n, and
HYBRID_TRANSFORMER_FWD_IN_BCKWD model_parallel_NPU_group: n checkpoints: k l1..lk
checkpoint_initiates: j l1..lj. Collective types: NONE, ALLREDUCE, ALLGATHER, REDUCESCATTER,
ALLTOALL. Compute and update times are in ns (ASTRA-sim's cycles at 1 GHz); sizes in bytes.

Which dims a phase's collective involves follows the parallelism, as in ASTRA-sim 1.0: data
parallelism (weight gradients) over all dims, model parallelism (forward, input gradient) over
all dims for MODEL, dim 0 or dims 1.. for the two hybrids, and the first dims whose NPUs multiply
to model_parallel_NPU_group for the transformers (the remaining dims carry the data parallelism).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from ..errors import UsageError, shown
from ..limits import MAX_SIZE_BYTES, MAX_TIME_NS
from ..topology import Dim, Topology

HEADERS = (
    "DATA",
    "MODEL",
    "MICRO",
    "HYBRID_DATA_MODEL",
    "HYBRID_MODEL_DATA",
    "HYBRID_CUSTOMIZED",
    "DISTRIBUTED_INFERENCE",
    "HYBRID_DLRM",
    "HYBRID_DLRM_ENHANCED",
    "HYBRID_TRANSFORMER",
    "HYBRID_TRANSFORMER_FWD_IN_BCKWD",
)
LAYER_POLICIES = (
    "DATA",
    "MODEL",
    "MICRO",
    "HYBRID_DATA_MODEL",
    "HYBRID_MODEL_DATA",
    "DISTRIBUTED_INFERENCE",
    "HYBRID_TRANSFORMER",
    "HYBRID_TRANSFORMER_FWD_IN_BCKWD",
    "HYBRID_DLRM",
    "HYBRID_DLRM_ENHANCED",
)
COMM_TYPES = {
    "NONE": None,
    "ALLREDUCE": "all_reduce",
    "ALLGATHER": "all_gather",
    "REDUCESCATTER": "reduce_scatter",
    "ALLTOALL": "all_to_all",
}
PHASES = ("fwd", "ig", "wg")


@dataclass(frozen=True)
class Phase:
    """One phase of a layer: compute, then (maybe) a collective."""

    compute_ns: float
    op: str | None
    size_bytes: int


@dataclass(frozen=True)
class Layer:
    """One layer line.

    Attributes:
        name: layer name.
        index: position in the file.
        fwd, ig, wg: forward, input-gradient and weight-gradient phases.
        update_ns: weight update after the weight-gradient collective.
        policy: the parallelism that decides the dims (the header's, or the layer's own).
    """

    name: str
    index: int
    fwd: Phase
    ig: Phase
    wg: Phase
    update_ns: float
    policy: str

    def phase(self, name: str) -> Phase:
        """The fwd, ig or wg phase."""
        return getattr(self, name)


@dataclass
class Workload:
    """A parsed workload file."""

    path: str
    parallelism: str
    layers: list[Layer]
    model_parallel_group: int | None = None
    dlrm_last_bottom_layer: int | None = None
    checkpoints: tuple[int, ...] = ()
    checkpoint_initiates: tuple[int, ...] = ()

    def dims(self, layer: Layer, phase: str, topology) -> tuple[int, ...]:
        """The topology dims that a layer's phase collective involves."""
        n = len(topology.dims)
        everything, nothing = tuple(range(n)), ()
        policy = layer.policy
        if self.parallelism.startswith("HYBRID_DLRM") and layer.index == 0:
            return everything  # the embedding layer's all-to-all spans every NPU
        if policy in ("DATA", "MICRO", "HYBRID_DLRM", "HYBRID_DLRM_ENHANCED"):
            return everything if phase == "wg" else nothing
        if policy in ("MODEL", "DISTRIBUTED_INFERENCE"):
            return nothing if phase == "wg" else everything
        model: tuple[int, ...]
        data: tuple[int, ...]
        if policy == "HYBRID_MODEL_DATA":
            model, data = tuple(range(1, n)), (0,)
        elif policy == "HYBRID_DATA_MODEL":
            model, data = (0,), tuple(range(1, n))
        else:  # the transformers
            boundary = model_dims(topology, self.model_parallel_group)
            model, data = tuple(range(boundary)), tuple(range(boundary, n))
        return data if phase == "wg" else model

    def fit_topology(self, topology: Topology) -> Topology:
        """The topology a transformer's model-parallel group needs: one dim split if it must be.

        ASTRA-sim splits a dim when the group is not a product of leading dims: a group of 4 on
        16x8x8 runs on 4x4x8x8, each part keeping the dim's kind, bandwidth and latency (and its
        algorithm where the part's size allows it). Other workloads keep the topology.
        """
        group = self.model_parallel_group
        if not self.parallelism.startswith("HYBRID_TRANSFORMER") or group is None or group < 1:
            return topology
        product = 1
        for k, dim in enumerate(topology.dims):
            if (
                group % product == 0
                and dim.npus % (group // product) == 0
                and 1 < group // product < dim.npus
            ):
                part = group // product
                return topology.with_dims(
                    [
                        *topology.dims[:k],
                        _resized(dim, part),
                        _resized(dim, dim.npus // part),
                        *topology.dims[k + 1 :],
                    ]
                )
            product *= dim.npus
            if product >= group:
                break
        return topology


def _resized(dim: Dim, npus: int) -> Dim:
    """The same dim with another NPU count (the kind's default algorithm if its own cannot run)."""
    try:
        return replace(dim, npus=npus)
    except UsageError:
        return replace(dim, npus=npus, algorithm="")


def model_dims(topology, group: int | None) -> int:
    """How many leading dims make up a model-parallel group of `group` NPUs."""
    if group is None or group < 1:
        raise UsageError("a transformer workload needs model_parallel_NPU_group: n with n >= 1")
    product = 1
    for k, dim in enumerate(topology.dims):
        if product == group:
            return k
        product *= dim.npus
    if product == group:
        return len(topology.dims)
    sizes = [math.prod(d.npus for d in topology.dims[:k]) for k in range(len(topology.dims) + 1)]
    raise UsageError(
        f"model_parallel_NPU_group {group} does not match the leading dims of "
        f"{topology.label()} (possible groups: {', '.join(map(str, sizes))})"
    )


class _Tokens:
    """Tokens with their line numbers, for errors that name both."""

    def __init__(self, path: str, text: str):
        self.path = path
        self.items = [(tok, no) for no, line in enumerate(text.splitlines(), 1) for tok in line.split()]
        self.pos = 0

    def error(self, message: str, at: int | None = None):
        at = self.pos if at is None else at
        if at < len(self.items):
            tok, no = self.items[at]
            return UsageError(f"{self.path}:{no}: {message} at token {shown(tok)}")
        last = self.items[-1][1] if self.items else 1
        return UsageError(f"{self.path}:{last}: {message} at end of file")

    def next(self, what: str) -> str:
        if self.pos >= len(self.items):
            raise self.error(f"expected {what}")
        self.pos += 1
        return self.items[self.pos - 1][0]

    def number(
        self, what: str, integer: bool = False, minimum: float = 0.0, maximum: float = MAX_TIME_NS
    ) -> float:
        tok = self.next(what)
        try:
            value = int(tok) if integer else float(tok)
        except ValueError:
            kind = "an integer" if integer else "a number"
            raise self.error(f"expected {what} ({kind})", self.pos - 1) from None
        if not math.isfinite(value) or not minimum <= value <= maximum:
            raise self.error(f"{what} must be between {minimum:g} and {maximum:g}", self.pos - 1)
        return value

    def keyword(self, word: str) -> None:
        tok = self.next(word)
        if tok.lower() != word.lower():
            raise self.error(f"expected {word!r}", self.pos - 1)

    def int_list(self, what: str) -> tuple[int, ...]:
        count = int(self.number(f"number of {what}", integer=True))
        return tuple(int(self.number(what, integer=True)) for _ in range(count))


def parse_workload(path: str) -> Workload:
    """Parse an ASTRA-sim 1.0 text workload; a malformed file raises an error naming line and token."""
    try:
        with open(path) as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"cannot read workload {path}: {exc}") from None
    toks = _Tokens(path, text)
    header = toks.next("a parallelism header")
    if header not in HEADERS:
        raise toks.error(f"unknown parallelism (use one of {', '.join(HEADERS)})", toks.pos - 1)
    wl = Workload(path, header, [])
    if header.startswith("HYBRID_TRANSFORMER"):
        toks.keyword("model_parallel_NPU_group:")
        wl.model_parallel_group = int(toks.number("model_parallel_NPU_group", integer=True, minimum=1))
        if header == "HYBRID_TRANSFORMER_FWD_IN_BCKWD":
            toks.keyword("checkpoints:")
            wl.checkpoints = toks.int_list("checkpoint layers")
            toks.keyword("checkpoint_initiates:")
            wl.checkpoint_initiates = toks.int_list("checkpoint-initiating layers")
    elif header.startswith("HYBRID_DLRM"):
        wl.dlrm_last_bottom_layer = int(toks.number("last bottom layer", integer=True))
    n_layers = int(toks.number("the number of layers", integer=True, minimum=1, maximum=1_000_000))
    for i in range(n_layers):
        name = toks.next(f"layer {i}'s name")
        toks.number("the reserved (dependency) field", integer=True, minimum=-1)
        phases = []
        for phase in PHASES:
            compute = toks.number(f"{phase} compute time")
            kind = toks.next(f"{phase} collective type")
            if kind not in COMM_TYPES:
                raise toks.error(
                    f"unknown collective type (use one of {', '.join(COMM_TYPES)})", toks.pos - 1
                )
            size = int(toks.number(f"{phase} collective bytes", integer=True, maximum=MAX_SIZE_BYTES))
            phases.append(Phase(compute, COMM_TYPES[kind], size if COMM_TYPES[kind] else 0))
        update = toks.number("weight update time")
        policy = header
        if header == "HYBRID_CUSTOMIZED":
            policy = toks.next("the layer's parallelism")
            if policy not in LAYER_POLICIES:
                raise toks.error(
                    f"unknown layer parallelism (use one of {', '.join(LAYER_POLICIES)})", toks.pos - 1
                )
        fwd, ig, wg = phases
        wl.layers.append(Layer(name, i, fwd, ig, wg, update, policy))
    if toks.pos < len(toks.items):
        raise toks.error(f"unexpected token after the {n_layers} layers")
    for what, layers in (("checkpoint", wl.checkpoints), ("checkpoint_initiates", wl.checkpoint_initiates)):
        for layer in layers:
            if not 0 <= layer < n_layers:
                raise UsageError(f"{path}: {what} layer {layer} is not one of the {n_layers} layers")
    if wl.dlrm_last_bottom_layer is not None and not 0 <= wl.dlrm_last_bottom_layer < n_layers:
        raise UsageError(
            f"{path}: DLRM last bottom layer {wl.dlrm_last_bottom_layer} is not one of the {n_layers} layers"
        )
    return wl
