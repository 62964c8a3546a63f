"""Rules of the communication scheduler between collectives (`policies.scheduler`), on the model and MPI."""

import json
import math
import re

import pytest
from harness import DATA, ROOT, cli, cli_jobs, in_process, local

from themis_mpi.collectives import Collective
from themis_mpi.config import RunConfig
from themis_mpi.engine import Engine
from themis_mpi.errors import UsageError
from themis_mpi.policies import CommScheduler, IntraPolicy, make_inter, policy_context, scheduler_names
from themis_mpi.policies import registry as policy_registry
from themis_mpi.run.training import loop_on_model
from themis_mpi.topology import parse_topology
from themis_mpi.workloads.text import parse_workload
from themis_mpi.workloads.training import TrainingSpec, distinct_collectives, partitions

RESNET50 = DATA / "astra-sim-1.0-text" / "Resnet50_DataParallel.txt"
GNMT = ROOT / "traces" / "gnmt.txt"
RESNET152 = ROOT / "traces" / "per-layer" / "resnet152.txt"
VGG19 = ROOT / "traces" / "vgg19.txt"
MIB = 1 << 20


def run_loop(path, topology: str, spec: TrainingSpec, config: RunConfig, policy: str = "baseline"):
    """One training run on the model (`run.training.loop_on_model`); returns the loop and the engine."""
    wl = parse_workload(str(path))
    topo = wl.fit_topology(parse_topology(topology))
    collectives = distinct_collectives(wl, topo, spec)
    schedules = make_inter(policy).schedule_all(policy_context(topo, config), collectives)
    return loop_on_model(wl, topo, spec, config, dict(zip(collectives, schedules)))


def stage_rows(engine: Engine) -> list[tuple]:
    """Every stage's identity and times, in completion order."""
    return [
        (r.stage.coll, r.stage.chunk, r.stage.index, r.stage.dim, r.start_ns, r.end_ns)
        for r in engine.records
    ]


class Neutral(CommScheduler):
    """Ranks every collective alike: the queue order must stay the intra-dim policy's."""

    name = "neutral"


def test_fifo_is_the_default_and_ranks_nothing_bit_identical():
    """fifo, the default, and a scheduler that ranks every collective alike give the same stages to the bit."""
    spec = TrainingSpec(chunks=4, iterations=2, compute_scale=0.3)
    policy_registry._BUILTIN_SCHEDULERS["neutral"] = Neutral
    try:
        runs = {
            name: run_loop(RESNET50, "4x2", spec, RunConfig(intra="scf", comm_scheduler=name), "themis")[1]
            for name in ("", "fifo", "neutral")
        }
    finally:
        del policy_registry._BUILTIN_SCHEDULERS["neutral"]
    assert stage_rows(runs[""]) == stage_rows(runs["fifo"]) == stage_rows(runs["neutral"])
    assert runs[""].now_ns == runs["fifo"].now_ns == runs["neutral"].now_ns


def later_collective_passed_over(engine: Engine) -> int:
    """Stage starts while a stage of a later collective was waiting on the same dim."""
    count = 0
    for a in engine.records:
        for b in engine.records:
            waiting = b.queued_ns < a.start_ns < b.start_ns
            if b.stage.dim == a.stage.dim and b.stage.coll > a.stage.coll and waiting:
                count += 1
    return count


def test_lifo_never_starts_an_earlier_collective_while_a_later_one_waits():
    """lifo: no stage starts while a later collective's stage waits on its dim; fifo does so."""
    spec = TrainingSpec(chunks=4, iterations=1, compute_scale=0.05)
    _, lifo = run_loop(RESNET50, "Ring(8,50,0)", spec, RunConfig(comm_scheduler="lifo"))
    _, fifo = run_loop(RESNET50, "Ring(8,50,0)", spec, RunConfig(comm_scheduler="fifo"))
    assert later_collective_passed_over(lifo) == 0 < later_collective_passed_over(fifo)


def test_under_p3_the_next_iteration_starts_its_first_layer_earlier():
    """Where communication overlaps compute, p3 lets layer 0 of iteration 2 start before fifo does."""
    spec = TrainingSpec(chunks=4, iterations=2, compute_scale=0.3, partition_mib=1)
    fifo, _ = run_loop(RESNET50, "4x2", spec, RunConfig(comm_scheduler="fifo"))
    p3, _ = run_loop(RESNET50, "4x2", spec, RunConfig(comm_scheduler="p3"))
    assert p3.forward_starts[1][0] < fifo.forward_starts[1][0]


