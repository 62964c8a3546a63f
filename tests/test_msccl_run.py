"""Custom algorithms as a run's collective (``--algorithm msccl:FILE``, issue 44).

The model under every registered rule, the emulator on real data over MPI, and the two agreeing
to the ns.

The four files of other people come from ../shared/custom-algos (`harness.shared`); damaged copies
are made here at run time. The fixtures in tests/data/msccl are the project's own.
"""

import dataclasses
import json

import pytest
from harness import DATA, cli, cli_jobs, in_process, shared
from test_msccl import replace_step
from test_msccl_synthesis import SIZE, TACOS_US, TORUS_2D

from themis_mpi.api import sweep
from themis_mpi.cost import ring_both_ways
from themis_mpi.msccl.build import builtin
from themis_mpi.msccl.ir import read_algorithm, write_algorithm
from themis_mpi.msccl.synthesis import synthesize_all_gather, to_algorithm
from themis_mpi.results import ideal_time_us
from themis_mpi.timing.rules import rule_names
from themis_mpi.topology import parse_topology

FIXTURES = DATA / "msccl"
# each shared file, the topology it runs on (one NPU per GPU) and its collective
SHARED_RUNS = {
    "allreduce_ring_8gpu_astrasim_example.xml": ("SW(8,100,500)", "all_reduce"),
    "allgather_hierarchical_8gpu_collectiveapi.xml": ("Ring(2,100,500)_Ring(4,100,500)", "all_gather"),
    "allreduce_1step_allpairs_4gpu_rccl.xml": ("FC(4,100,500)", "all_reduce"),
    "alltoall_8gpu_mi300_small_rccl.xml": ("SW(8,100,500)", "all_to_all"),
}
FIXTURE_RUNS = {
    "ring_allreduce_rrcs_4.xml": ("Ring(4,100,500)", "all_reduce"),
    "ring_allgather_rcs_4.xml": ("SW(4,100,500)", "all_gather"),
    "ring_reducescatter_rrs_4.xml": ("FC(4,100,500)", "reduce_scatter"),
    "alltoall_cpy_4.xml": ("SW(4,100,500)", "all_to_all"),
    "one_shot_allreduce_re_nop_4.xml": ("FC(4,100,500)", "all_reduce"),
    "ring_2ch_allreduce_8.xml": ("Ring(8,100,500)", "all_reduce"),
}


def model_us(topology, op, size, algorithm, network, chunks=1) -> float:
    """The model's time of one collective (the baseline policy: one dim, one order)."""
    (row,) = sweep(topology, size, "baseline", chunks, op=op, network=network, algorithm=[algorithm])
    return row.time_us


def run_args(topology, op, size, algorithm, network, out, chunks=2) -> list[str]:
    """`themis-mpi run` of one collective of the baseline, its JSON rows to `out`."""
    args = ["run", "-t", topology, "-o", op, "-b", size, "-c", chunks, "-p", "baseline"]
    return [str(a) for a in [*args, "--network", network, "--algorithm", algorithm, "--json", out]]


def rows_of(out) -> list[dict]:
    """The JSON rows a run wrote ([] when it wrote none)."""
    return json.loads(out.read_text()) if out.exists() else []


def emulated(n, topology, op, size, algorithm, network, tmp_path, chunks=2, process=False):
    """`themis-mpi run` under mpiexec: its exit code and output, and its one JSON row.

    A run of the resident job (`harness.cli_jobs`, no start-up of its own); with `process`, a job
    of its own (`harness.cli`), whose exit code and standard error are a process's.
    """
    out = tmp_path / "rows.json"
    args = run_args(topology, op, size, algorithm, network, out, chunks)
    proc = cli(n, args) if process else cli_jobs({0: (n, args)}, tmp_path)[0]
    return proc, rows_of(out)


def emulated_files(files: dict, tmp, size: str, network: str, chunks: int) -> dict:
    """Each file's run (name -> (path, (topology, op))) under mpiexec, one job per GPU count: name -> (process, rows)."""
    runs = {
        name: (read_algorithm(str(path)).ngpus,
               run_args(topology, op, size, f"msccl:{path}", network, tmp / f"{name}.json", chunks))
        for name, (path, (topology, op)) in files.items()
    }  # fmt: skip
    done = cli_jobs(runs, tmp)
    return {name: (done[name], rows_of(tmp / f"{name}.json")) for name in files}


