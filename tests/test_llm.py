"""Rules of the LLM workload generator (`workloads.llm`) and the linked model of pipeline stages."""

import re
from dataclasses import replace

import pytest
from harness import DATA, cli_jobs, in_process

from themis_mpi.cli.parser import LLM_PRESETS
from themis_mpi.config import RunConfig
from themis_mpi.errors import UsageError
from themis_mpi.model import ModelTransport
from themis_mpi.run.priced import price
from themis_mpi.run.training import run_graph
from themis_mpi.topology import parse_topology
from themis_mpi.workloads.chakra import Graph, load_graph
from themis_mpi.workloads.et import (
    COMM_COLL_NODE,
    COMM_RECV_NODE,
    COMM_SEND_NODE,
    Attr,
    EtTrace,
    Node,
    write_et,
)
from themis_mpi.workloads.llm import (
    PRESETS,
    LazyTraces,
    LlmConfig,
    fit_groups,
    in_flight,
    iteration_flops,
    rank_graph,
    stage_order,
    traffic,
    write_llm,
)
from themis_mpi.workloads.simai import census, parse_simai, split_type
from themis_mpi.workloads.training import TrainingSpec

SMALL = dict(layers=8, hidden=64, heads=4, seq=32, vocab=100, micro_batch=2, global_batch=16)


def line(npus):
    """A switch of npus NPUs."""
    return parse_topology(f"SW({npus},100,500)")


def graph_of(c, rank=0, topo=None):
    """One rank's generated nodes."""
    return rank_graph(c, fit_groups(c, topo or line(c.npus)), rank)


def colls(nodes, op, parallelism=None):
    """comm_size of every collective of one comm_type (and parallelism)."""
    return [
        n.attr("comm_size")
        for n in nodes
        if n.type == COMM_COLL_NODE
        and n.attr("comm_type") == op
        and parallelism in (None, n.attr("themis_parallelism"))
    ]


# --- bytes and FLOPs: Megatron-LM's accounting ---------------------------------------------------


