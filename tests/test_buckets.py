"""Rules of gradient buckets in training replay (`workloads.training.bucket_plan`), in closed form."""

import json
import subprocess
import sys

import pytest
from harness import DATA, ROOT, cli_jobs, in_process, mpi_env

from themis_mpi.config import RunConfig
from themis_mpi.cost import AG, RS, CostModel
from themis_mpi.engine import Engine
from themis_mpi.errors import UsageError
from themis_mpi.model import ModelTransport
from themis_mpi.run.coordinator import share_orders
from themis_mpi.run.training import model_training
from themis_mpi.topology import parse_topology
from themis_mpi.workloads.text import parse_workload
from themis_mpi.workloads.training import (
    TrainingLoop,
    TrainingSpec,
    bucket_plan,
    collective_of,
    distinct_collectives,
)

REFERENCE = DATA / "astra-sim-1.0-text"
MIB = 1 << 20
TOPO = "SW(4,100,0)"
F, W, G = 10, 1_000_000, 1_000_000  # forward, weight-gradient and input-gradient compute (ns)
UPDATE_1 = 700_000  # layer 1's update: longer than the forward of layer 0
# (wg op, wg MiB, update ns) of layers 0..5; layer 2 has no weight gradient
LAYERS = [("ALLREDUCE", 1, 5), ("ALLREDUCE", 2, UPDATE_1), ("NONE", 0, 0)] + [
    ("ALLREDUCE", 2, 0),
    ("ALLREDUCE", 1, 0),
    ("ALLREDUCE", 2, 0),
]


def synthetic(tmp_path, layers=LAYERS, header="DATA"):
    """A DATA workload with the given (wg op, MiB, update) per layer and the F/W/G compute times."""
    lines = [
        f"l{i} -1 {F} NONE 0 {G} NONE 0 {W} {op} {mib * MIB} {update}"
        for i, (op, mib, update) in enumerate(layers)
    ]
    path = tmp_path / "w.txt"
    path.write_text(f"{header}\n{len(lines)}\n" + "\n".join(lines) + "\n")
    return parse_workload(str(path))


def run_loop(wl, spec, topology=TOPO):
    """Run the loop on the model with 1 chunk per collective; returns the loop and the engine."""
    topo = parse_topology(topology)
    transport = ModelTransport(topo, RunConfig(network="ideal"))  # (the closed forms are ideal's)
    collectives = distinct_collectives(wl, topo, spec)
    orders = dict(zip(collectives, share_orders(transport, "baseline", collectives)))
    engine = Engine(topo, transport, transport.config)
    loop = TrainingLoop(wl, topo, spec, orders)
    engine.process(loop.process(engine))
    engine.run()
    return loop, engine