@pytest.mark.parametrize("scheduler", ["fifo", "lifo", "p3", "bytescheduler", "tictac"])
def test_the_next_forward_of_a_layer_waits_for_its_gradients_under_every_scheduler(scheduler):
    """Layer i's forward in iteration 2 starts after every partition of its iteration-1 weight gradient (and update)."""
    spec = TrainingSpec(chunks=2, iterations=2, compute_scale=0.3, partition_mib=0.5)
    config = RunConfig(comm_scheduler=scheduler, active_per_dim=2, credit_bytes=MIB)
    loop, _ = run_loop(RESNET50, "4x2", spec, config)
    checked = 0
    for (iteration, layer), runs in loop.wg_runs.items():
        if iteration == 0:
            update_ns = loop.wl.layers[layer].update_ns * spec.compute_scale
            assert loop.forward_starts[1][layer] >= max(r.end_ns for r in runs) + update_ns
            checked += 1
    assert checked > 10


def _vgg_like(tmp_path) -> str:
    """A small DATA workload whose late layers carry the large gradients (VGG's shape)."""
    sizes = [64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20]
    lines = [f"l{i} -1 20000 NONE 0 20000 NONE 0 20000 ALLREDUCE {b} 0" for i, b in enumerate(sizes)]
    path = tmp_path / "vgg_like.txt"
    path.write_text(f"DATA\n{len(sizes)}\n" + "\n".join(lines) + "\n")
    return str(path)


@pytest.mark.parametrize("workload", ["resnet50", "vgg-like", "gnmt", "vgg19", "resnet152"])
@pytest.mark.parametrize(("compute_scale", "partition_mib"), [(0.05, 2), (0.5, 2), (0.2, 0.5), (1, 8)])
def test_p3_is_never_slower_than_fifo_on_one_dim_at_latency_0(
    tmp_path, workload, compute_scale, partition_mib
):
    """One Ring dim, latency 0, one-chunk partitions: p3's iterations end no later than fifo's."""
    paths = {"resnet50": RESNET50, "gnmt": GNMT, "vgg19": VGG19, "resnet152": RESNET152}
    path = _vgg_like(tmp_path) if workload == "vgg-like" else paths[workload]
    spec = TrainingSpec(chunks=1, iterations=2, compute_scale=compute_scale, partition_mib=partition_mib)
    _, fifo = run_loop(path, "Ring(8,50,0)", spec, RunConfig(comm_scheduler="fifo"))
    _, p3 = run_loop(path, "Ring(8,50,0)", spec, RunConfig(comm_scheduler="p3"))
    assert p3.now_ns <= fifo.now_ns * (1 + 1e-12)


def in_flight_bytes(engine: Engine, dim: int) -> float:
    """The most bytes (`Stage.key_bytes`) of stages running at once on a dim, from the stage records."""
    events = []
    for r in engine.records:
        if r.stage.dim == dim:
            events += [(r.start_ns, 1, r.stage.key_bytes), (r.end_ns, 0, -r.stage.key_bytes)]
    most = now = 0
    for _, _, delta in sorted(events):  # (ends before starts at one instant)
        now += delta
        most = max(most, now)
    return most


def test_bytescheduler_never_has_more_than_its_credit_in_flight_per_dim():
    """With 4 slots per dim, bytescheduler keeps each dim's running bytes within the credit; p3 does not."""
    spec = TrainingSpec(chunks=4, iterations=1, compute_scale=0.1, partition_mib=1)
    credit = 2 * MIB
    config = RunConfig(comm_scheduler="bytescheduler", active_per_dim=4, credit_bytes=credit)
    _, engine = run_loop(RESNET50, "4x2", spec, config)
    largest = max(r.stage.key_bytes for r in engine.records)
    assert largest <= credit  # (a larger stage starts alone on an idle dim)
    for d in range(2):
        assert in_flight_bytes(engine, d) <= credit
    _, free = run_loop(RESNET50, "4x2", spec, RunConfig(comm_scheduler="p3", active_per_dim=4))
    assert max(in_flight_bytes(free, d) for d in range(2)) > credit  # the credit is what held them


