"""A third-party policy installed from outside the package: listed, and run on both transports.

The plugin is the README's example, taken from the README itself (between the
``plugin-example`` markers), installed into a temporary directory the way pip lays it out (the
module and a dist-info with ``entry_points.txt``), and put on PYTHONPATH, which the mpiexec ranks
inherit (`harness.mpi_env`). No network, no build step.
"""

import json
import re
import subprocess
import sys

import pytest
from harness import DATA, ROOT, cli, cli_jobs, local

from themis_mpi.output import CELL, FINGERPRINT

BROKEN = """
from themis_mpi.policies import InterPolicy


class Broken(InterPolicy):
    name = "broken"
    description = "returns an order that is no permutation"

    def order(self, chunk):
        return [0, 0, 0]
"""


def readme_example() -> tuple[str, str, str]:
    """(module name, module source, entry-point line) of the README's example plugin."""
    text = (ROOT / "docs" / "policies.md").read_text()
    block = text.split("<!-- plugin-example -->")[1]
    source = re.search(r"```python\n# (\w+)\.py\n(.*?)```", block, re.S)
    entry = re.search(r'\[project\.entry-points\."themis_mpi\.policies"\]\n(.*?)\n', block)
    assert source and entry, "the README lost its example plugin"
    return source.group(1), source.group(2), entry.group(1)


def install(site, dist: str, module: str, source: str, entry: str) -> None:
    """Lay a one-module distribution out as pip does: the module and its dist-info.

    `entry` is the pyproject line (``name = "module:Class"``); entry_points.txt has it unquoted.
    """
    (site / f"{module}.py").write_text(source)
    info = site / f"{dist.replace('-', '_')}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1\n")
    unquoted = entry.replace('"', "")
    (info / "entry_points.txt").write_text(f"[themis_mpi.policies]\n{unquoted}\n")
    (info / "RECORD").write_text("")


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """The README's plugin and a broken one, installed into a temporary site directory."""
    path = tmp_path_factory.mktemp("site")
    module, source, entry = readme_example()
    install(path, "zigzag-policy", module, source, entry)
    install(path, "broken-policy", "broken_policy", BROKEN, 'broken = "broken_policy:Broken"')
    mp = pytest.MonkeyPatch()
    mp.setenv("PYTHONPATH", str(path))
    yield path
    mp.undo()


themis = local  # `python -m themis_mpi ARGS` in one process (the model)


def test_the_plugin_is_listed_with_its_origin(site):
    """`themis-mpi policies` lists the plugin beside the built-in policies, naming its module."""
    proc = themis(["policies"])
    assert proc.returncode == 0, proc.stderr
    line = next(ln for ln in proc.stdout.splitlines() if ln.strip().startswith("zigzag"))
    assert "plugin zigzag_policy:ZigZag" in line


RUN = ["-t", "2x2x2", "-b", "1M", "-c", "8", "-p", "zigzag"]
TRAIN = ["train", str(DATA / "astra-sim-1.0-text" / "Resnet50_DataParallel.txt"), "-t", "2x2x2"]
TRAIN += ["-c", "4", "-n", "1", "--comm-scale", "0.01", "-p", "zigzag"]


@pytest.fixture(scope="module")
def emulator_runs(site, tmp_path_factory):
    """`run` and `train` with the plugin under `mpiexec -n 8`, in one job (`harness.cli_jobs`): output, JSON file."""
    tmp = tmp_path_factory.mktemp("emulator")
    runs = {"run": ["run", *RUN, "-n", "1", "-w", "0"], "train": TRAIN}
    runs = {k: [*a, "--json", str(tmp / f"{k}.json")] for k, a in runs.items()}
    done = cli_jobs({k: (8, a) for k, a in runs.items()}, tmp)
    return {k: (done[k], tmp / f"{k}.json") for k in runs}


def test_the_plugin_runs_on_the_emulator_with_exact_data_and_the_models_time(site, emulator_runs, tmp_path):
    """`mpiexec -n 8 themis-mpi run -p zigzag`: wrong = 0, and `model` gives the same time."""
    proc, emu_json = emulator_runs["run"]
    assert proc.returncode == 0, proc.stderr
    model = themis(["model", *RUN, "--json", str(tmp_path / "model.json")])
    assert model.returncode == 0, model.stderr
    (emu,) = json.loads(emu_json.read_text())
    (mod,) = json.loads((tmp_path / "model.json").read_text())
    assert emu["policy"] == "zigzag" and emu["wrong"] == 0
    assert emu["time_us"] == mod["time_us"]


