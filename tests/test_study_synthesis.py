"""Rules of scripts/study_synthesis.py: its --quick rows are the shipped ones, and its findings hold."""

import importlib.util
import json

import pytest
from harness import ROOT

SHIPPED = ROOT / "docs" / "synthesis" / "study.json"
WALL_KEYS = ("wall_s",)


def load_script():
    """The script as a module (scripts/ is not a package)."""
    spec = importlib.util.spec_from_file_location("study_synthesis", ROOT / "scripts" / "study_synthesis.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def shipped() -> list[dict]:
    """The shipped rows of the full study."""
    return json.loads(SHIPPED.read_text())


@pytest.fixture(scope="module")
def quick(tmp_path_factory) -> list[dict]:
    """The rows of a --quick run, through the script's main path (JSON round trip included)."""
    out = tmp_path_factory.mktemp("synthesis")
    load_script().main(["--quick", "--out", str(out)])
    assert (out / "study.md").exists() and (out / "study.png").stat().st_size > 0
    return json.loads((out / "study.json").read_text())


def test_quick_rows_equal_the_shipped_rows(quick, shipped):
    """Every --quick row equals the shipped row of the same topology, size and algorithm, wall clock aside."""
    by_key = {(r["topology"], r["size"], r["algorithm"]): r for r in shipped}
    assert len(by_key) == len(shipped) and quick
    for row in quick:
        want = {
            k: v
            for k, v in by_key[(row["topology"], row["size"], row["algorithm"])].items()
            if k not in WALL_KEYS
        }
        assert {k: v for k, v in row.items() if k not in WALL_KEYS} == want


def test_nothing_beats_the_bandwidth_bound(shipped):
    """Every algorithm on every topology takes at least the all-gather's bandwidth bound."""
    assert all(r["time_us"] >= r["bound_us"] * (1 - 1e-12) for r in shipped)


def test_the_synthesized_all_gather_beats_every_flat_algorithm_and_the_hierarchical_one_on_the_tori(shipped):
    """On TACOS's tori at 64 MiB the synthesized file is faster than flat ring, direct, hd and the hierarchy."""
    for label in ("Torus2D 4x4", "Torus3D 4x4x4"):
        sel = {r["algorithm"]: r["time_us"] for r in shipped if r["topology"] == label and r["size"] == "64M"}
        others = [sel[a] for a in ("ring", "direct", "halving_doubling", "hierarchical")]
        assert sel["synthesized"] < min(others)
