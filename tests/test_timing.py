"""The timing core's seams (`themis_mpi.timing`): one place chooses, one link interface, rules added as documented.

- Only the planner looks at which transport, world or link rule it has (an AST walk of the package).
- The toy rule of docs/design.md#adding-a-rule runs on the model and on 8 emulator ranks alike.
- The store-forward rule (ASTRA-sim 2.x's link, written once) in closed form, on its own links.
"""

import ast
import json
import math
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from harness import ROOT, mpi_env, mpirun

from themis_mpi.timing.events import EventLoop
from themis_mpi.timing.links import Flow, Link, Step, Transfer
from themis_mpi.timing.rules import DEFAULT_RULE, RULES, default_rule
from themis_mpi.timing.store_forward import StoreForward

PACKAGE = ROOT / "themis_mpi"
PLANNER = PACKAGE / "timing" / "planner.py"
# what times a run: transports, worlds, timers and link rules (and, below, whatever subclasses them)
TIMING_CLASSES = {
    "Transport",
    "ModelTransport",
    "MpiTransport",
    "LinkedTransport",
    "GreenletControl",
    "Greenlets",
    "LinkModel",
    "Symmetric",
    "Replay",
    "Timer",
}


def timing_classes(sources: dict[Path, str]) -> set[str]:
    """`TIMING_CLASSES` and every class of the sources that derives from one, transitively."""
    bases: dict[str, set[str]] = {}
    for text in sources.values():
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ClassDef):
                bases[node.name] = {ast.unparse(b).rsplit(".", 1)[-1] for b in node.bases}
    found = set(TIMING_CLASSES)
    while True:
        more = {name for name, of in bases.items() if of & found} - found
        if not more:
            return found
        found |= more


def _names(node: ast.AST) -> set[str]:
    """The class names an expression mentions: names, attributes' last parts, and strings."""
    out = set()
    for n in ast.walk(node):
        if isinstance(n, ast.Name | ast.Attribute):
            out.add(ast.unparse(n).rsplit(".", 1)[-1])
        elif isinstance(n, ast.Constant) and isinstance(n.value, str):
            out.add(n.value)
    return out


def _is_type_of(node: ast.AST) -> bool:
    """``type(x)`` or ``type(x).__name__``."""
    if isinstance(node, ast.Attribute) and node.attr == "__name__":
        node = node.value
    return isinstance(node, ast.Call) and ast.unparse(node.func) == "type"


def choices(text: str, classes: set[str]) -> list[str]:
    """Where a module asks which transport, world or link rule it has: isinstance/issubclass, or type() compared."""
    out = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Call) and ast.unparse(node.func) in ("isinstance", "issubclass"):
            if len(node.args) == 2 and _names(node.args[1]) & classes:
                out.append(f"line {node.lineno}: {ast.unparse(node)}")
        elif isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            typed = [s for s in sides if _is_type_of(s)]
            if typed and any(_names(s) & classes for s in sides if not _is_type_of(s)):
                out.append(f"line {node.lineno}: {ast.unparse(node)}")
    return out


def test_only_the_planner_asks_which_transport_world_or_rule_it_has():
    """No module but `timing.planner` tests a transport, world or link-rule class (isinstance, type())."""
    sources = {path: path.read_text() for path in PACKAGE.rglob("*.py")}
    classes = timing_classes(sources)
    assert {"NpuVectors", "WorldTransport", "World", "Fair", "StoreForward"} <= classes
    found = {
        str(path.relative_to(ROOT)): hits
        for path, text in sources.items()
        if path != PLANNER and (hits := choices(text, classes))
    }
    assert found == {}


def test_the_check_fails_on_a_planted_choice():
    """The walk finds an isinstance of a transport, of a rule's subclass, and a type() comparison."""
    classes = timing_classes(
        {PACKAGE / "timing" / "vectors.py": (PACKAGE / "timing" / "vectors.py").read_text()}
    )
    planted = textwrap.dedent(
        """
        from .timing.vectors import NpuVectors

        def issue_ns(transport, run):
            if isinstance(transport, (int, NpuVectors)):
                return transport.issue_ns
            if type(transport).__name__ == "MpiTransport":
                return 0.0
            return run.start_ns if isinstance(run, MessageRun) else 0.0
        """
    )
    hits = choices(planted, classes)
    assert len(hits) == 2 and "NpuVectors" in hits[0] and "type(transport)" in hits[1], hits


def test_no_function_of_the_run_layer_is_longer_than_60_lines():
    """The run drivers ask the planner and run the per-NPU bodies; none grows back into a chooser."""
    long = [
        f"{path.name}:{node.name} ({node.end_lineno - node.lineno + 1} lines)"
        for path in sorted((PACKAGE / "run").glob("*.py"))
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.end_lineno - node.lineno + 1 > 60
    ]
    assert long == []


# --- the toy rule of docs/design.md#adding-a-rule ----------------------------------------------------


def toy_rule_script() -> str:
    """The toy rule's code block of docs/design.md#adding-a-rule, as a script that then runs the command line."""
    page = (ROOT / "docs" / "design.md").read_text()
    section = page.split("### Adding a rule", 1)[1]
    block = section.split("```python\n", 1)[1].split("```", 1)[0]
    return f"import sys\n\nfrom themis_mpi.cli import main\n\n{block}\nsys.exit(main(sys.argv[1:]))\n"


