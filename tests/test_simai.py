"""Rules of SimAI's pipelined workloads (`workloads.simai`, pp > 1): micro-batches, messages, 1F1B."""

import argparse

import pytest
from harness import in_process

from themis_mpi.cli.workload import simai_network
from themis_mpi.config import RunConfig
from themis_mpi.model import ModelTransport
from themis_mpi.run.training import run_graph
from themis_mpi.topology import parse_topology
from themis_mpi.workloads.chakra import Graph
from themis_mpi.workloads.et import COMM_RECV_NODE, COMM_SEND_NODE
from themis_mpi.workloads.llm import place_groups
from themis_mpi.workloads.simai import SimaiTraces, parse_simai, split_micro_batches
from themis_mpi.workloads.training import TrainingSpec

HEAD = "HYBRID_TRANSFORMER_FWD_IN_BCKWD model_parallel_NPU_group: {tp} ep: 1 pp: {pp} vpp: 1 ga: {ga} "
HEAD += "all_gpus: {gpus} checkpoints: 0 checkpoint_initiates: 0 pp_comm: {pp_comm}"
FWD_NS, IG_NS, WG_NS = 3e6, 4e6, 2e6  # one micro-batch's forward and backward on a stage


def line(
    name: str, fwd_ns: float, ig_ns: float, wg_ns: float, fwd: str = "NONE 0", wg: str = "NONE 0"
) -> str:
    """A layer line: no input-gradient collective."""
    return f"{name}\t-1\t{fwd_ns:g}\t{fwd}\t{ig_ns:g}\tNONE 0\t{wg_ns:g}\t{wg}\t100".replace(" ", "\t")


def write(tmp_path, pp: int, ga: int, tp: int = 2, dp: int = 2, step: bool = False, pp_comm: int = 2**20):
    """A file of `ga` micro-batches of two lines (TP all-reduce in the forward), with step lines if asked."""
    block = [
        line("embedding_layer", FWD_NS / 2, IG_NS / 2, WG_NS / 2, fwd="ALLREDUCE 1048576"),
        line("attention_row", FWD_NS / 2, IG_NS / 2, WG_NS / 2),
    ]
    head = [line("grad_norm", 0, 0, 0, wg="REDUCESCATTER 4194304")] if step else []
    tail = [line("optimizer1", 100, 0, 0)] if step else []
    body = head + block * ga + tail
    path = tmp_path / f"pp{pp}_ga{ga}.txt"
    text = HEAD.format(tp=tp, pp=pp, ga=ga, gpus=tp * dp * pp, pp_comm=pp_comm)
    path.write_text("\n".join([text, str(len(body)), *body]) + "\n")
    return path


def iteration_us(path, free: bool, schedule: tuple[str, int] = ("1f1b", 1)) -> float:
    """The baseline's iteration on SimAI's network, or on it with communication free."""
    wl = parse_simai(str(path))
    topo = parse_topology("SW(8,360,0)_SW(2,48.5,0)") if wl.all_gpus == 16 else None
    assert topo is not None
    if free:
        topo = topo.with_overrides([1e6] * len(topo.dims), [0.0] * len(topo.dims))
    layout = place_groups(wl.tp, wl.ep, wl.dp, wl.pp, topo)
    graph = Graph(str(path), SimaiTraces(wl, layout, schedule=schedule))  # type: ignore[arg-type]
    spec = TrainingSpec(1, "float32", 1)
    config = RunConfig(network="ideal")  # (the closed forms are ideal's)
    return run_graph(ModelTransport(layout.topology, config), graph, "baseline", spec).iteration_us