def test_the_plugin_replays_a_workload_on_both_transports(site, emulator_runs, tmp_path):
    """`train -p zigzag` on the model and under mpiexec: the same iteration time, wrong = 0."""
    model = themis([*TRAIN, "--json", str(tmp_path / "model.json")])
    assert model.returncode == 0, model.stderr
    emu, emu_json = emulator_runs["train"]
    assert emu.returncode == 0, emu.stderr
    (m,) = json.loads((tmp_path / "model.json").read_text())
    (e,) = json.loads(emu_json.read_text())
    assert e["wrong"] == 0 and e["iteration_us"] == m["iteration_us"]


def test_a_broken_plugin_ends_every_rank_with_one_line_naming_it(site):
    """A plugin's invalid order is caught on rank 0; every rank exits 2 with one line naming it once, before any table."""
    proc = cli(8, ["run", "-t", "2x2x2", "-b", "1M", "-c", "4", "-p", "broken"], timeout_s=90)
    assert proc.returncode == 2
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("themis-mpi: error")]
    assert len(lines) == 1 and "policy 'broken' (plugin broken_policy:Broken)" in lines[0], proc.stderr
    assert lines[0].count("'broken'") == 1, lines[0]  # named once, with where it comes from
    assert "# themis-mpi run" not in proc.stdout  # before any table
    assert "Traceback" not in proc.stderr


WALL_CLOCK = ("wall_s", "decision_s")  # the only columns that may differ between two runs
COMMAND_AND_API = """
import json, sys, themis_mpi
from themis_mpi.cli import main
policies, args, kw, folder = json.loads(sys.argv[1])
for policy in policies:
    code = main(["model", "-p", policy, *args, "--json", f"{folder}/{policy}.json"])
    assert code == 0, (policy, code)
    with open(f"{folder}/{policy}.api.json", "w") as f:
        json.dump([r.to_dict() for r in themis_mpi.sweep(policy=policy, **kw)], f)
"""


def _rows_without_wall_clock(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if k not in WALL_CLOCK} for r in rows]


def _listed_inter_policies() -> list[str]:
    """The inter-dim policies `themis-mpi policies` lists (with the plugins of the site)."""
    proc = themis(["policies"])
    assert proc.returncode == 0, proc.stderr
    block = proc.stdout.split("# intra-dim policies")[0].splitlines()[1:]
    return [line.split()[0] for line in block]


@pytest.mark.parametrize(
    ("args", "kwargs"),
    [([], {}), (["-b", "1M", "-c", "4,16"], {"size": "1M", "chunks": [4, 16]})],
    ids=["defaults", "sizes-and-chunks"],
)
def test_the_api_and_the_command_give_the_same_rows_for_every_policy(site, tmp_path, args, kwargs):
    """`themis_mpi.sweep(policy=p)` and `themis-mpi model -p p` give the same rows for every listed policy.

    Both run in one process of their own (the plugin comes from PYTHONPATH), every policy one
    after the other: the command as its entry point runs it (`themis_mpi.cli.main`), its rows
    to a JSON file; the API's rows to another.
    """
    listed = [p for p in _listed_inter_policies() if p != "broken"]
    assert {"baseline", "themis", "predictive", "zigzag"} <= set(listed)
    job = json.dumps([listed, ["-q", *args], kwargs, str(tmp_path)])
    ran = subprocess.run(
        [sys.executable, "-c", COMMAND_AND_API, job], capture_output=True, text=True, timeout=240, cwd=ROOT
    )
    assert ran.returncode == 0, ran.stderr[-3000:]
    for policy in listed:
        command_rows = [  # a sweep file's rows also name their cell and the sweep (for --resume)
            {k: v for k, v in r.items() if k not in (CELL, FINGERPRINT)}
            for r in json.loads((tmp_path / f"{policy}.json").read_text())
        ]
        assert command_rows and all(r["policy"] == policy for r in command_rows)
        api_rows = json.loads((tmp_path / f"{policy}.api.json").read_text())
        assert _rows_without_wall_clock(api_rows) == _rows_without_wall_clock(command_rows), policy