def all_reduce_ns(size_bytes):
    """A lone all-reduce of float32 on TOPO: reduce-scatter then all-gather."""
    cost = CostModel(parse_topology(TOPO), 4)
    return cost.stage_end_ns(0, RS, size_bytes // 4, 0.0) + cost.stage_end_ns(0, AG, size_bytes // 4, 0.0)


SPEC = TrainingSpec(chunks=1, iterations=1, bucket_mib=3, first_bucket_mib=1)


def test_buckets_close_at_the_cap_in_backward_order_with_a_smaller_first_bucket(tmp_path):
    """Caps 1 then 3 MiB over 2,1,2,-,2,1 MiB (layers 5..0): buckets {5}, {4,3}, {1,0}; at 3 MiB a bucket closes."""
    wl = synthetic(tmp_path)
    plan = bucket_plan(wl, parse_topology(TOPO), SPEC)
    assert [b.layers for b in plan] == [(5,), (4, 3), (1, 0)]
    assert [b.issuer for b in plan] == [5, 3, 0]
    assert [b.collective.size_bytes for b in plan] == [2 * MIB, 3 * MIB, 3 * MIB]
    assert all(b.collective.op == "all_reduce" and b.collective.dims == (0,) for b in plan)


def test_no_bucket_size_means_one_collective_per_layer(tmp_path):
    """bucket_mib 0 (the default) plans nothing and the distinct collectives are the layers' own."""
    wl = synthetic(tmp_path)
    topo = parse_topology(TOPO)
    assert bucket_plan(wl, topo, TrainingSpec()) == []
    per_layer = {collective_of(wl, layer, "wg", topo, TrainingSpec()) for layer in wl.layers} - {None}
    assert set(distinct_collectives(wl, topo, TrainingSpec())) == per_layer


def test_the_distinct_collectives_are_the_buckets(tmp_path):
    """With buckets, the orders rank 0 broadcasts are those of the fused collectives, not the layers'."""
    wl = synthetic(tmp_path)
    topo = parse_topology(TOPO)
    fused = {b.collective for b in bucket_plan(wl, topo, SPEC)}
    assert set(distinct_collectives(wl, topo, SPEC)) == fused


def test_another_op_or_group_closes_the_open_bucket(tmp_path):
    """Only consecutive collectives of one op and one set of dims share a bucket."""
    ops = [("ALLREDUCE", 1, 0), ("REDUCESCATTER", 1, 0), ("ALLREDUCE", 1, 0), ("ALLREDUCE", 1, 0)]
    wl = synthetic(tmp_path, ops)
    plan = bucket_plan(wl, parse_topology(TOPO), TrainingSpec(bucket_mib=64))
    assert [b.layers for b in plan] == [(3, 2), (1,), (0,)]
    path = tmp_path / "c.txt"  # DATA wg runs on dims 0,1; HYBRID_MODEL_DATA's on dim 0 only
    layer = f"-1 1 NONE 0 1 NONE 0 1 ALLREDUCE {MIB} 0"
    path.write_text(f"HYBRID_CUSTOMIZED\n3\na {layer} DATA\nb {layer} HYBRID_MODEL_DATA\nc {layer} DATA\n")
    plan = bucket_plan(parse_workload(str(path)), parse_topology("4x2"), TrainingSpec(bucket_mib=64))
    assert [(b.layers, b.collective.dims) for b in plan] == [((2,), (0, 1)), ((1,), (0,)), ((0,), (0, 1))]


def test_a_bucket_is_issued_when_its_last_gradient_is_ready(tmp_path):
    """Issue time of the bucket whose lowest layer is k: all forwards, (W+G) of layers above k, then W."""
    loop, engine = run_loop(synthetic(tmp_path), SPEC)
    fwd = 6 * F

    def issue(k):
        return fwd + (5 - k) * (W + G) + W

    assert [run.issued_ns for run in engine.collectives] == [issue(5), issue(3), issue(0)]
    assert [run.collective.size_bytes for run in engine.collectives] == [2 * MIB, 3 * MIB, 3 * MIB]
    assert loop.collectives_issued == 3


def test_the_next_forward_of_a_layer_waits_for_its_bucket_and_its_own_update(tmp_path):
    """Iteration 2: layer 0 starts at bucket {1,0}'s end + 5 ns, layer 1 at that end + its 700 us update."""
    spec = TrainingSpec(chunks=1, iterations=2, bucket_mib=3, first_bucket_mib=1)
    loop, engine = run_loop(synthetic(tmp_path), spec)
    first_c = engine.collectives[2]
    c_end = first_c.issued_ns + all_reduce_ns(3 * MIB)
    assert first_c.end_ns == pytest.approx(c_end)  # it ran alone: compute gaps exceed every all-reduce
    assert loop.iteration_starts[1] == first_c.issued_ns  # the backward ends when layer 0 issues
    second_a = engine.collectives[3]  # layers 2..5 forward, then layer 5's weight gradient
    assert second_a.issued_ns == pytest.approx(c_end + UPDATE_1 + 4 * F + W)


def test_buckets_smaller_than_every_gradient_give_the_per_layer_times():
    """A 1-byte bucket holds one layer: ASTRA-sim's per-layer loop, to the ns, on two reference workloads."""
    for name, topology in (
        ("Resnet50_DataParallel.txt", "2x2x2"),
        ("Transformer_HybridParallel.txt", "Ring(2,100,20)_SW(4,50,700)"),
    ):
        wl = parse_workload(str(REFERENCE / name))
        topo = parse_topology(topology)
        plain = model_training(wl, topo, "themis", TrainingSpec(chunks=4), RunConfig(intra="scf"))
        tiny = TrainingSpec(chunks=4, bucket_mib=2.0**-20)
        bucketed = model_training(wl, topo, "themis", tiny, RunConfig(intra="scf"))
        assert bucketed.total_us == plain.total_us and bucketed.collectives == plain.collectives > 0


def test_larger_buckets_issue_fewer_collectives_of_the_same_bytes():
    """ResNet-50 with 25 MiB buckets: fewer collectives per iteration, and the bucket bytes are the layers'."""
    wl = parse_workload(str(REFERENCE / "Resnet50_DataParallel.txt"))
    topo = parse_topology("2x2x2")
    spec = TrainingSpec(chunks=4, bucket_mib=25)
    plan = bucket_plan(wl, topo, spec)
    per_layer = [collective_of(wl, layer, "wg", topo, spec) for layer in wl.layers]
    assert sum(b.collective.count for b in plan) == sum(c.count for c in per_layer if c)
    assert sorted(i for b in plan for i in b.layers) == [i for i, c in enumerate(per_layer) if c]
    result = model_training(wl, topo, "baseline", spec)
    assert result.collectives == 2 * len(plan) < 2 * sum(1 for c in per_layer if c)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"bucket_mib": -1}, "bucket size"),
        ({"bucket_mib": float("nan")}, "bucket size"),
        ({"first_bucket_mib": 1}, "needs a bucket size"),
        ({"bucket_mib": 25, "first_bucket_mib": 0}, "first bucket size"),
        ({"bucket_mib": 2.0**40}, "bucket size"),
    ],
)
def test_bucket_sizes_out_of_range_are_refused(kwargs, match):
    """Bucket caps are checked at the boundary: 0 or 1 B to 1 PiB; a first cap needs a cap."""
    with pytest.raises(UsageError, match=match):
        TrainingSpec(**kwargs)


