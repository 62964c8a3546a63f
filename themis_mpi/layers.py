"""The package's architecture as a contract: its layers, lowest first, and what may import what.

A module may import any module of a lower layer. Inside a layer whose rule is ``ordered`` it may
also import the modules listed before it; inside an ``apart`` layer it imports none of its
neighbours (the CLI's commands know nothing of each other). An import of a package counts as an
import of its ``__init__``. Modules are named relative to ``themis_mpi`` ("" is the package's
``__init__``). `tests/test_layers.py` holds every import of every kind (top level,
function-local, ``TYPE_CHECKING``) to this; `architecture_markdown` draws `docs/architecture.md`
from it. Nothing here is imported at run time.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import NamedTuple


class Layer(NamedTuple):
    """One layer: its name, what it is for, its modules in order, and its rule inside."""

    name: str
    purpose: str
    modules: tuple[str, ...]
    rule: str = "ordered"  # or "apart"


LAYERS: tuple[Layer, ...] = (
    Layer(
        "leaves",
        "errors, units and limits every layer shares; atomic output files; the progress callback",
        (
            "errors",
            "version",
            "launch",
            "limits",
            "units",
            "output",
            "child",
            "watchdog",
            "progress",
            "layers",
        ),
    ),
    Layer(
        "network",
        "the topology, the time model of its dims (per-dim stages, or NCCL-like flat), the link rules",
        (
            "topology",
            "nccl",
            "cost",
            "timing",
            "timing.events",
            "timing.links",
            "timing.routes",
            "timing.ideal",
            "timing.fair",
            "timing.packet",
            "timing.store_forward",
            "timing.replay",
            "timing.rules",
        ),
    ),
    Layer(
        "collectives",
        "collectives, their chunks and stages, per-dim algorithms, the closed forms of results",
        ("collectives", "algorithms", "verify"),
    ),
    Layer(
        "custom algorithms",
        "MSCCL-IR algorithms: read, checked, each GPU's program, proved on data, timed, written, synthesized",
        (
            "msccl.ir",
            "msccl.program",
            "msccl.check",
            "msccl.execute",
            "msccl.timing",
            "msccl.build",
            "msccl.synthesis",
            "msccl.custom",
            "msccl",
        ),
    ),
    Layer("config", "how a run is carried out (`RunConfig`)", ("config",)),
    Layer(
        "policies",
        "inter-dim and intra-dim policies, the communication scheduler, the registry and its plugins",
        (
            "policies.base",
            "policies.inter",
            "policies.ports",
            "policies.intra",
            "policies.predictive",
            "policies.scheduler",
            "policies.registry",
            "policies",
        ),
    ),  # fmt: skip
    Layer("engine", "queues, slots, clocks and processes of one NPU; the `Transport` protocol", ("engine",)),
    Layer(
        "transports",
        "who moves the data and says when stages end: one NPU's or every NPU's timing (planned), or MPI",
        (
            "timing.symmetric",
            "model",
            "timing.classes",
            "timing.greenlets",
            "timing.world",
            "timing.vectors",
            "timing.programs",
            "timing.planner",
            "mpi",
            "mpi.progress",
            "mpi.grid",
            "mpi.program",
            "mpi.transport",
        ),
    ),
    Layer(
        "workloads",
        "text workloads and their training loop, Chakra ET files, conversion and graph replay",
        (
            "workloads",
            "workloads.text",
            "workloads.training",
            "workloads.et",
            "workloads.convert",
            "workloads.chakra",
            "workloads.llm",
            "workloads.simai",
        ),
    ),  # fmt: skip
    Layer("results", "result dataclasses and the figures of a finished run", ("results",)),
    Layer(
        "run",
        "the one run driver: rank 0's schedules, a collective, training, jobs, backends, sweeps, pools",
        (
            "run",
            "run.coordinator",
            "run.custom",
            "run.collective",
            "run.linked",
            "run.training",
            "run.jobs",
            "run.backend",
            "run.sweep",
            "run.pool",
            "run.priced",
        ),
    ),
    Layer(
        "edges",
        "what is built on runs: tables, traces, analysis, plots, replay, ASTRA-sim, calibration, API",
        (
            "report",
            "trace",
            "analysis",
            "plots",
            "perfetto",
            "replay",
            "astra",
            "calibrate.hardware",
            "calibrate.logs",
            "calibrate.machine",
            "calibrate.optimise",
            "calibrate.alphabeta",
            "calibrate.ncclfit",
            "calibrate.perdim",
            "calibrate.report",
            "calibrate",
            "api",
        ),
    ),
    Layer("cli options", "the parser and options to domain objects", ("cli.parser", "cli.options")),
    Layer(
        "cli commands",
        "one module per subcommand",
        (
            "cli.sweep",
            "cli.train",
            "cli.workload",
            "cli.convert",
            "cli.replay",
            "cli.analyze",
            "cli.export",
            "cli.synthesize",
            "cli.calibrate",
            "cli.plot",
            "cli.topologies",
            "cli.policies",
            "cli.info",
        ),
        "apart",
    ),  # fmt: skip
    Layer(
        "entry points",
        "`themis-mpi` (Ctrl-C first, then the command) and `python -m themis_mpi`; the lazy API",
        ("cli.app", "cli", "__main__", ""),
    ),
)

# Modules that may import package modules by name at run time (importlib, entry points): the CLI
# imports only the command it runs; the registry loads plugins' entry points.
DYNAMIC_IMPORTERS = ("cli.app", "policies.registry")


def rank_of(module: str) -> tuple[int, int]:
    """(layer index, position in the layer) of a module named relative to the package."""
    for i, layer in enumerate(LAYERS):
        if module in layer.modules:
            return i, layer.modules.index(module)
    raise KeyError(f"module {module!r} is in no layer of themis_mpi/layers.py")


def may_import(importer: str, imported: str) -> bool:
    """Whether the contract lets `importer` import `imported`."""
    (li, pi), (lj, pj) = rank_of(importer), rank_of(imported)
    if lj != li:
        return lj < li
    return LAYERS[li].rule == "ordered" and pj < pi


def _first_line(path: Path) -> str:
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    return doc.split("\n", 1)[0].strip()


def module_path(root: Path, module: str) -> Path:
    """The file of a module named relative to the package rooted at `root`."""
    parts = module.split(".") if module else []
    package = root.joinpath(*parts)
    return package / "__init__.py" if package.is_dir() else root.joinpath(*parts[:-1], parts[-1] + ".py")


def architecture_markdown(root: Path) -> str:
    """`docs/architecture.md`: the layers from the top down, each module with its docstring's first line."""
    lines = [
        "# Architecture: the layers",
        "",
        "<!-- Generated from themis_mpi/layers.py by `python scripts/architecture.py`; "
        "tests/test_layers.py checks it. -->",
        "",
        "themis-mpi is a stack of layers. A module imports only from the layers below it (and, inside",
        "an *ordered* layer, from the modules listed above it); the CLI's commands know nothing of each",
        "other. `tests/test_layers.py` walks every import of every kind (top level, function-local,",
        "`TYPE_CHECKING`) and fails on any other arrow, so this page and the code cannot disagree.",
        "",
        "```",
        " ".join(f"[{layer.name}]" for layer in reversed(LAYERS)),
        "   (each imports only what is to its right)",
        "```",
        "",
    ]
    for n, layer in enumerate(reversed(LAYERS)):
        lines += [f"## {len(LAYERS) - n}. {layer.name} ({layer.rule}): {layer.purpose}", ""]
        lines += ["| module | what it is |", "| --- | --- |"]
        for module in layer.modules:
            name = "themis_mpi" + (f".{module}" if module else "")
            lines.append(f"| `{name}` | {_first_line(module_path(root, module))} |")
        lines.append("")
    return "\n".join(lines)