@pytest.mark.parametrize(
    "args",
    [
        ["-t", "SW(8,100,0,ring)", "-b", "1M", "-c", "1", "-p", "baseline"],  # (a closed form below)
        ["-t", "2x2x2", "-b", "1M", "-c", "8", "-p", "baseline,themis", "--active-chunks-per-dim", "2"],
        [
            "-t",
            "2x2x2",
            "-b",
            "1M",
            "-c",
            "4",
            "-p",
            "baseline",
            "--npu-delay-us",
            "5=30",
        ],  # every NPU's links
    ],
    ids=["closed-form", "active-2", "late-npu"],
)
def test_the_documented_toy_rule_runs_on_the_model_and_on_8_ranks_alike(tmp_path, args):
    """The rule of the docs, registered in a script: `model` and `mpiexec -n 8 ... run` give equal times, #wrong 0."""
    script = tmp_path / "toy_rule.py"
    script.write_text(toy_rule_script())
    common = [*args, "--network", "half-bandwidth", "-q"]
    model = subprocess.run(
        [sys.executable, str(script), "model", *common, "--json", str(tmp_path / "model.json")],
        capture_output=True, text=True, env=mpi_env(), cwd=ROOT, timeout=120,
    )  # fmt: skip
    assert model.returncode == 0, model.stderr
    emu = mpirun(8, [str(script), "run", *common, "-n", "1", "-w", "0", "--json", str(tmp_path / "emu.json")])
    assert emu.returncode == 0, emu.stderr
    m, e = (json.loads((tmp_path / f"{name}.json").read_text()) for name in ("model", "emu"))
    assert [r["time_us"] for r in e] == [r["time_us"] for r in m]
    assert [r["wrong"] for r in e] == [0] * len(e) and all(r["network"] == "half-bandwidth" for r in m)
    if args[1] == "SW(8,100,0,ring)":  # one ring all-reduce at latency 0 takes twice its bandwidth time
        assert m[0]["time_us"] == pytest.approx(2 * m[0]["ideal_us"], rel=1e-12)


def test_the_default_rule_is_one_constant_and_the_compat_modes_keep_theirs():
    """Without --network: `DEFAULT_RULE`; --compat astra-sim-1.0 ideal, astra-sim-2 its congestion-aware backend."""
    assert default_rule("") == DEFAULT_RULE in RULES
    assert default_rule("astra-sim-1.0") == "ideal"
    assert default_rule("astra-sim-2") == "store-forward"


# --- store-forward: ASTRA-sim 2.x's link, once ----------------------------------------------------


class _Host:
    """A bare container: flows end into a list, a step goes on at once."""

    def __init__(self):
        self.loop = EventLoop()
        self.ends: list[tuple[str, float]] = []

    def begin(self, flow):
        pass

    def through(self, flow):
        return True

    def ended(self, owner):
        self.ends.append((owner, self.loop.now_ns))


def _run(links, flows, **params):
    host = _Host()
    rule = StoreForward(links, host, **params)
    for flow in flows:
        rule.start(flow)
    host.loop.drain()
    return dict(host.ends)


def test_store_forward_serves_whole_transfers_in_arrival_order_hop_by_hop():
    """Two transfers of S on one link of rate B: S/B and 2S/B; over two hops a transfer alone takes 2S/B, then its delay."""
    links = (Link("a", 0, 2.0), Link("b", 0, 2.0))
    one = Step((Transfer(10.0, (((0, 1.0),),)),), 3.0)
    two_hops = Step((Transfer(10.0, (((0, 1.0),), ((1, 1.0),))),), 3.0)
    ends = _run(links, [Flow("first", (one,)), Flow("second", (one,))])
    assert ends == {"first": 5.0 + 3.0, "second": 10.0 + 3.0}
    assert _run(links, [Flow("alone", (two_hops,))]) == {"alone": 10.0 + 3.0}


def test_store_forward_under_astra2_truncates_and_pipelines_the_latency_behind_the_next_serialization():
    """trunc(L + S/B) to arrive, and a queued transfer leaves trunc(S/B) later (`Link.cpp`); the lead delay first."""
    links = (Link("a", 0, 3.0),)
    step = Step((Transfer(10.0, (((0, 1.0),),)),), 0.0)
    ends = _run(
        links,
        [Flow("first", (step,), lead_ns=1.0), Flow("queued", (step,), lead_ns=1.0)],
        trunc=True,
        latency_ns=[7.0],
        per_event=True,
    )
    serial, hop = 10 // 3, int(7.0 + 10.0 / 3)  # 3 ns on the link, there 10 ns after it took it
    assert ends == {"first": 1.0 + hop, "queued": 1.0 + serial + hop}


# --- a step alone on its links ---------------------------------------------------------------------


def test_a_step_whose_transfers_share_a_link_alone_takes_their_bytes_together_at_its_rate():
    """Two transfers of S over one link of rate B, alone under fair: 2S/B (their shares add up on it)."""
    from themis_mpi.timing.fair import Fair
    from themis_mpi.timing.links import rated

    links = (Link("up", 0, 2.0), Link("a", 0, 2.0), Link("b", 0, 2.0))
    both = rated(
        Step((Transfer(10.0, (((0, 1.0),), ((1, 1.0),))), Transfer(10.0, (((0, 1.0),), ((2, 1.0),)))), 3.0),
        [2.0] * 3,
    )
    assert both.solo_rate == pytest.approx(2.0)  # the step's 20 bytes all cross "up" at 2 B/ns (4.0 before)
    host = _Host()
    rule = Fair(links, host)
    rule.start(Flow("two", (both,)))
    while host.loop.step(math.inf, rule):
        pass
    assert dict(host.ends) == {"two": pytest.approx(20.0 / 2.0 + 3.0)}
