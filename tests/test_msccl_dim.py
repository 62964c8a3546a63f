"""A custom algorithm as one dim's stages (``--algorithm msccl:RS.xml+AG.xml,...``, issue 44).

An exported built-in ring, run as dim 0's reduce-scatter and all-gather inside the hierarchical
(baseline) and Themis schedules, must take the built-in ring's times on the model under
``ideal`` and ``fair``, and on the emulator move the data right in the model's time. Files that
do not fit the dim or the stage are refused in one line; a reduction made a copy is caught.
The row's per-dim figures are the file's: an exported algorithm gives the built-in's row.
"""

import pytest
from harness import DATA, cli, cli_jobs, local
from test_msccl_run import rows_of, run_args

from themis_mpi.api import sweep
from themis_mpi.cost import ring_both_ways
from themis_mpi.msccl.build import builtin
from themis_mpi.msccl.ir import write_algorithm
from themis_mpi.results import flat_row
from themis_mpi.topology import parse_topology
from themis_mpi.units import BYTES_PER_GB

TOPOLOGY = "SW(4,100,500)_SW(2,50,1000)"  # 4x2: the ring's messages never share a Switch's links


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """The built-in ring's reduce-scatter and all-gather on 4 NPUs, exported; and the dim's spec."""
    out = tmp_path_factory.mktemp("dim")
    paths = {}
    for op in ("reduce_scatter", "all_gather"):
        paths[op] = out / f"ring_{op}_4.xml"
        write_algorithm(str(paths[op]), builtin("ring", op, 4))
    paths["spec"] = f"msccl:{paths['reduce_scatter']}+{paths['all_gather']}"
    for op in ("reduce_scatter", "all_gather"):
        proc = local(
            ["synthesize", op, "-t", "Ring(4,100,500)", "-b", "1M", "--out", str(out / f"syn_{op}.xml")]
        )
        assert proc.returncode == 0, proc.stderr
    paths["synthesized"] = f"msccl:{out / 'syn_reduce_scatter.xml'}+{out / 'syn_all_gather.xml'}"
    return paths


@pytest.mark.parametrize("network", ["ideal", "fair"])
@pytest.mark.parametrize("policy", ["baseline", "themis"])
@pytest.mark.parametrize("op", ["all_reduce", "reduce_scatter", "all_gather"])
def test_exported_ring_as_dim0_takes_the_builtin_time(files, network, policy, op):
    """The file on dim 0 takes the built-in ring's time on that dim, in either schedule."""
    times = [
        sweep(TOPOLOGY, "64M", policy, 4, op=op, network=network, algorithm=[first, "direct"])[0].time_us
        for first in (files["spec"], "ring")
    ]
    assert times[0] == pytest.approx(times[1], rel=1e-9)
    # and it is the file that runs: on a Ring dim it uses one direction, the built-in ring both
    ring = [
        sweep(
            "Ring(4,100,500)_SW(2,50,1000)",
            "64M",
            "baseline",
            4,
            op=op,
            network=network,
            algorithm=[first, "direct"],
        )
        for first in (files["spec"], "ring")
    ]
    assert ring[0][0].time_us > 1.5 * ring[1][0].time_us


def test_emulator_moves_the_data_right_in_the_models_time(files, tmp_path):
    """Under mpiexec -n 8: #wrong 0 and the model's time, both schedules, ideal and fair (one job, `cli_jobs`)."""
    runs = {}
    for network in ("ideal", "fair"):
        for policy in ("baseline", "themis"):
            out = tmp_path / f"{network}_{policy}.json"
            args = run_args(TOPOLOGY, "all_reduce", "1M", f"{files['spec']},direct", network, out, chunks=4)
            args[args.index("baseline")] = policy
            runs[network, policy] = (8, args)
    done = cli_jobs(runs, tmp_path)
    for network in ("ideal", "fair"):
        for policy in ("baseline", "themis"):
            out = tmp_path / f"{network}_{policy}.json"
            proc = done[network, policy]
            assert proc.returncode == 0, proc.stderr
            (row,) = rows_of(out)
            assert row["wrong"] == 0
            want = sweep(TOPOLOGY, "1M", policy, 4, network=network, algorithm=["ring", "direct"])[0].time_us
            assert row["time_us"] == pytest.approx(want, rel=1e-9)
            model = sweep(TOPOLOGY, "1M", policy, 4, network=network, algorithm=[files["spec"], "direct"])[0]
            assert [d["bytes"] for d in row["dims"]] == [d.bytes for d in model.dims]  # (the file's figures)
            assert [x["bytes"] for x in row["links"]] == pytest.approx([x.bytes for x in model.links])


