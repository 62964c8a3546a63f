"""Text workloads to Chakra ET files and back.

`workload_to_et` runs the text-workload loop (`training.TrainingLoop`) once against a recorder
that stands in for the engine (`_Recorder`, told by the loop's `TrainingListener` hooks what
each collective and timer is): every compute delay becomes a COMP node, every collective a
COMM_COLL node, every weight update after a collective a COMP node with ``themis_overlap`` (a
timer, not compute), and each node depends on what its process waited for since the process's
previous node. The graph therefore runs exactly as the loop does. The header and layer table go
into the GlobalMetadata (``themis_*`` attributes), so that `et_to_workload_text` gives the text
workload back.
"""

from __future__ import annotations

import os
from typing import Any

from ..errors import UsageError
from .et import COMM_COLL_NODE, COMP_NODE, Attr, EtTrace, Node
from .training import TrainingLoop, TrainingSpec

ET_VERSION = "0.0.4"  # the schema version ASTRA-sim's own microbenchmark traces carry
CHAKRA_COMM_TYPE = {"all_reduce": 0, "all_gather": 2, "all_to_all": 6, "reduce_scatter": 7}
TEXT_COMM_TYPE = {"all_reduce": "ALLREDUCE", "all_gather": "ALLGATHER", "all_to_all": "ALLTOALL"}
TEXT_COMM_TYPE["reduce_scatter"] = "REDUCESCATTER"


class _Recorded:
    """An event of the recorder: triggered at once; it stands for the nodes that end it."""

    triggered = True
    value = None

    def __init__(self, nodes: frozenset[int]):
        self.nodes = nodes

    def add_callback(self, callback: Any) -> None:  # pragma: no cover - never waited on
        callback(self)


class _Recorder:
    """The engine API a `TrainingLoop` uses (`timeout`, `issue`, `process`), recording nodes.

    It is the loop's `TrainingListener` too: the loop names each collective (`issuing`) and each
    weight update (`updating`) before it issues the collective or waits for the update.
    """

    def __init__(self, topology: Any, itemsize: int):
        self.topology, self.itemsize = topology, itemsize
        self.now_ns = 0.0
        self.nodes: list[Node] = []
        self._frontiers: list[set[int]] = [set()]
        self.label = ""
        self.update = ""  # the name of the next timeout when it is a weight update
        self.file_bytes = 0

    def _add(self, name: str, type_: int, attrs: list[Attr], duration_ns: float = 0.0) -> _Recorded:
        node = Node(id=len(self.nodes), name=name, type=type_, ctrl_deps=sorted(self._frontiers[-1]))
        node.duration_micros = int(round(duration_ns / 1e3))
        node.attrs = attrs
        self.nodes.append(node)
        return _Recorded(frozenset({node.id}))

    def timeout(self, delay_ns: float) -> _Recorded:
        name, self.update = self.update or "compute", ""
        attrs = [Attr("is_cpu_op", "bool", False), Attr("themis_duration_ns", "double", float(delay_ns))]
        if name != "compute":
            attrs.append(Attr("themis_overlap", "bool", True))
        return self._add(name, COMP_NODE, attrs, delay_ns)

    def issuing(self, layer: Any, phase: str) -> None:
        """The next collective is this layer's phase: its node's name and the file's bytes."""
        self.label = f"{layer.name}.{phase}"
        self.file_bytes = layer.phase(phase).size_bytes

    def updating(self, layer: Any) -> None:
        """The next timeout is this layer's weight update."""
        self.update = f"{layer.name}.update"

    def issue(self, collective: Any, schedule: Any, check: bool = True, need: Any = None) -> _Recorded:
        involved = [d in collective.dims for d in range(len(self.topology.dims))]
        attrs = [
            Attr("is_cpu_op", "bool", False),
            Attr("comm_type", "int64", CHAKRA_COMM_TYPE[collective.op]),
            Attr("comm_size", "int64", self.file_bytes),
            Attr("involved_dim", "bool", involved, is_list=True),
        ]
        return self._add(self.label, COMM_COLL_NODE, attrs)

    def process(self, generator: Any) -> _Recorded:
        self._frontiers.append(set(self._frontiers[-1]))
        try:
            event = next(generator)
            while True:
                self._wait(event)
                event = generator.send(None)
        except StopIteration:
            pass
        return _Recorded(frozenset(self._frontiers.pop()))

    def _wait(self, event: _Recorded) -> None:
        frontier = self._frontiers[-1]
        for n in event.nodes:  # what the new nodes depend on already needs no edge of its own
            frontier.difference_update(self.nodes[n].ctrl_deps)
        frontier.update(event.nodes)