def test_buckets_on_a_chakra_trace_are_refused(tmp_path):
    """A Chakra graph has its own collectives: --bucket-mib is refused with one line and exit 2."""
    et = DATA / "astra-sim-chakra-et" / "all_reduce" / "8npus_1MB" / "all_reduce.0.et"
    proc = in_process(["train", str(et), "--bucket-mib", "25"])
    assert proc.returncode == 2 and "text workloads only" in proc.stderr


BUCKETED = [
    ("synthetic", "2x2x2", 8, ["--bucket-mib", "3", "--first-bucket-mib", "1"]),
    ("Transformer_HybridParallel.txt", "Ring(2,100,20)_SW(4,50,700)", 8, ["--bucket-mib", "0.05"]),
]


def bucketed_args(tmp_path, workload: str, topology: str, extra: list[str]) -> list[str]:
    """The training of a `BUCKETED` case (the synthetic workload written under tmp_path)."""
    path = synthetic(tmp_path).path if workload == "synthetic" else str(REFERENCE / workload)
    args = ["train", path, "-t", topology, "-c", "4", *extra]
    if workload.startswith("Transformer"):  # 30-130 kB gradients: several share a bucket
        args += ["--comm-scale", "0.001"]
    return args


@pytest.fixture(scope="module")
def bucketed(tmp_path_factory) -> dict:
    """The emulator's runs of `BUCKETED` in one mpiexec per rank count (`harness.cli_jobs`): args, job, rows."""
    tmp = tmp_path_factory.mktemp("buckets")
    args = {i: bucketed_args(tmp, w, t, x) for i, (w, t, _, x) in enumerate(BUCKETED)}
    done = cli_jobs(
        {i: (BUCKETED[i][2], [*a, "--json", str(tmp / f"emu{i}.json")]) for i, a in args.items()}, tmp
    )
    return {i: (a, done[i], tmp / f"emu{i}.json") for i, a in args.items()}


@pytest.mark.parametrize("workload,topology,ranks,extra", BUCKETED)
def test_emulator_with_buckets_equals_the_model(tmp_path, bucketed, workload, topology, ranks, extra):
    """Bucketed replay on real data: wrong = 0, and the emulator's iteration time is the model's."""
    args, proc, out_emu = bucketed[BUCKETED.index((workload, topology, ranks, extra))]
    path = args[1]
    wl = parse_workload(path)
    spec = TrainingSpec(bucket_mib=float(extra[1]), comm_scale=0.001 if "Transformer" in path else 1)
    assert any(len(b.layers) > 1 for b in bucket_plan(wl, wl.fit_topology(parse_topology(topology)), spec))
    out_model = tmp_path / "model.json"
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "gradient buckets" in proc.stdout
    model = in_process([*args, "--json", str(out_model)])
    assert model.returncode == 0, model.stderr
    emu, mod = json.loads(out_emu.read_text()), json.loads(out_model.read_text())
    assert len(emu) == len(mod) == 2
    for e, m in zip(emu, mod):
        assert e["wrong"] == 0 and e["transport"] == "mpi" and m["transport"] == "model"
        assert e["iteration_us"] == m["iteration_us"] and e["collectives"] == m["collectives"] > 0


def generate(tmp_path, *flags):
    """Run scripts/generate_workloads.py with flags into a fresh folder; the folder."""
    out = tmp_path / ("_".join(flags).strip("-") or "default")
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "generate_workloads.py"), "--out", str(out), *flags],
        capture_output=True,
        text=True,
        env=mpi_env(),
        cwd=ROOT,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    return out


def test_the_generator_reproduces_the_shipped_workloads(tmp_path):
    """Default flags give traces/*.txt and --bucket-mib 0 gives traces/per-layer/*.txt, byte for byte."""
    for flags, shipped in (((), ROOT / "traces"), (("--bucket-mib", "0"), ROOT / "traces" / "per-layer")):
        out = generate(tmp_path, *flags)
        for name in ("resnet152", "gnmt", "dlrm", "transformer_1t"):
            assert (out / f"{name}.txt").read_text() == (shipped / f"{name}.txt").read_text(), (flags, name)


def test_a_4x_faster_accelerator_quarters_the_compute_times(tmp_path):
    """--peak-tflops 3956 (4 x 989): every compute time a quarter (to the ns), update times unchanged."""
    base, fast = generate(tmp_path), generate(tmp_path, "--peak-tflops", "3956")
    for name in ("resnet152", "gnmt", "transformer_1t"):
        a, b = parse_workload(str(base / f"{name}.txt")), parse_workload(str(fast / f"{name}.txt"))
        for la, lb in zip(a.layers, b.layers):
            assert abs(lb.fwd.compute_ns - la.fwd.compute_ns / 4) <= 1 and lb.update_ns == la.update_ns
            assert lb.wg.size_bytes == la.wg.size_bytes