def test_a_file_that_does_not_fit_is_refused_in_one_line(files, tmp_path):
    """A wrong coll for the stage, a wrong ngpus for the dim: one line each, exit 2."""
    gather_only = [f"msccl:{files['all_gather']}", "direct"]
    with pytest.raises(
        Exception, match=r"dim 0 \(msccl:.*\): its reduce-scatter stages need a reduce_scatter file"
    ):
        sweep(TOPOLOGY, "1M", "baseline", 1, algorithm=gather_only)
    wide = tmp_path / "ring_all_gather_8.xml"
    write_algorithm(str(wide), builtin("ring", "all_gather", 8))
    with pytest.raises(Exception, match="it runs on 8 GPUs, dim 0 has 4 NPUs"):
        sweep(TOPOLOGY, "1M", "baseline", 1, op="all_gather", algorithm=[f"msccl:{wide}", "direct"])
    out = tmp_path / "none.json"
    proc = cli(8, run_args(TOPOLOGY, "all_gather", "1M", f"msccl:{wide},direct", "fair", out))
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "dim 0 has 4 NPUs" in proc.stderr


def test_a_reduction_made_a_copy_gives_wrong_elements(files, tmp_path):
    """Rrc made r: the checker passes it, the emulator counts wrong elements and exits 1."""
    bad = tmp_path / "copy_rs.xml"
    bad.write_text(files["reduce_scatter"].read_text().replace('type="rrc"', 'type="r"'))
    out = tmp_path / "copy.json"
    spec = f"msccl:{bad}+{files['all_gather']},direct"
    proc = cli(8, run_args(TOPOLOGY, "all_reduce", "1M", spec, "fair", out))
    assert proc.returncode == 1, proc.stderr
    (row,) = rows_of(out)
    assert row["wrong"] > 0


@pytest.mark.parametrize(
    "topology, algorithms",
    [
        # the last dim's all-reduce stage of the baseline: the two files in turn
        ("SW(2,50,1000)_SW(4,100,500)", ["direct", "{spec}"]),
        # an all-gather of fused steps (rcs: receive, keep, send on), not the built-in's shape
        (
            "SW(4,100,500)_SW(2,50,1000)",
            ["msccl:{rs}+" + str(DATA / "msccl" / "ring_allgather_rcs_4.xml"), "direct"],
        ),
        # synthesized for a Ring dim: several threadblocks a GPU, with waits, both ways round
        ("Ring(4,100,500)_SW(2,50,1000)", ["{synthesized}", "direct"]),
    ],
    ids=["last-dim-all-reduce", "fused-all-gather", "synthesized"],
)
def test_other_stages_run_right_in_the_models_time(files, tmp_path, topology, algorithms):
    """The emulator's time is the model's and every element is right, whatever the file's shape."""
    algorithm = [a.format(rs=files["reduce_scatter"], **files) for a in algorithms]
    out = tmp_path / "row.json"
    proc = cli_jobs(
        {0: (8, run_args(topology, "all_reduce", "1M", ",".join(algorithm), "fair", out, chunks=4))}, tmp_path
    )[0]
    assert proc.returncode == 0, proc.stderr
    (row,) = rows_of(out)
    assert row["wrong"] == 0
    model = sweep(topology, "1M", "baseline", 4, network="fair", algorithm=algorithm)[0].time_us
    assert row["time_us"] == pytest.approx(model, rel=1e-9)


def test_what_a_dims_custom_stages_cannot_run_is_refused(files):
    """A twin dim the transport cannot tell apart, stragglers, a compat (sharing: test_msccl_shared.py)."""
    with pytest.raises(Exception, match="dim 1 of the same size and built-in algorithm"):
        sweep("SW(4,100,500)_SW(4,50,1000)", "1M", "baseline", 4, algorithm=[files["spec"], "hd"])
    for extra in (["--npu-delay-us", "1=5"], ["--compat", "astra-sim-1.0"]):
        proc = local(["model", "-t", TOPOLOGY, "-b", "1M", "--algorithm", f"{files['spec']},direct", *extra])
        assert (
            proc.returncode == 2
            and "a dim's custom stages run on the virtual clock, with NPUs alike" in proc.stderr
        )