@pytest.mark.parametrize(("pp", "ga"), [(4, 8), (4, 2), (2, 5)])
def test_free_communication_gives_the_1f1b_closed_form(tmp_path, pp, ga):
    """Free communication (1 PB/s, no latency), uniform stages: (m + p - 1) (t_f + t_b), also when m < p."""
    path = write(tmp_path, pp, ga, dp=16 // (2 * pp))
    want_us = (ga + pp - 1) * (FWD_NS + IG_NS + WG_NS) / 1e3
    assert iteration_us(path, free=True) == pytest.approx(want_us, rel=1e-6)


@pytest.mark.parametrize(("pp", "ga"), [(2, 4), (4, 4)])
def test_free_communication_interleaved_gives_the_closed_form_over_v(tmp_path, pp, ga):
    """Interleaved with V = 2 chunks (one line each), free communication: (m V + p - 1) (t_f + t_b) / V."""
    path = write(tmp_path, pp, ga, dp=16 // (2 * pp))
    want_us = (ga * 2 + pp - 1) * (FWD_NS + IG_NS + WG_NS) / 2 / 1e3
    assert iteration_us(path, free=True, schedule=("interleaved", 2)) == pytest.approx(want_us, rel=1e-6)


def test_gpipe_and_1f1b_agree_with_free_communication(tmp_path):
    """Uniform stages, free communication: GPipe takes the same (m + p - 1) (t_f + t_b) as 1F1B."""
    path = write(tmp_path, 4, 3, dp=2)
    assert iteration_us(path, True, ("gpipe", 1)) == pytest.approx(iteration_us(path, True), rel=1e-6)


def test_interleaved_that_does_not_divide_is_refused_with_one_line(tmp_path):
    """Interleaved needs micro-batches divisible by PP: exit 2 and one line."""
    path = write(tmp_path, 4, 3, dp=2)
    proc = in_process(["workload", "simai", str(path), "--run", "--schedule", "interleaved:2"])
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "themis-mpi: error: interleaved needs micro-batches (3) divisible by PP 4"
    ]


def test_messages_cost_time_on_the_real_network(tmp_path):
    """The same file with its pp_comm messages over NVLink and NIC takes longer than with them free."""
    path = write(tmp_path, 4, 4, dp=2)
    assert iteration_us(path, free=False) > iteration_us(path, free=True) + 1.0


def test_a_message_crosses_the_nic_in_pp_comm_over_its_bandwidth(tmp_path):
    """PP 2 x TP 8, one micro-batch: 2 (t_f + t_b), two TP all-reduces on NVLink, two messages on the NIC."""
    pp_comm = 2**24
    path = write(tmp_path, 2, 1, tp=8, dp=1, pp_comm=pp_comm)
    all_reduce_us = 2 * 7 / 8 * 2**20 / (360 * 2**30) * 1e6
    message_us = pp_comm / (48.5 * 2**30) * 1e6
    want_us = 2 * (FWD_NS + IG_NS + WG_NS) / 1e3 + 2 * all_reduce_us + 2 * message_us
    assert iteration_us(path, free=False) == pytest.approx(want_us, rel=1e-6)


def test_each_stage_sends_and_receives_one_pp_comm_message_per_micro_batch_and_boundary(tmp_path):
    """Stage s sends m activations forward unless last and m gradients back unless first, each pp_comm bytes."""
    pp, ga, pp_comm = 4, 3, 123456
    wl = parse_simai(str(write(tmp_path, pp, ga, dp=2, pp_comm=pp_comm)))
    layout = place_groups(
        wl.tp,
        wl.ep,
        wl.dp,
        wl.pp,
        simai_network(wl.all_gpus, argparse.Namespace(nvlink_gbps=360.0, nic_gbps=48.5)),
    )
    traces = SimaiTraces(wl, layout)
    stride = wl.tp * wl.dp
    for s in range(pp):
        nodes = traces[s * stride].nodes
        sends = [n for n in nodes if n.type == COMM_SEND_NODE]
        recvs = [n for n in nodes if n.type == COMM_RECV_NODE]
        boundaries = (s > 0) + (s < pp - 1)
        assert len(sends) == len(recvs) == ga * boundaries
        assert {int(n.attr("comm_size")) for n in sends + recvs} == {pp_comm}
        peers = {int(n.attr("comm_dst")) for n in sends}
        assert peers <= {(s - 1) * stride, (s + 1) * stride}


def test_a_file_splits_into_its_ga_micro_batches_and_step_lines(tmp_path):
    """Lines before the first embedding_layer and after the last micro-batch are the step's."""
    pipe = split_micro_batches(parse_simai(str(write(tmp_path, 2, 3, dp=4, step=True))))
    assert len(pipe.micro_batches) == 3 and pipe.split
    assert [len(b) for b in pipe.micro_batches] == [2, 2, 2]
    assert [x.name for x in pipe.head + pipe.tail] == ["grad_norm", "optimizer1"]


def test_a_file_that_does_not_cut_into_ga_micro_batches_replays_as_one(tmp_path):
    """A header of ga 3 but embedding_layer once: one micro-batch, and the CLI says so."""
    path = write(tmp_path, 2, 1, dp=4)
    path.write_text(path.read_text().replace("ga: 1 ", "ga: 3 "))
    assert len(split_micro_batches(parse_simai(str(path))).micro_batches) == 1
    proc = in_process(["workload", "simai", str(path)])
    assert proc.returncode == 0, proc.stderr
    assert "not cut into its ga 3 micro-batches: replayed as one" in proc.stdout


def test_the_cli_reports_compute_and_the_1f1b_bubble_of_a_stage(tmp_path):
    """--run: compute m (t_f + t_b) plus the step, bubble (p - 1)(t_f + t_b), PP exposed > 0."""
    pp, ga = 4, 6
    proc = in_process(["workload", "simai", str(write(tmp_path, pp, ga, dp=2, step=True)), "--run"])
    assert proc.returncode == 0, proc.stderr
    row = next(line.split() for line in proc.stdout.splitlines() if line.split()[:1] == ["baseline"])
    head = next(line.split() for line in proc.stdout.splitlines() if "bubble_us" in line)[1:]
    cells = dict(zip(head[1:], map(float, row[1:])))
    assert cells["compute_us"] == pytest.approx((ga * (FWD_NS + IG_NS + WG_NS) + 100) / 1e3, rel=1e-9)
    assert cells["bubble_us"] == pytest.approx((pp - 1) * (FWD_NS + IG_NS + WG_NS) / 1e3, rel=1e-3)
    assert cells["PP_us"] > 0 and cells["TP_us"] > 0 and cells["DP_us"] > 0