@pytest.mark.parametrize("recompute", [False, True])
def test_tp_all_reduces_are_4_per_layer_and_micro_batch_of_bsHe(recompute):
    """TP: 2 all-reduces of b*S*H*e forward and 2 backward per layer and micro-batch (2 more with recompute)."""
    c = LlmConfig(**SMALL, tp=2, pp=2, recompute=recompute)
    sizes = colls(graph_of(c), 0)
    assert set(sizes) == {2 * 32 * 64 * 2}
    assert len(sizes) == (6 if recompute else 4) * (8 // 2) * c.micro_batches


def test_pp_moves_bsHe_per_micro_batch_across_each_boundary_both_ways():
    """PP: the ranks of one pipeline send (and receive) 2 * m * (p - 1) messages of b*S*H*e."""
    c = LlmConfig(**SMALL, pp=4)
    per_stage = [traffic(graph_of(c, s))["PP"] for s in range(4)]
    act = 2 * 32 * 64 * 2
    assert sum(per_stage) == 2 * (2 * c.micro_batches * (4 - 1)) * act  # sends + receives
    assert per_stage[0] == per_stage[3] == 2 * c.micro_batches * act


def test_dp_all_reduces_every_ranks_gradients_params_over_tp_pp():
    """ZeRO-0: the gradient all-reduces of one TP rank per stage add up to params / TP elements."""
    c = LlmConfig(**SMALL, tp=2, pp=2, dp=2)
    grads = [colls(graph_of(c, stage * 4), 0, "DP") for stage in (0, 1)]
    assert all(len(g) == 1 for g in grads)
    assert sum(g[0] for g in grads) * c.tp == c.params * c.bytes_per_element


@pytest.mark.parametrize("zero,op", [(0, 0), (1, 7), (3, 7)])
@pytest.mark.parametrize("schedule,chunks", [("1f1b", 1), ("gpipe", 1), ("interleaved", 2)])
def test_overlapped_dp_reduces_the_same_bytes_one_bucket_per_layer_behind_the_last_backward(
    zero, op, schedule, chunks
):
    """--overlap-dp: a bucket per layer of the device, issued after its last backward, adding up to the whole."""
    c = LlmConfig(**SMALL, tp=2, pp=2, dp=2, zero=zero, schedule=schedule, chunks=chunks)
    o = replace(c, overlap_dp=True)
    for rank in (0, 4):
        whole, buckets = colls(graph_of(c, rank), op, "DP"), graph_of(o, rank)
        parts = [n for n in buckets if n.type == COMM_COLL_NODE and n.name.endswith(".dp.grads")]
        assert len(whole) == 1 and sum(n.attr("comm_size") for n in parts) == whole[0]
        assert len(parts) == c.layers // c.pp
        ids = {n.id: n for n in buckets}
        last_b = f"B{c.micro_batches - 1}."
        assert all(ids[n.ctrl_deps[0]].name.startswith(last_b) for n in parts)  # after a last backward
        assert not any(set(n.ctrl_deps) & {p.id for p in parts} for n in buckets if n.name.startswith("B"))


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe"])
def test_overlapped_dp_is_never_slower_alone_and_a_shared_nic_slows_it_only_when_overlapped(schedule):
    """Under ideal, DP behind the backward never costs more; under fair a NIC shared with the pipeline costs only then."""
    shape = dict(layers=8, hidden=2048, heads=16, seq=1024, vocab=32000, micro_batch=1, global_batch=32)
    own = parse_topology("SW(4,50,1000)_SW(4,50,1000)")
    nic = parse_topology("SW(4,50,1000)_SW(4,50,1000)_NIC(0+1,50)")
    spec = TrainingSpec(chunks=4)

    def iteration_us(overlap, topo, rule):
        c = LlmConfig(**shape, pp=4, dp=4, schedule=schedule, overlap_dp=overlap)
        return price(c, fit_groups(c, topo), "baseline", RunConfig(network=rule), spec)["iteration_us"]

    assert iteration_us(True, own, "ideal") <= iteration_us(False, own, "ideal")
    assert iteration_us(False, nic, "fair") == iteration_us(False, own, "fair")  # never at once on a NIC
    assert iteration_us(True, nic, "fair") > iteration_us(True, own, "fair")


@pytest.mark.parametrize("zero", [1, 2])
def test_zero_1_and_2_reduce_scatter_gradients_and_all_gather_the_parameters(zero):
    """ZeRO-1/2: one reduce-scatter of the stage's gradients, one all-gather of its 1/DP share after the step."""
    c = LlmConfig(**SMALL, tp=2, pp=2, dp=2, zero=zero)
    rs = [sum(colls(graph_of(c, s * 4), 7)) for s in (0, 1)]
    ag = [sum(colls(graph_of(c, s * 4), 2)) for s in (0, 1)]
    assert sum(rs) * c.tp == c.params * 2
    assert ag == [r // c.dp for r in rs]
    assert colls(graph_of(c), 0, "DP") == []


def test_zero_3_all_gathers_each_layers_parameters_before_forward_and_backward():
    """ZeRO-3: 2 all-gathers per layer and micro-batch of the layer's parameters / (TP * DP)."""
    c = LlmConfig(**SMALL, tp=2, pp=2, dp=2, zero=3)
    ag = colls(graph_of(c), 2)
    assert ag == [c.layer_params * 2 // 4] * (2 * c.micro_batches * 4)


def test_ep_all_to_alls_bsHke_to_dispatch_and_combine_both_ways():
    """EP: per MoE layer and micro-batch, 4 all-to-alls of b*S*H*k*e (dispatch and combine, forward and backward)."""
    c = LlmConfig(**{**SMALL, "global_batch": 32}, dp=4, ep=2, experts=4, topk=2)
    a2a = colls(graph_of(c), 6)
    assert a2a == [2 * 32 * 64 * 2 * 2] * (4 * 8 * c.micro_batches)


@pytest.mark.parametrize("recompute", [False, True])
@pytest.mark.parametrize("moe", [False, True])
def test_the_graphs_compute_is_6PT_plus_12LSHT_flops(recompute, moe):
    """Compute summed over ranks x throughput = 6PT + 12LSHT FLOPs (8PT + 16LSHT with recompute)."""
    extra = dict(dp=2, ep=2, experts=4, topk=2) if moe else dict(dp=2)
    c = LlmConfig(**SMALL, tp=2, pp=2, recompute=recompute, **extra)
    k = 4 if recompute else 3
    p, t = c.flop_params, c.tokens
    assert iteration_flops(c) == pytest.approx(2 * k * p * t + 4 * k * 8 * 32 * 64 * t, rel=1e-12)
    assert c.flops == pytest.approx(2 * k * p * t + 4 * k * 8 * 32 * 64 * t, rel=1e-15)


def test_gpt3_175b_has_its_parameter_count_and_narayanan_flops():
    """The GPT-3 preset: 175e9 parameters (Brown et al.) and 72BsLH^2(1 + s/6H + V/12LH) FLOPs (Narayanan et al.)."""
    c = LlmConfig(**PRESETS["gpt3-175b"], tp=8, pp=8, dp=16)
    assert c.params == pytest.approx(175e9, rel=0.01)
    b, s, n, h, v = 1536, 2048, 96, 12288, 51200
    assert c.flops == pytest.approx(72 * b * s * n * h * h * (1 + s / (6 * h) + v / (12 * n * h)), rel=1e-12)
    assert set(LLM_PRESETS) == set(PRESETS)


# --- refusals ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--heads", "6", "--tp", "4"], "6 heads do not divide by TP 4"),
        (["--layers", "6", "--pp", "4"], "6 layers do not divide by PP 4"),
        (["--global-batch", "6", "--dp", "4"], "global batch 6 does not divide by micro-batch 1 x DP 4"),
    ],
)
def test_a_shape_that_does_not_divide_is_refused_with_one_line(flags, message):
    """`workload gpt` refuses heads not divisible by TP, layers by PP, the batch by b*DP: one line, exit 2."""
    base = ["--layers", "8", "--hidden", "48", "--heads", "12", "--seq", "16", "--vocab", "10"]
    proc = in_process(["workload", "gpt", *base, *flags, "-t", "SW(4,100,500)"])
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0]