@pytest.fixture(scope="module")
def shared_runs(tmp_path_factory):
    """Every shared file of `SHARED_RUNS` run under mpiexec (96K, fair, 2 chunks)."""
    folder = shared("custom-algos")
    files = {name: (folder / name, run) for name, run in SHARED_RUNS.items()}
    return emulated_files(files, tmp_path_factory.mktemp("shared"), "96K", "fair", 2)


@pytest.mark.parametrize("name", sorted(SHARED_RUNS))
def test_shared_files_run_on_the_emulator_with_the_models_time(name, shared_runs):
    """Each shared file under mpiexec: every element right, the model's time to the ns (fair)."""
    path = shared("custom-algos") / name
    topology, op = SHARED_RUNS[name]
    proc, rows = shared_runs[name]
    assert proc.returncode == 0, proc.stderr[-2000:]
    (row,) = rows
    assert row["wrong"] == 0 and row["schedule"] == f"msccl:{path}"
    (model,) = sweep(topology, "96K", "baseline", 2, op=op, network="fair", algorithm=[f"msccl:{path}"])
    assert row["time_us"] == model.time_us > 0


@pytest.fixture(scope="module")
def fixture_runs(tmp_path_factory):
    """Every fixture of `FIXTURE_RUNS` run under mpiexec (10000 elements, ideal, 3 chunks)."""
    files = {name: (FIXTURES / name, run) for name, run in FIXTURE_RUNS.items()}
    return emulated_files(files, tmp_path_factory.mktemp("fixtures"), "10000", "ideal", 3)


@pytest.mark.parametrize("name", sorted(FIXTURE_RUNS))
def test_fixtures_run_on_the_emulator_with_the_models_time(name, fixture_runs):
    """Each fused step type (rcs, rrs, rrcs, cpy, re, nop) runs rank to rank with #wrong 0."""
    topology, op = FIXTURE_RUNS[name]
    path = FIXTURES / name
    proc, rows = fixture_runs[name]
    assert proc.returncode == 0, proc.stderr[-2000:]
    (row,) = rows
    assert row["wrong"] == 0
    assert row["time_us"] == model_us(topology, op, "10000", f"msccl:{path}", "ideal", chunks=3)


def reduce_made_copy(tmp_path):
    """The shared ring all-reduce with GPU 0's first rrc made an r: well formed, wrong."""
    path = shared("custom-algos") / "allreduce_ring_8gpu_astrasim_example.xml"
    algo = read_algorithm(str(path))
    t, k = next((t, k) for t, tb in enumerate(algo.gpus[0].threadblocks) for k, st in enumerate(tb.steps)
                if st.type == "rrc")  # fmt: skip
    st = algo.gpus[0].threadblocks[t].steps[k]
    out = tmp_path / "copy.xml"
    write_algorithm(str(out), replace_step(algo, 0, t, k, dataclasses.replace(st, type="r")))
    return out


def test_a_reduce_made_a_copy_runs_and_is_wrong_on_the_emulator(tmp_path):
    """Under run the wrong file runs, reports #wrong > 0 and exits 1; the model refuses it (its proof)."""
    path = reduce_made_copy(tmp_path)
    proc, rows = emulated(
        8, "SW(8,100,500)", "all_reduce", "64K", f"msccl:{path}", "ideal", tmp_path, process=True
    )
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert rows[0]["wrong"] > 0
    model = in_process(["model", "-t", "SW(8,100,500)", "-b", "64K", "--algorithm", f"msccl:{path}"])
    assert model.returncode == 2 and "wrong result: GPU 0 output chunk" in model.stderr
    assert model.stderr.count("\n") == 1


def test_a_damaged_file_is_refused_by_model_and_run_with_the_checkers_line(tmp_path):
    """An offset out of its buffer: the checker's one line, exit 2, on the model and under mpiexec."""
    path = shared("custom-algos") / "allreduce_ring_8gpu_astrasim_example.xml"
    algo = read_algorithm(str(path))
    st = algo.gpus[4].threadblocks[0].steps[7]
    bad = tmp_path / "bad.xml"
    write_algorithm(str(bad), replace_step(algo, 4, 0, 7, dataclasses.replace(st, dstoff=9)))
    line = f"{bad}: GPU 4 threadblock 0 step 7: dstoff 9 + cnt 1 is outside the input buffer of 8 chunks"
    model = in_process(["model", "-t", "SW(8,100,500)", "-b", "64K", "--algorithm", f"msccl:{bad}"])
    assert model.returncode == 2 and line in model.stderr and model.stderr.count("\n") == 1
    proc, rows = emulated(
        8, "SW(8,100,500)", "all_reduce", "64K", f"msccl:{bad}", "ideal", tmp_path, process=True
    )
    assert proc.returncode == 2 and line in proc.stderr and proc.stderr.count("\n") == 1 and not rows