def test_partitions_cover_the_tensor_in_whole_group_shares():
    """A tensor's partitions hold its elements, each at most the partition size, in group multiples, at its chunk size."""
    spec = TrainingSpec(partition_mib=1)
    for op, group in (("all_reduce", 8), ("all_gather", 8), ("reduce_scatter", 6)):
        coll = Collective(op, 3 * MIB // 4 * 3 + 5 * group, "float32", 4, (0,))
        parts = partitions(coll, spec, group)
        assert sum(p.count for p in parts) == coll.count and len(parts) > 1
        assert all(p.op == op and p.dims == (0,) for p in parts)
        kept = [p.chunks == 1 or abs(p.chunks - 4 * p.count / coll.count) <= 0.5 for p in parts]
        assert all(kept)  # each partition keeps the tensor's chunk size, rounded
        assert all(p.size_bytes <= MIB for p in parts[:-1])
        if op != "all_reduce":
            assert all(p.count % group == 0 for p in parts)
    small = Collective("all_reduce", 100, "float32", 4, (0,))
    assert partitions(small, spec, 8) == [small] == partitions(small, TrainingSpec(), 8)


def test_every_scheduler_is_listed_and_an_unknown_one_is_refused():
    """`themis-mpi policies` lists the five built-in schedulers; an unknown name is one line."""
    assert scheduler_names()[:5] == ["fifo", "lifo", "p3", "bytescheduler", "tictac"]
    with pytest.raises(UsageError, match="unknown communication scheduler 'nope'"):
        run_loop(RESNET50, "4x2", TrainingSpec(chunks=1, iterations=1), RunConfig(comm_scheduler="nope"))


class Wordy(CommScheduler):
    """Returns a priority that is no number."""

    name = "wordy"

    def priority(self, coll_id, need, collective):
        """A word."""
        return "first"


class Huge(CommScheduler):
    """Returns an int past a float's range (OverflowError in float())."""

    name = "huge"

    def priority(self, coll_id, need, collective):
        """10**400."""
        return 10**400


class Raising(CommScheduler):
    """Its gate raises."""

    name = "raising"
    gated = True

    def may_start(self, stage, running):
        """Raises."""
        raise RuntimeError("boom")


@pytest.mark.parametrize(
    ("cls", "why"),
    [
        (Wordy, "returned priority 'first'"),
        (Huge, "returned priority an integer of about 401 digits"),
        (Raising, "RuntimeError: boom"),
    ],
)
def test_a_broken_scheduler_is_refused_with_one_line_naming_it(cls, why):
    """A scheduler whose priority is no number, or whose gate raises, ends the run with a PolicyError naming it."""
    spec = TrainingSpec(chunks=4, iterations=1, compute_scale=0.1)
    policy_registry._BUILTIN_SCHEDULERS[cls.name] = cls
    try:
        with pytest.raises(UsageError, match=f"communication scheduler '{cls.name}'.*{why}"):
            run_loop(RESNET50, "4x2", spec, RunConfig(comm_scheduler=cls.name, active_per_dim=2))
    finally:
        del policy_registry._BUILTIN_SCHEDULERS[cls.name]


class FloatPosition(IntraPolicy):
    """Returns the position 0.0: a float, not an int."""

    name = "float-position"

    def position(self, queue, stage):
        """0.0."""
        return 0.0


def test_an_intra_position_that_is_no_int_is_named_as_returned():
    """A position of 0.0 is refused in one line quoting 0.0 (it was reported as "returned position -1")."""
    spec = TrainingSpec(chunks=4, iterations=1, compute_scale=0.1)
    policy_registry._BUILTIN[FloatPosition.name] = FloatPosition
    try:
        with pytest.raises(UsageError, match="'float-position' returned position 0.0; it must be an int"):
            run_loop(RESNET50, "4x2", spec, RunConfig(intra=FloatPosition.name, active_per_dim=2))
    finally:
        del policy_registry._BUILTIN[FloatPosition.name]


def test_a_scheduler_composes_with_every_inter_and_intra_policy():
    """p3 runs under every built-in inter-dim and intra-dim policy and the whole iteration still ends."""
    spec = TrainingSpec(chunks=2, iterations=1, compute_scale=0.3, partition_mib=1)
    for policy in ("baseline", "themis", "themisFlex", "roundRobin", "themis-lat"):
        for intra in ("fifo", "scf", "rg", "lrpf"):
            loop, engine = run_loop(
                RESNET50, "4x2", spec, RunConfig(intra=intra, comm_scheduler="p3"), policy
            )
            assert all(math.isfinite(c.end_ns) for c in engine.collectives)
            assert len(engine.collectives) == loop.collectives_issued


P3_ARGS = ["train", str(RESNET50), "-t", "2x2x2", "-c", "4", "-n", "2", "--comm-scale", "0.01"]
P3_ARGS += ["--compute-scale", "0.02", "-p", "themis", "--comm-scheduler", "p3", "--partition-mib", "0.02"]


@pytest.fixture(scope="module")
def emulator_runs(tmp_path_factory) -> dict:
    """The emulator's runs of this module in one mpiexec (`harness.cli_jobs`): per key its args and row.

    ``p3``: ResNet-50 under p3; ``bytescheduler``: its converted Chakra graph under bytescheduler
    with two slots per dim.
    """
    tmp = tmp_path_factory.mktemp("emulator")
    et = tmp / "r50.et"
    assert in_process(["convert", "-t", "2x2x2", "-n", "2", str(RESNET50), str(et)]).returncode == 0
    graph = ["train", str(et), "-t", "2x2x2", "-c", "4", "--comm-scale", "0.01", "--compute-scale", "0.02"]
    graph += ["-p", "themis", "--comm-scheduler", "bytescheduler", "--partition-mib", "0.02"]
    graph += ["--credit-mib", "0.05", "--active-chunks-per-dim", "2"]
    args = {"p3": P3_ARGS, "bytescheduler": graph}
    done = cli_jobs({k: (8, [*a, "--json", str(tmp / f"{k}.json")]) for k, a in args.items()}, tmp)
    out = {}
    for key, a in args.items():
        assert done[key].returncode == 0, done[key].stderr
        (row,) = json.loads((tmp / f"{key}.json").read_text())
        out[key] = (a, row)
    return out


def test_the_emulator_equals_the_model_under_p3(tmp_path, emulator_runs):
    """`mpiexec -n 8 train --comm-scheduler p3`: the model's iteration time, and every element right."""
    args, e = emulator_runs["p3"]
    model = in_process([*args, "--json", str(tmp_path / "model.json")])
    assert model.returncode == 0, model.stderr
    (m,) = json.loads((tmp_path / "model.json").read_text())
    assert e["wrong"] == 0 and e["iteration_us"] == m["iteration_us"]
    assert m["collectives"] > 54 * 2  # the tensors were sliced
    assert (e["scheduler"], e["partition_mib"]) == (m["scheduler"], m["partition_mib"]) == ("p3", 0.02)


def docs_example() -> tuple[str, str, str]:
    """(module name, module source, entry-point line) of docs/scheduling.md's example scheduler."""
    text = (ROOT / "docs" / "scheduling.md").read_text()
    block = text.split("<!-- scheduler-plugin-example -->")[1]
    source = re.search(r"```python\n# (\w+)\.py\n(.*?)```", block, re.S)
    entry = re.search(r'\[project\.entry-points\."themis_mpi\.schedulers"\]\n(.*?)\n', block)
    assert source and entry, "docs/scheduling.md lost its example scheduler"
    return source.group(1), source.group(2), entry.group(1)


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """The docs' example scheduler, installed as pip lays a distribution out, on PYTHONPATH."""
    path = tmp_path_factory.mktemp("site")
    module, source, entry = docs_example()
    (path / f"{module}.py").write_text(source)
    info = path / "smallest_first_scheduler-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: smallest-first-scheduler\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[themis_mpi.schedulers]\n{entry.replace(chr(34), '')}\n")
    (info / "RECORD").write_text("")
    mp = pytest.MonkeyPatch()
    mp.setenv("PYTHONPATH", str(path))
    yield path
    mp.undo()