def test_groups_split_a_dim_where_they_end_inside_it_and_refuse_where_they_cannot():
    """TP8 x DP16 x PP8 on HGX-H100 (8 x 32 x 4): the 32 splits 16 x 2; TP 3 on a dim of 8 is refused."""
    c = LlmConfig(**{**PRESETS["gpt3-175b"], "vocab": 0}, tp=8, pp=8, dp=16)
    layout = fit_groups(c, parse_topology("HGX-H100-SW_SW_SW"))
    assert layout.topology.shape == (8, 16, 2, 4)
    assert (layout.tp, layout.dp, layout.pp) == ((0,), (1,), (2, 3))
    bad = LlmConfig(**{**SMALL, "heads": 3, "hidden": 48, "global_batch": 12}, tp=3, pp=1, dp=2)
    with pytest.raises(UsageError, match=r"a group of 3 NPUs \(TP\) ends inside dim 1"):
        fit_groups(bad, parse_topology("SW(2,100,500)_SW(3,100,5)"))


ORDERS = ["tp-dp-pp", "tp-pp-dp", "dp-tp-pp", "dp-pp-tp", "pp-tp-dp", "pp-dp-tp"]


def members(topo, dims, rank):
    """The ranks of `topo` that share every coordinate of `rank` outside `dims` (dim 0 fastest)."""

    def coords(r):
        out = []
        for n in topo.shape:
            out.append(r % n)
            r //= n
        return out

    mine = coords(rank)
    return {
        r
        for r in range(topo.npus)
        if all(a == b for d, (a, b) in enumerate(zip(coords(r), mine, strict=True)) if d not in dims)
    }