@pytest.mark.parametrize("rule", rule_names())
@pytest.mark.parametrize("size", ["1M", "64M", "1G"])
def test_the_ring_file_takes_the_built_in_rings_time(rule, size):
    """On SW(8) the shared ring file's time is the built-in ring's within 2 %, every rule."""
    path = shared("custom-algos") / "allreduce_ring_8gpu_astrasim_example.xml"
    mine = model_us("SW(8,100,500)", "all_reduce", size, f"msccl:{path}", rule)
    ring = model_us("SW(8,100,500)", "all_reduce", size, "ring", rule)
    assert mine == pytest.approx(ring, rel=0.02)


@pytest.mark.parametrize("rule", rule_names())
@pytest.mark.parametrize("size", ["1M", "64M", "1G"])
def test_the_ring_file_uses_one_of_the_two_links_the_built_in_ring_drives_on_fc(rule, size):
    """On FC(8): the built-in ring's latency terms plus twice its bandwidth term.

    The built-in ring runs both ways round a FullyConnected dim (`cost.ring_both_ways`), half
    of each message on the link to each neighbour; the shared file's one ring drives one of them.
    """
    path = shared("custom-algos") / "allreduce_ring_8gpu_astrasim_example.xml"
    latency_us = 2 * 7 * 500 / 1e3
    one_way = model_us("FC(8,100,500)", "all_reduce", size, f"msccl:{path}", rule)
    ring = model_us("FC(8,100,500)", "all_reduce", size, "ring", rule)
    assert one_way - latency_us == pytest.approx(2 * (ring - latency_us), rel=0.02)


@pytest.mark.parametrize("rule", rule_names())
def test_the_ring_file_uses_one_direction_of_a_ring_and_the_two_channel_ring_both(rule):
    """On Ring(8): the built-in ring's latency terms plus twice its bandwidth term; two channels: its time."""
    path = shared("custom-algos") / "allreduce_ring_8gpu_astrasim_example.xml"
    topo, p, size, lat_ns = "Ring(8,100,500)", 8, 64 * 2**20, 500
    ring = model_us(topo, "all_reduce", size, "ring", rule)
    latency_us = 2 * (p - 1) * lat_ns / 1e3
    bandwidth_us = 2 * (p - 1) / p * size / (100 * 2**30) * 1e6
    assert ring == pytest.approx(latency_us + bandwidth_us, rel=0.02)
    one_way = model_us(topo, "all_reduce", size, f"msccl:{path}", rule)
    assert one_way == pytest.approx(latency_us + 2 * bandwidth_us, rel=0.02)
    two = model_us(topo, "all_reduce", size, f"msccl:{FIXTURES / 'ring_2ch_allreduce_8.xml'}", rule)
    assert two == pytest.approx(ring, rel=0.02)
    if rule != "ideal":
        (row,) = sweep(topo, size, "baseline", 1, network=rule, algorithm=[f"msccl:{path}"])
        carried = {link.name: link.bytes for link in row.links}
        assert (
            min(carried["dim0.cw"], carried["dim0.ccw"]) == 0 < max(carried["dim0.cw"], carried["dim0.ccw"])
        )


def crossings(topology, against) -> list[int]:
    """Sizes (1 KiB .. 16 MiB) where all-pairs minus the built-in changes sign."""
    path = shared("custom-algos") / "allreduce_1step_allpairs_4gpu_rccl.xml"
    sizes = [2**k for k in range(10, 25)]
    diff = [
        model_us(topology, "all_reduce", s, f"msccl:{path}", "fair")
        - model_us(topology, "all_reduce", s, against, "fair")
        for s in sizes
    ]
    assert diff[0] < 0  # all-pairs faster at 1 KiB
    return [sizes[i + 1] for i in range(len(sizes) - 1) if (diff[i] < 0) != (diff[i + 1] < 0)]