def test_the_docs_scheduler_plugin_is_listed_and_runs_on_both_transports(site, tmp_path):
    """The example of docs/scheduling.md is listed, and `train` under it gives the model's time in the emulator, wrong 0."""
    listed = local(["policies"])
    assert listed.returncode == 0, listed.stderr
    line = next(ln for ln in listed.stdout.splitlines() if ln.strip().startswith("smallest-first"))
    assert "plugin smallest_first:SmallestFirst" in line
    args = ["train", str(RESNET50), "-t", "2x2", "-c", "2", "-n", "2", "--comm-scale", "0.01"]
    args += ["--compute-scale", "0.02", "--comm-scheduler", "smallest-first", "-p", "baseline"]
    model = local([*args, "--json", str(tmp_path / "model.json")])
    assert model.returncode == 0, model.stderr
    emu = cli(4, [*args, "--json", str(tmp_path / "emu.json")])
    assert emu.returncode == 0, emu.stderr
    (m,) = json.loads((tmp_path / "model.json").read_text())
    (e,) = json.loads((tmp_path / "emu.json").read_text())
    assert e["wrong"] == 0 and e["iteration_us"] == m["iteration_us"]
    fifo = local([*args[:-4], "-p", "baseline", "--json", str(tmp_path / "fifo.json")])
    assert fifo.returncode == 0, fifo.stderr
    (f,) = json.loads((tmp_path / "fifo.json").read_text())
    assert f["iteration_us"] != m["iteration_us"]  # the plugin's order is what ran