@pytest.mark.parametrize("order", ORDERS)
def test_each_group_holds_the_ranks_its_place_in_order_says(order):
    """TP2 x DP4 x PP2 on 2x2x2x2: a group's ranks are base + k * (product of the sizes inner to it)."""
    c = LlmConfig(**SMALL, tp=2, dp=4, pp=2, order=order)
    layout = fit_groups(c, parse_topology("SW(2,100,5)_SW(2,100,5)_SW(2,100,5)_SW(2,100,5)"))
    sizes = {"tp": 2, "dp": 4, "pp": 2}
    groups = order.split("-")
    for g in groups:
        stride = 1
        for inner in groups[: groups.index(g)]:
            stride *= sizes[inner]
        for rank in range(16):
            base = rank - (rank // stride % sizes[g]) * stride
            want = {base + k * stride for k in range(sizes[g])}
            assert members(layout.topology, getattr(layout, g), rank) == want, (g, rank)


@pytest.mark.parametrize("order", ORDERS)
def test_pipeline_messages_stay_in_the_pp_group_and_collectives_on_their_groups_dims(order):
    """Every send and receive of a rank names a peer of its PP group; TP and DP collectives name their dims."""
    c = LlmConfig(**SMALL, tp=2, dp=4, pp=2, order=order)
    layout = fit_groups(c, parse_topology("SW(2,100,5)_SW(2,100,5)_SW(2,100,5)_SW(2,100,5)"))
    for rank in range(16):
        nodes = rank_graph(c, layout, rank)
        pp_group = members(layout.topology, layout.pp, rank) - {rank}
        peers = {
            int(n.attr("comm_dst" if n.type == COMM_SEND_NODE else "comm_src"))
            for n in nodes
            if n.type in (COMM_SEND_NODE, COMM_RECV_NODE)
        }
        assert peers == pp_group
        for n in nodes:
            if n.type == COMM_COLL_NODE:
                group = {"TP": layout.tp, "DP": layout.dp}[n.attr("themis_parallelism")]
                dims = [d for d, on in enumerate(n.attr("involved_dim")) if on]
                assert tuple(dims) == group


def test_an_order_whose_group_does_not_fit_the_dims_is_refused():
    """TP2 x DP3 x PP2 on 2 x 3 x 2: tp-dp-pp fits, tp-pp-dp puts a group of 4 inside the dim of 3."""
    c = dict(**{**SMALL, "global_batch": 12}, tp=2, dp=3, pp=2)
    topo = parse_topology("SW(2,100,5)_SW(3,100,5)_SW(2,100,5)")
    assert fit_groups(LlmConfig(**c), topo).topology.shape == (2, 3, 2)
    with pytest.raises(UsageError, match=r"a group of 4 NPUs \(TP x PP\) ends inside dim 1"):
        fit_groups(LlmConfig(**c, order="tp-pp-dp"), topo)


@pytest.mark.parametrize("order", ["tp-dp", "tp-dp-pp-ep", "tp-tp-pp", "x"])
def test_a_malformed_order_is_refused_at_the_cli_with_one_line(order):
    """`workload gpt --order` must list tp, dp and pp once each: one line, exit 2."""
    base = ["--layers", "8", "--hidden", "48", "--heads", "12", "--seq", "16", "--vocab", "10"]
    proc = in_process(["workload", "gpt", *base, "--tp", "2", "--pp", "2", "--order", order, "-t", "2x2"])
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "--order must list tp, dp and pp" in lines[0]


# --- pipeline schedules ----------------------------------------------------------------------------


@pytest.mark.parametrize("p, m", [(4, 8), (4, 2), (3, 7)])
def test_1f1b_holds_at_most_min_p_minus_s_m_micro_batches_and_gpipe_m(p, m):
    """In flight on stage s: min(p - s, m) under 1F1B, m under GPipe."""
    assert [in_flight(stage_order("1f1b", p, s, m)) for s in range(p)] == [min(p - s, m) for s in range(p)]
    assert [in_flight(stage_order("gpipe", p, s, m)) for s in range(p)] == [m] * p


def free_iteration_ns(schedule, p, m, chunks=1):
    """A uniform pipeline (no output layer, TP = DP = 1) on a free network: its iteration and t_f + t_b."""
    c = LlmConfig(
        **{**SMALL, "vocab": 0, "global_batch": 2 * m},
        pp=p,
        schedule=schedule,
        chunks=chunks,
        peak_tflops=1e-3,
    )
    layout = fit_groups(c, parse_topology(f"SW({p},1000000,0)"))
    graph = Graph("<free>", LazyTraces(c, layout))
    row = run_graph(
        ModelTransport(layout.topology, RunConfig()), graph, "baseline", TrainingSpec(4, "float32", 1)
    )
    return row.iteration_us * 1e3, 3 * c.layer_forward_ns * (c.layers // p)


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe"])
@pytest.mark.parametrize("p, m", [(4, 8), (2, 3), (4, 1)])
def test_1f1b_and_gpipe_take_m_plus_p_minus_1_stage_times_with_free_communication(schedule, p, m):
    """Free communication, uniform stages: the iteration is (m + p - 1) * (t_f + t_b)."""
    t, stage = free_iteration_ns(schedule, p, m)
    assert t == pytest.approx((m + p - 1) * stage, rel=1e-6)


@pytest.mark.parametrize("p, m, v", [(4, 8, 2), (2, 4, 4), (4, 4, 2)])
def test_interleaved_takes_mv_plus_p_minus_1_over_v_stage_times(p, m, v):
    """Interleaved with V chunks, free communication: (m*V + p - 1) * (t_f + t_b) / V."""
    t, stage = free_iteration_ns("interleaved", p, m, v)
    assert t == pytest.approx((m * v + p - 1) * stage / v, rel=1e-6)


def test_a_schedule_where_every_rank_waits_is_refused(tmp_path):
    """Two ranks that each receive before they send: the linked model (ideal's) names the deadlock."""
    for r in (0, 1):
        msg = dict(comm_size=64, comm_tag=1)
        recv = [Attr("comm_src", "int64", 1 - r), *[Attr(k, "int64", v) for k, v in msg.items()]]
        send = [Attr("comm_dst", "int64", 1 - r), *[Attr(k, "int64", v) for k, v in msg.items()]]
        nodes = [
            Node(1, "recv", COMM_RECV_NODE, [], attrs=recv),
            Node(2, "send", COMM_SEND_NODE, [1], attrs=send),
        ]
        write_et(str(tmp_path / f"dl.{r}.et"), EtTrace("dl", "0.0.4", [], nodes))
    with pytest.raises(UsageError, match="the graph deadlocks: ranks 0, 1"):
        run_graph(ModelTransport(line(2), RunConfig(network="ideal")), load_graph(str(tmp_path / "dl")), "baseline",
                  TrainingSpec(4, "float32", 1))  # fmt: skip


# --- the emulator --------------------------------------------------------------------------------


def rows(stdout):
    """The table rows of `train` (policy, iteration_us, compute_us, exposed_us, #wrong)."""
    return [
        (f[0], f[2], f[3], f[4], f[6])
        for f in (line.split() for line in stdout.splitlines() if re.match(r"\s+(baseline|themis)\s", line))
    ]


LAYOUTS = {
    "tp2-pp2-dp2-1f1b": dict(tp=2, pp=2, dp=2),
    "pp4-dp2-interleaved2": dict(pp=4, dp=2, schedule="interleaved", chunks=2),
    "pp2-dp4-ep2-zero3-gpipe": dict(pp=2, dp=4, ep=2, experts=4, topk=2, zero=3, schedule="gpipe"),
    "tp2-pp2-dp2-order-pp-dp-tp": dict(tp=2, pp=2, dp=2, order="pp-dp-tp"),
}


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    """Each layout's generated graph on 2x2x2 and its `train` args; every one trained in one mpiexec of 8 ranks."""
    tmp = tmp_path_factory.mktemp("llm")
    args = {}
    for layout, extra in LAYOUTS.items():
        prefix = str(tmp / layout)  # (the graph files: PREFIX.RANK.et)
        write_llm(LlmConfig(**SMALL, **extra), parse_topology("2x2x2"), prefix)
        args[layout] = ["train", prefix, "-t", "2x2x2", "-c", "4"]
    emulated = cli_jobs({layout: (8, a) for layout, a in args.items()}, tmp)
    return {layout: (a, emulated[layout]) for layout, a in args.items()}


@pytest.mark.parametrize("layout", LAYOUTS)
def test_generated_models_run_on_8_ranks_with_no_wrong_element_in_the_models_time(generated, layout):
    """TP2 x PP2 x DP2 (interleaved, MoE under ZeRO-3, PP innermost) under mpiexec -n 8: #wrong 0, the model's times."""
    args, emu = generated[layout]
    model = in_process(args)
    assert emu.returncode == 0 and model.returncode == 0, emu.stderr + model.stderr
    got, want = rows(emu.stdout), rows(model.stdout)
    assert [r[:4] for r in got] == [r[:4] for r in want] and len(got) == 2
    assert all(r[4] == "0" for r in got)


# --- SimAI's workloads ---------------------------------------------------------------------------

SIMAI = DATA / "simai"


def test_simai_files_parse_to_their_header_and_collectives_per_group():
    """workload_ep_test.txt: TP 4, EP 4, DP 8 on 32 GPUs, 43 layers, 16 EP all-to-alls of 24 MiB."""
    wl = parse_simai(str(SIMAI / "workload_ep_test.txt"))
    assert (wl.tp, wl.ep, wl.pp, wl.dp, wl.ga, len(wl.layers)) == (4, 4, 1, 8, 1, 43)
    assert census(wl)[("EP", "ALLTOALL")] == (16, 16 * 25165824)
    assert split_type("ALLGATHER_DP_EP", "wg") == ("ALLGATHER", "DP_EP")
    assert split_type("ALLGATHER", "fwd") == ("ALLGATHER", "TP") and split_type("ALLGATHER", "wg")[1] == "DP"


def test_micro_all_reduce_takes_compute_plus_2_n_minus_1_over_n_bytes_over_nvlink():
    """microAllReduce.txt: 2 x 556 us + 2 (n-1)/n x 80 MiB / 360 GB/s, within 0.1% of SimAI's 1,492 us."""
    proc = in_process(["workload", "simai", str(SIMAI / "microAllReduce.txt"), "--run", "--network", "ideal"])
    assert proc.returncode == 0, proc.stderr
    row = next(line.split() for line in proc.stdout.splitlines() if line.split()[:1] == ["baseline"])
    want_us = 2 * 556 + 2 * 7 / 8 * (16 + 64) * 2**20 / (360 * 2**30) * 1e6
    assert float(row[1]) == pytest.approx(want_us, abs=0.01)
    assert float(row[1]) == pytest.approx(1492, rel=1e-3)


def test_a_malformed_simai_file_is_refused_with_one_line(tmp_path):
    """A layer line with a missing field: one line naming file and line, exit 2."""
    bad = tmp_path / "bad.txt"
    text = (SIMAI / "microAllReduce.txt").read_text().splitlines()
    bad.write_text("\n".join([*text[:2], text[2].rsplit(None, 1)[0], text[3]]) + "\n")
    proc = in_process(["workload", "simai", str(bad)])
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"themis-mpi: error: {bad}:3: a layer line has 12 fields, got 11"
    ]