def test_all_pairs_and_ring_cross_once_on_a_switch():
    """SW(4): all-pairs faster below, the built-in ring above: one sign change in 1 KiB..16 MiB."""
    assert len(crossings("SW(4,100,500)", "ring")) == 1


def test_all_pairs_against_a_fully_connected_dim():
    """FC(4): all-pairs crosses the built-in ring once, and the dim's default, direct, once.

    All-pairs sends its whole buffer over each of the three links; the ring, both ways round
    (`cost.ring_both_ways`), 0.75 times it over each of two (tests/test_msccl_fc_crossing.py).
    """
    assert len(crossings("FC(4,100,500)", "ring")) == 1
    assert len(crossings("FC(4,100,500)", "direct")) == 1


@pytest.mark.parametrize("rule", rule_names())
@pytest.mark.parametrize(
    ("algorithm", "topology"),
    [("ring", "SW(8,100,500)"), ("ring", "FC(8,100,500)"), ("direct", "FC(8,100,500)"),
     ("halving_doubling", "SW(8,100,500)"), ("halving_doubling", "FC(8,100,500)")],
)  # fmt: skip
def test_exported_builtins_take_the_builtins_time(algorithm, topology, rule, tmp_path):
    """Export then import: the file's time is the built-in algorithm's, to the ns, under every rule."""
    path = tmp_path / f"{algorithm}.xml"
    dim = parse_topology(topology).with_overrides(algorithms=[algorithm]).dims[0]
    write_algorithm(str(path), builtin(algorithm, "all_reduce", 8, ring_both_ways(dim)))  # (FC: both ways)
    for size in ("64K", "64M"):
        mine = model_us(topology, "all_reduce", size, f"msccl:{path}", rule)
        assert mine == model_us(topology, "all_reduce", size, algorithm, rule)


def test_a_training_loop_refuses_a_custom_algorithm():
    """Custom algorithms run single collectives: train says so in one line."""
    workload = DATA / "astra-sim-1.0-text" / "Resnet50_DataParallel.txt"
    args = ["train", str(workload), "-t", "SW(4,100,500)", "-n", "1"]
    proc = in_process([*args, "--algorithm", f"msccl:{FIXTURES / 'ring_allreduce_rrcs_4.xml'}"])
    assert proc.returncode == 2 and "run single collectives" in proc.stderr


def test_separate_messages_never_beat_the_links_under_ideal(tmp_path):
    """Direct on a switch: seven messages share one up-link; no rule gives more than its rate."""
    path = tmp_path / "direct.xml"
    write_algorithm(str(path), builtin("direct", "all_reduce", 8))
    size = 64 * 2**20
    bound_us = 2 * 7 / 8 * size / (100 * 2**30) * 1e6
    for rule in rule_names():
        assert model_us("SW(8,100,500)", "all_reduce", size, f"msccl:{path}", rule) >= bound_us


def test_msccl_auto_picks_by_size_and_falls_back_to_the_built_in(tmp_path):
    """msccl-auto:DIR: the file whose window holds the size, else the dim's built-in algorithm."""
    folder = tmp_path / "auto"
    folder.mkdir()
    algo = dataclasses.replace(builtin("ring", "all_reduce", 4), min_bytes=0, max_bytes=64 * 1024)
    write_algorithm(str(folder / "small.xml"), algo)
    topo, spec = "Ring(4,100,500)", f"msccl-auto:{folder}"
    (small,) = sweep(topo, "16K", "baseline", 1, network="fair", algorithm=[spec])
    (large,) = sweep(topo, "1M", "baseline", 1, network="fair", algorithm=[spec])
    assert small.schedule == f"msccl:{folder / 'small.xml'}"
    assert small.time_us == model_us(topo, "all_reduce", "16K", f"msccl:{folder / 'small.xml'}", "fair")
    assert large.schedule != small.schedule
    assert large.time_us == model_us(topo, "all_reduce", "1M", "ring", "fair")