@pytest.mark.parametrize("scheduler", ["p3", "bytescheduler", "tictac", "lifo"])
def test_a_chakra_graph_converted_from_a_text_workload_schedules_as_the_text_loop(tmp_path, scheduler):
    """The same iteration time from the text loop and from its Chakra graph under each scheduler (needs agree)."""
    et = tmp_path / "r50.et"
    assert in_process(["convert", "-t", "4x2", "-n", "2", str(RESNET50), str(et)]).returncode == 0
    rows = {}
    for name, source in (("text", RESNET50), ("et", et)):
        out = tmp_path / f"{name}.json"
        args = [
            "train",
            str(source),
            "-t",
            "4x2",
            "-c",
            "2",
            "-p",
            "baseline,themis",
            "--compute-scale",
            "0.5",
        ]
        proc = in_process([*args, "--comm-scheduler", scheduler, "--partition-mib", "1", "--json", str(out)])
        assert proc.returncode == 0, proc.stderr
        rows[name] = [(r["policy"], r["iteration_us"], r["collectives"]) for r in json.loads(out.read_text())]
    assert rows["text"] == rows["et"]


def test_the_emulator_equals_the_model_on_a_chakra_graph_under_bytescheduler(tmp_path, emulator_runs):
    """A Chakra graph under bytescheduler with two slots per dim: the emulator's time is the model's, wrong 0."""
    args, e = emulator_runs["bytescheduler"]
    model = in_process([*args, "--json", str(tmp_path / "model.json")])
    assert model.returncode == 0, model.stderr
    (m,) = json.loads((tmp_path / "model.json").read_text())
    assert e["wrong"] == 0 and e["iteration_us"] == m["iteration_us"]


def test_tictac_ties_layers_needed_at_the_same_time_where_p3_ranks_by_place(tmp_path):
    """Layers 1 and 2 without forward compute between them: tictac keeps issue order, p3 puts layer 1 first."""
    layers = ["l0 -1 5000 NONE 0 10 NONE 0 10 ALLREDUCE 4194304 0"]
    layers += [f"l{i} -1 0 NONE 0 10 NONE 0 10 ALLREDUCE 4194304 0" for i in (1, 2)]
    path = tmp_path / "tie.txt"
    path.write_text("DATA\n3\n" + "\n".join(layers) + "\n")
    spec = TrainingSpec(chunks=4, iterations=2)
    ends = {}
    for name in ("tictac", "p3"):
        loop, _ = run_loop(path, "Ring(8,50,0)", spec, RunConfig(comm_scheduler=name))
        ends[name] = {layer: max(r.end_ns for r in loop.wg_runs[0, layer]) for layer in (1, 2)}
    assert loop.needs[1].need_ns == loop.needs[2].need_ns  # the tie
    assert ends["tictac"][2] < ends["tictac"][1]  # issue order: layer 2's gradient came first
    assert ends["p3"][1] < ends["p3"][2]  # place: layer 1 is needed first