class _NoSchedules(dict):
    """Every collective's schedule is None: the recorder notes collectives, it never runs them."""

    def __missing__(self, key: Any) -> None:
        return None


def workload_to_et(workload: Any, topology: Any, iterations: int = 1, path: str = "") -> EtTrace:
    """The ET graph of `iterations` training iterations of a text workload on a topology.

    The topology decides which dims each collective involves (``involved_dim``); a transformer
    whose model-parallel group splits a dim records the split topology's dims and its group
    (``themis_model_parallel_group``), so the replay splits the same way. Compute times keep
    their nanoseconds in ``themis_duration_ns`` (``duration_micros`` is rounded, for other
    tools). Collective sizes are the file's bytes per NPU (an all-gather's input).
    """
    fitted = workload.fit_topology(topology)
    spec = TrainingSpec(chunks=1, iterations=iterations)
    recorder = _Recorder(fitted, 4)
    loop = TrainingLoop(workload, fitted, spec, _NoSchedules(), listener=recorder)
    recorder.process(loop.process(recorder))  # type: ignore[arg-type]
    attrs = [
        Attr("themis_source", "string", os.path.basename(workload.path)),
        Attr("themis_iterations", "int64", iterations),
        Attr("themis_topology", "string", fitted.spec()),
        Attr("themis_parallelism", "string", workload.parallelism),
        Attr(
            "themis_layers",
            "string",
            [_layer_line(workload, layer) for layer in workload.layers],
            is_list=True,
        ),
    ]
    if workload.model_parallel_group is not None:
        attrs.append(Attr("themis_model_parallel_group", "int64", workload.model_parallel_group))
    if workload.dlrm_last_bottom_layer is not None:
        attrs.append(Attr("themis_dlrm_last_bottom_layer", "int64", workload.dlrm_last_bottom_layer))
    if workload.parallelism == "HYBRID_TRANSFORMER_FWD_IN_BCKWD":
        attrs.append(Attr("themis_checkpoints", "int64", list(workload.checkpoints), is_list=True))
        attrs.append(
            Attr("themis_checkpoint_initiates", "int64", list(workload.checkpoint_initiates), is_list=True)
        )
    return EtTrace(path, ET_VERSION, attrs, recorder.nodes)


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def _layer_line(workload: Any, layer: Any) -> str:
    cells = [layer.name, "-1"]
    for phase in (layer.fwd, layer.ig, layer.wg):
        kind = TEXT_COMM_TYPE[phase.op] if phase.op else "NONE"
        cells += [_number(phase.compute_ns), kind, str(phase.size_bytes)]
    cells.append(_number(layer.update_ns))
    if workload.parallelism == "HYBRID_CUSTOMIZED":
        cells.append(layer.policy)
    return "\t".join(cells)


def et_to_workload_text(trace: EtTrace) -> str:
    """The text workload an ET converted by `workload_to_et` came from.

    Only such a file can be turned back: a general execution graph has no layer table. Other
    files are refused with one line.
    """
    parallelism = trace.attr("themis_parallelism")
    layers = trace.attr("themis_layers")
    if not isinstance(parallelism, str) or not isinstance(layers, list):
        raise UsageError(
            f"{trace.path}: not converted from a text workload (no themis_parallelism/themis_layers "
            "metadata), so it has no layer table to write"
        )
    header = parallelism
    group = trace.attr("themis_model_parallel_group")
    if parallelism.startswith("HYBRID_TRANSFORMER"):
        header += f"\tmodel_parallel_NPU_group: {group}"
        if parallelism == "HYBRID_TRANSFORMER_FWD_IN_BCKWD":
            checkpoints = trace.attr("themis_checkpoints", [])
            initiates = trace.attr("themis_checkpoint_initiates", [])
            header += f" checkpoints: {len(checkpoints)} " + " ".join(map(str, checkpoints))
            header += f" checkpoint_initiates: {len(initiates)} " + " ".join(map(str, initiates))
    elif parallelism.startswith("HYBRID_DLRM"):
        header += f"\t{trace.attr('themis_dlrm_last_bottom_layer')}"
    return "\n".join([header, str(len(layers)), *layers]) + "\n"