def test_msccl_auto_runs_on_the_emulator_with_the_models_time(tmp_path):
    """msccl-auto:DIR under mpiexec: every rank picks the same file, the data is right, the time the model's."""
    folder = tmp_path / "auto"
    folder.mkdir()
    write_algorithm(str(folder / "ring.xml"), builtin("ring", "all_reduce", 4))
    proc, rows = emulated(4, "SW(4,100,500)", "all_reduce", "64K", f"msccl-auto:{folder}", "fair", tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert rows[0]["wrong"] == 0 and rows[0]["schedule"] == f"msccl:{folder / 'ring.xml'}"
    assert rows[0]["time_us"] == model_us(
        "SW(4,100,500)", "all_reduce", "64K", f"msccl-auto:{folder}", "fair", 2
    )


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["-t", "SW(4,100,500)", "--algorithm", f"msccl:{FIXTURES / 'ring_allreduce_rrcs_4.xml'}", "-o", "all_gather"],
         "it computes allreduce, not all_gather"),
        (["-t", "SW(8,100,500)", "--algorithm", f"msccl:{FIXTURES / 'ring_allreduce_rrcs_4.xml'}"],
         "it runs on 4 GPUs, the collective on 8 NPUs"),
        (["-t", "SW(4,100,500)_SW(2,100,500)", "--algorithm", f"msccl:{FIXTURES / 'ring_allreduce_rrcs_4.xml'},ring"],
         "a dim's stage maps s, r, rrc, rcs, rrcs and nop steps, not rrs"),
        (["-t", "SW(4,100,500)", "--algorithm", "msccl:"], "write msccl:FILE.xml or msccl-auto:DIR"),
        (["-t", "SW(4,100,500)", "--algorithm", f"msccl:{FIXTURES / 'ring_allreduce_rrcs_4.xml'}", "--trace", "/tmp/never.h5"],
         "a custom algorithm's steps are not traced yet"),
        (["-t", "SW(4,100,500)_SW(2,100,500)", "--dims", "0", "--algorithm", f"msccl:{FIXTURES / 'ring_allreduce_rrcs_4.xml'}"],
         "runs a collective over every NPU for now"),
        (["-t", "SW(4,100,500)", "--algorithm", "msccl-auto:/nonexistent"], "is not a directory"),
        (["-t", "SW(4,100,500)", "--algorithm", f"msccl:{FIXTURES / 'ring_allreduce_rrcs_4.xml'}", "--npu-delay-us", "1=5"],
         "run single collectives (model, run) with NPUs alike"),
    ],
    ids=["another-collective", "another-npu-count", "per-dim", "no-file", "trace", "part-of-the-npus",
         "no-directory", "stragglers"],
)  # fmt: skip
def test_custom_algorithms_that_cannot_run_are_refused_in_one_line(args, fragment):
    """A file for another collective, another NPU count, per dim, or with stragglers: one line, exit 2."""
    proc = in_process(["model", "-b", "64K", *args])
    assert proc.returncode == 2 and fragment in proc.stderr and proc.stderr.count("\n") == 1


@pytest.mark.reference
@pytest.mark.parametrize("rule", rule_names())
@pytest.mark.parametrize(("spec", "chunks"), [(k, c) for k, c in TACOS_US if c == 1])
def test_synthesized_all_gathers_reach_tacos_as_the_model_times_them(spec, chunks, rule, tmp_path):
    """`model -o all_gather -b 64M --algorithm msccl:FILE`: within 5 % of TACOS or faster, never past physics."""
    topo = parse_topology(spec)
    path = tmp_path / "ag.xml"
    write_algorithm(str(path), to_algorithm(synthesize_all_gather(topo, SIZE)))
    t_us = model_us(spec, "all_gather", SIZE, f"msccl:{path}", rule)
    assert (
        ideal_time_us("all_gather", SIZE, topo, range(len(topo.dims)))
        <= t_us
        <= 1.05 * TACOS_US[(spec, chunks)]
    )
    if spec == TORUS_2D:  # strictly faster than the hierarchical all-gather at any of its chunk counts
        rows = sweep(spec, SIZE, "baseline", [1, 4, 16, 64], op="all_gather", network=rule)
        assert t_us < min(r.time_us for r in rows)


def test_a_synthesized_all_gather_runs_on_the_emulator_with_the_models_time(tmp_path):
    """On Ring(2)_Ring(4), 8 ranks: the synthesized file moves real data right, in the model's time."""
    spec = "Ring(2,100,500)_Ring(4,100,500)"
    path = tmp_path / "ag8.xml"
    write_algorithm(str(path), to_algorithm(synthesize_all_gather(parse_topology(spec), 2**20)))
    proc, rows = emulated(8, spec, "all_gather", "1M", f"msccl:{path}", "fair", tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert rows[0]["wrong"] == 0
    assert rows[0]["time_us"] == model_us(spec, "all_gather", "1M", f"msccl:{path}", "fair", chunks=2)