def exported_stages(out, algorithm: str, npus: int = 4, both_ways: bool = False) -> str:
    """The built-in algorithm's reduce-scatter and all-gather on `npus` NPUs, exported: a dim's spec.

    `both_ways`: the ring both ways round, as it runs on a FullyConnected dim (`cost.ring_both_ways`).
    """
    paths = []
    for op in ("reduce_scatter", "all_gather"):
        paths.append(out / f"{algorithm}_{op}_{npus}{'_2ch' if both_ways else ''}.xml")
        if not paths[-1].exists():
            write_algorithm(str(paths[-1]), builtin(algorithm, op, npus, both_ways))
    return "msccl:" + "+".join(map(str, paths))


NAMES = ("topology", "schedule", "wall_s", "decision_s")  # (the algorithm's names, and wall clocks)


@pytest.mark.parametrize("network", ["ideal", "fair"])
@pytest.mark.parametrize("first", ["FC(4,100,500)", "SW(4,100,500)"])
@pytest.mark.parametrize("algorithm", ["ring", "direct", "halving_doubling"])
def test_an_exported_dim_gives_the_builtins_row_field_by_field(tmp_path, network, first, algorithm):
    """Run as dim 0's file (the dim's default the fallback), an exported built-in algorithm's row is the built-in's.

    Time, dimbound_us, every dim's busy time, bytes, stages and busy share, every link's bytes:
    all from what the file's programs put on the dim, equal to the built-in's. Themis counts
    what the file puts on the dim's busiest link (`PolicyContext.custom_scale`): where that is
    the bytes it counts for every built-in algorithm (a Switch; direct and the ring both ways round
    on FullyConnected) it chooses as with the built-in; halving-doubling on FullyConnected holds
    one peer link of B/3 longer, and Themis, seeing it, chooses otherwise (test_msccl_shared.py).
    """
    topology = f"{first}_SW(2,50,1000)"
    dim = parse_topology(first).with_overrides(algorithms=[algorithm]).dims[0]
    spec = exported_stages(tmp_path, algorithm, both_ways=ring_both_ways(dim))
    same_load = not (first.startswith("FC") and algorithm == "halving_doubling")
    for policy in ("baseline", "themis") if same_load else ("baseline",):
        rows = [
            flat_row(sweep(topology, "64M", policy, 4, network=network, algorithm=[a, "direct"])[0].to_dict())
            for a in (spec, algorithm)
        ]
        for row in rows:
            for name in NAMES:
                row.pop(name)
        assert rows[0].keys() == rows[1].keys()
        for key, value in rows[1].items():  # (sums in another order: the last bits may differ)
            want = pytest.approx(value, rel=1e-12, abs=1e-9) if isinstance(value, float) else value
            assert rows[0][key] == want, key


@pytest.mark.parametrize("network", ["ideal", "fair"])
def test_a_one_way_ring_on_a_ring_dim_shows_its_doubled_busy_time(tmp_path, network):
    """The exported ring, every byte clockwise, shows the busy time it has on a Ring dim.

    On B/2 each way its busy time is the built-in ring's (half each way) plus the dim's bandwidth
    term once more; under a sharing rule the clockwise link carries all of NPU 0's bytes, the
    other none.
    """
    topology, spec = "Ring(4,100,500)_SW(2,50,1000)", exported_stages(tmp_path, "ring")
    mine, builtin_ring = (
        sweep(topology, "64M", "baseline", 4, network=network, algorithm=[a, "direct"])[0]
        for a in (spec, "ring")
    )
    dim, want = mine.dims[0], builtin_ring.dims[0]
    bandwidth_term_us = want.bytes / (100 * BYTES_PER_GB / 1e9) / 1e3
    assert dim.bytes == want.bytes
    assert dim.busy_us == pytest.approx(want.busy_us + bandwidth_term_us, rel=1e-12)
    if network == "fair":
        links = {x.name: x.bytes for x in mine.links}
        assert links["dim0.cw"] == pytest.approx(dim.bytes) and links["dim0.ccw"] == 0
        assert {x.name: x.bytes for x in builtin_ring.links}["dim0.ccw"] == pytest.approx(dim.bytes / 2)
        assert dim.utilization == pytest.approx(
            links["dim0.cw"] / (50 * BYTES_PER_GB / 1e9) / (mine.time_us * 1e3)
        )
