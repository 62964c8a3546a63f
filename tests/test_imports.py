"""Rules for what an MPI rank imports: every rank pays for its imports on cores the job shares.

Each rule runs a fresh Python (or an mpiexec job) that writes its ``sys.modules`` to a file.
"""

import json
import subprocess
import sys

from harness import ROOT, mpi_env, mpirun

HEAVY = ("h5py", "matplotlib", "yaml", "tqdm")  # HDF5 traces, plots, YAML topologies, progress bars
RANK0_CODE = (  # the package's modules that only rank 0, or other commands, use
    "themis_mpi.api",
    "themis_mpi.trace",
    "themis_mpi.plots",
    "themis_mpi.perfetto",
    "themis_mpi.calibrate",
    "themis_mpi.workloads",  # text, training and Chakra: `train` and `convert` only
    "themis_mpi.run.training",
    "themis_mpi.replay",
    "themis_mpi.astra",
    "themis_mpi.analysis",
)
AVOIDABLE = (  # what a run of built-in policies needs on no rank
    "importlib.metadata",  # read only for a policy name that is not built in
    "numpy.ma",  # numpy.median imports it: 25 ms of CPU per rank
)

# Runs `body`, then writes this process's module names to DIR/modules.<rank>.json.
PROBE = """
import json, os, sys
{body}
rank = next((os.environ[k] for k in ("PMI_RANK", "OMPI_COMM_WORLD_RANK") if k in os.environ), "0")
with open(os.path.join({out!r}, f"modules.{{rank}}.json"), "w") as f:
    json.dump(sorted(sys.modules), f)
"""
TOPO = "Ring(2,100,20)_SW(2,100,700)"
RUN_CLI = "from themis_mpi.cli import main\nassert main(sys.argv[1:]) == 0"


def _probe(tmp_path, body: str, args=()) -> set:
    """Module names after `body` in one fresh Python process."""
    code = PROBE.format(body=body, out=str(tmp_path))
    proc = subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        env=mpi_env(),
        cwd=ROOT,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return set(json.loads((tmp_path / "modules.0.json").read_text()))


def _probe_mpi(tmp_path, n: int, args: list[str]) -> dict[int, set]:
    """Module names of every rank after `themis-mpi ARGS` under mpiexec with n ranks."""
    proc = mpirun(n, ["-c", PROBE.format(body=RUN_CLI, out=str(tmp_path)), *args])
    assert proc.returncode == 0, proc.stderr[-3000:]
    return {r: set(json.loads((tmp_path / f"modules.{r}.json").read_text())) for r in range(n)}


def _loaded(modules: set, names) -> list[str]:
    """The names, or submodules of them, that are in `modules`."""
    return sorted(m for m in modules if any(m == n or m.startswith(n + ".") for n in names))


def test_importing_the_package_loads_neither_heavy_modules_nor_the_api(tmp_path):
    """`import themis_mpi` loads no h5py, matplotlib, yaml or tqdm and not the model API."""
    modules = _probe(tmp_path, "import themis_mpi")
    assert _loaded(modules, HEAVY + RANK0_CODE + ("themis_mpi.run", "themis_mpi.model")) == []


def test_the_api_is_imported_on_first_use(tmp_path):
    """`themis_mpi.sweep` still works: the attribute loads `themis_mpi.api` when first asked for."""
    modules = _probe(tmp_path, "import themis_mpi\nassert themis_mpi.sweep is themis_mpi.api.sweep")
    assert "themis_mpi.api" in modules and _loaded(modules, HEAVY) == []


def test_the_cli_with_run_arguments_loads_only_what_every_rank_needs(tmp_path):
    """Importing the CLI and parsing `run` arguments loads no heavy module and no rank-0-only code."""
    body = "from themis_mpi.cli import build_parser\nbuild_parser().parse_args(['run', '-b', '1M', '-q'])"
    modules = _probe(tmp_path, body)
    assert _loaded(modules, HEAVY + RANK0_CODE) == []


def test_the_probe_sees_a_heavy_import_when_one_happens(tmp_path):
    """A model run on an ASTRA-sim YAML topology loads yaml, and the probe reports it."""
    net = tmp_path / "net.yml"
    net.write_text("topology: [Ring, Switch]\nnpus_count: [2, 2]\nbandwidth: [100, 50]\nlatency: [20, 700]\n")
    modules = _probe(tmp_path, RUN_CLI, ["model", "-t", str(net), "-b", "1M", "-q"])
    assert {m.split(".")[0] for m in _loaded(modules, HEAVY)} == {"yaml"}


def test_every_rank_of_a_run_loads_no_heavy_module_and_no_rank0_code(tmp_path):
    """No rank of `run --json` loads heavy or avoidable modules, or code other commands use."""
    ranks = _probe_mpi(tmp_path, 4, ["run", "-t", TOPO, "-b", "64K", "-n", "1", "-w", "0",
                                     "--json", str(tmp_path / "rows.json"), "-q"])  # fmt: skip
    assert (tmp_path / "rows.json").exists()
    for rank, modules in ranks.items():
        assert _loaded(modules, HEAVY + RANK0_CODE) == [], f"rank {rank}"
        assert _loaded(modules, AVOIDABLE) == [], f"rank {rank}"
        assert "themis_mpi.mpi.transport" in modules, f"rank {rank} did not run the emulator"


def test_no_rank_of_a_traced_run_imports_h5py(tmp_path):
    """With --trace, rank 0 writes the HDF5 file in a child process; no rank imports h5py itself."""
    trace = tmp_path / "run.h5"
    ranks = _probe_mpi(tmp_path, 4, ["run", "-t", TOPO, "-b", "64K", "-n", "1", "-w", "0",
                                     "--trace", str(trace), "-q"])  # fmt: skip
    assert trace.exists()
    for rank, modules in ranks.items():
        assert _loaded(modules, HEAVY) == [], f"rank {rank}"
        assert "themis_mpi.trace" in modules, f"rank {rank} did not record"
