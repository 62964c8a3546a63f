"""The packet rule (`themis_mpi.timing.packet`, the default rule): closed forms, physics, MPI, htsim.

Closed forms at latency 0 on one Switch link of B (a message of m bytes in n = ceil(m / mtu)
packets of q = m / n bytes): alone, m/B + q/B (one packet stored and forwarded); one packet, 2m/B;
two transfers started together, the second one packet behind: ends at 2m/B and 2m/B + q/B; one-packet
transfers whole, one after the other.
"""

import json
import random
import statistics

import pytest
from harness import ROOT, in_process, script
from hypothesis import given, settings
from hypothesis import strategies as st
from test_network import emulated_runs, emulator_equals_model, solo_matches_step_wise, stage_ends, topologies

from themis_mpi import api
from themis_mpi.collectives import Collective
from themis_mpi.config import RunConfig
from themis_mpi.engine import Engine
from themis_mpi.model import ModelTransport
from themis_mpi.policies import fixed_schedule
from themis_mpi.timing.fair import max_min_rates
from themis_mpi.timing.packet import DEFAULT_MTU_BYTES, packet_bytes
from themis_mpi.timing.rules import DEFAULT_RULE, PACKET, default_rule
from themis_mpi.topology import parse_topology

MTU = DEFAULT_MTU_BYTES


def one_link(op: str, nbytes: int, chunks: int, mtu: int = MTU, kind: str = "SW") -> list[float]:
    """Stage ends (ns) of `op` over KIND(2,100,0,ring) in `chunks` chunks, all active at once, packet rule."""
    topo = parse_topology(f"{kind}(2,100,0,ring)")
    coll = Collective(op, nbytes // 4, "float32", chunks, (0,))
    config = RunConfig(network="packet", active_per_dim=chunks, mtu_bytes=mtu)
    engine = Engine(topo, ModelTransport(topo, config), config)
    engine.issue(coll, fixed_schedule(coll, [[0]] * chunks))
    engine.run()
    return sorted(r.end_ns for r in engine.records)


B = parse_topology("SW(2,100,0)").dims[0].bandwidth_bytes_per_ns


def test_the_packet_rule_is_the_default_outside_the_compat_modes():
    """No --network: packet; --compat astra-sim-1.0: ideal; astra-sim-2: store-forward; nccl dims: ideal."""
    assert DEFAULT_RULE == PACKET == RunConfig().network and RunConfig().network_default
    assert default_rule("astra-sim-1.0") == "ideal" and default_rule("astra-sim-2") == "store-forward"
    assert RunConfig().on(parse_topology("SW(8,100,500,nccl)")).network == "ideal"
    assert RunConfig(network="packet").network_default is False


@pytest.mark.parametrize("message", [1000, 4096, 5000, 1 << 20])
def test_a_message_alone_crosses_a_switch_in_its_time_plus_one_packet(message):
    """A reduce-scatter step of m bytes alone on a Switch: m/B + one packet (m/ceil(m/mtu)) / B."""
    (end,) = one_link("reduce_scatter", 2 * message, 1)
    assert end == pytest.approx((message + packet_bytes(message, MTU)) / B, rel=1e-12)
    if message <= MTU:
        assert end == pytest.approx(2 * message / B, rel=1e-12)


@pytest.mark.parametrize("kind", ["Ring", "FC"])
def test_without_a_switch_a_message_takes_its_fair_time(kind):
    """Ring and FullyConnected links are one hop: nothing stored and forwarded, alone as under fair."""
    topo = parse_topology(f"{kind}(2,100,0,ring)")
    coll = Collective("reduce_scatter", (1 << 20) // 4, "float32", 1, (0,))
    assert stage_ends(topo, "fair", [coll]) == pytest.approx(
        one_link("reduce_scatter", 1 << 20, 1, kind=kind), rel=1e-12
    )


def test_two_transfers_started_together_end_one_packet_apart():
    """Two chunks' steps of m bytes start at once: round robin puts the second one packet behind; fair ends both at 2m/B."""
    m = 1 << 20
    q = packet_bytes(m, MTU)
    ends = one_link("reduce_scatter", 4 * m, 2)  # (2 chunks of 2m: a step of m each)
    assert ends == pytest.approx([2 * m / B, (2 * m + q) / B], rel=1e-12)
    coll = Collective("reduce_scatter", m, "float32", 2, (0,))
    fair = stage_ends(parse_topology("SW(2,100,0,ring)"), "fair", [coll], active=2)
    assert fair == pytest.approx([2 * m / B, 2 * m / B], rel=1e-12)


def test_one_packet_transfers_go_whole_one_after_the_other():
    """Four one-packet steps at once: the k-th ends at (k + 1) m/B, then one packet on the down-link."""
    m = 2048
    assert one_link("reduce_scatter", 4 * 2 * m, 4) == pytest.approx(
        [(k + 2) * m / B for k in range(4)], rel=1e-12
    )


def test_the_mtu_moves_the_store_and_forward_packet():
    """1 MiB alone on a Switch: m/B + mtu/B; --mtu 9000 (htsim's) against the default 4096."""
    m = 1 << 20
    for mtu in (1500, 4096, 9000):
        (end,) = one_link("reduce_scatter", 2 * m, 1, mtu=mtu)
        assert end == pytest.approx((m + packet_bytes(m, mtu)) / B, rel=1e-12)


def test_per_message_max_min_counts_a_transfer_of_k_messages_k_times():
    """Weights 3 and 1 on one link: 3/4 and 1/4 of it; weights of 1: the unweighted rates to the bit."""
    assert max_min_rates([((0, 1.0),), ((0, 1.0),)], [100.0], weights=[3, 1]) == pytest.approx([75.0, 25.0])
    rng = random.Random(7)
    for _ in range(200):
        links = rng.randint(1, 5)
        capacity = [rng.choice([10.0, 25.0, 100.0]) for _ in range(links)]
        usages = [
            tuple((link, rng.choice([0.5, 1.0])) for link in rng.sample(range(links), rng.randint(1, links)))
            for _ in range(rng.randint(1, 6))
        ]
        assert max_min_rates(usages, capacity, weights=[1] * len(usages)) == max_min_rates(usages, capacity)


def test_a_direct_step_beside_a_ring_step_on_a_shared_nic_gets_a_share_per_message():
    """Behind one NIC, a direct step (3 messages) and a ring step (1 message), started together: 3/4 and 1/4 of it."""
    topology = parse_topology("SW(4,400,0,direct)_SW(2,400,0,ring)_NIC(0+1,100)")
    nic = topology.ports[0].bandwidth_bytes_per_ns
    direct, ring = 3 * (768 << 10), 1 << 20  # (3 MiB over 4 NPUs: 3 x 768 KiB; 2 MiB over 2: 1 MiB)
    colls = [
        Collective("reduce_scatter", (3 << 20) // 4, "float32", 1, (0,)),
        Collective("reduce_scatter", (2 << 20) // 4, "float32", 1, (1,)),
    ]
    a, b = stage_ends(topology, "packet", colls)
    q = MTU / nic  # (every message here is whole 4 KiB packets; the NIC is each one's slowest link)
    t0 = q + (direct - MTU) / (0.75 * nic)  # the ring step joins one packet behind (round robin)
    assert a == pytest.approx(t0 + q, rel=1e-12)
    assert b == pytest.approx(t0 + (ring - 0.25 * nic * (t0 - q)) / nic + q, rel=1e-12)


@settings(max_examples=40, deadline=None)
@given(
    topo=topologies(),
    policy=st.sampled_from(["baseline", "themis"]),
    chunks=st.sampled_from([1, 4, 16]),
    active=st.sampled_from([1, 2, 3]),
)
def test_a_solo_stage_ends_where_the_step_wise_path_ends_it_under_the_packet_rule(
    topo, policy, chunks, active
):
    """A stage alone on its links is summed at once; a transfer that comes places it first: the step-wise times."""
    solo_matches_step_wise(topo, policy, chunks, active, "packet")


# --- issue 42's lines: the default, physics, the emulator -----------------------------------------


def test_with_no_network_flag_four_active_chunks_keep_the_one_link_time_and_no_link_is_over(tmp_path):
    """`model -t 'SW(8,100,0,ring)' -b 1G -c 16 --active-chunks-per-dim 4`: >= 17,500 us, every link <= 100 %."""
    out = tmp_path / "m.json"
    args = ["model", "-t", "SW(8,100,0,ring)", "-b", "1G", "-c", "16", "--active-chunks-per-dim", "4"]
    r = in_process([*args, "-q", "--json", str(out)])
    assert r.returncode == 0, r.stderr
    rows = json.loads(out.read_text())
    assert [row["policy"] for row in rows] == ["baseline", "themis"]
    for row in rows:
        assert row["network"] == "packet" and row["time_us"] >= 17500.0 and not row["beyond_physics"]
        assert row["links"] and max(link["busy_pct"] for link in row["links"]) <= 100 * (1 + 1e-9)


@pytest.mark.parametrize("size", ["1M", "64M"])
def test_the_hgx_presets_nic_is_never_over_its_rate_by_default(size):
    """HGX-H100-SW_SW_SW, every policy, 1 and 4 active chunks: the shared NIC's busy % <= 100."""
    for active in (1, 4):
        rows = api.sweep("HGX-H100-SW_SW_SW", size, "all", 8, active_per_dim=active)
        for row in rows:
            ports = [link.busy_pct for link in row.links if link.name.startswith("port0.")]
            assert row.network == "packet" and ports and max(ports) <= 100 * (1 + 1e-9), row.policy
            assert not row.beyond_physics


NIC8 = "Ring(2,100,20,ring)_SW(2,50,500,hd)_SW(2,50,500,ring)_NIC(1+2,46.57)"


PACKET_CASES = [("2x2x2", 1), ("2x2x2", 2), ("2x2x2", 4), ("2x2x2", 8), (NIC8, 4)]


def packet_args(topology: str, active: int) -> list[str]:
    """Every policy, 1 MiB in 16 chunks, htsim's MTU, no --network (packet is the default)."""
    return ["-t", topology, "-b", "1M", "-c", "16", "-p", "all", "--active-chunks-per-dim", str(active),
            "--mtu", "9000", "-q"]  # fmt: skip


ITERATIONS_ARGS = ["-t", "2x2x2", "-b", "4M", "-c", "16", "-p", "baseline", "-q"]
STRAGGLER_ARGS = [
    "-t",
    "SW(8,100,500,hd)",
    "-b",
    "4M",
    "-c",
    "4",
    "-p",
    "baseline",
    "-q",
    "--link-scale",
    "0:3=0.5",
]


@pytest.fixture(scope="module")
def packet_runs(tmp_path_factory):
    """The emulator's runs of this module, one mpiexec: every `PACKET_CASES` case, the iterations, the straggler."""
    cases: dict = {c: packet_args(*c) for c in PACKET_CASES}
    cases.update(iterations=[*ITERATIONS_ARGS, "-n", "3", "-w", "1"], straggler=STRAGGLER_ARGS)
    return emulated_runs(cases, tmp_path_factory.mktemp("packet"))


@pytest.mark.parametrize("topology, active", PACKET_CASES)
def test_the_emulator_equals_the_model_under_the_packet_rule(tmp_path, packet_runs, topology, active):
    """8 ranks, every policy, htsim's MTU, no --network: the emulator's times are the model's to the ns, #wrong 0."""
    emulator_equals_model(tmp_path, packet_args(topology, active), "packet", packet_runs[(topology, active)])


def test_every_iteration_of_the_emulator_takes_the_models_time(tmp_path, packet_runs):
    """`run` with a warm-up and 3 iterations: each the model's time (the rule starts each run afresh)."""
    emu, emu_json, _ = packet_runs["iterations"]
    assert emu.returncode == 0, emu.stderr
    model = in_process(["model", *ITERATIONS_ARGS, "--json", str(tmp_path / "m.json")])
    assert model.returncode == 0, model.stderr
    (e,), (m,) = json.loads(emu_json.read_text()), json.loads((tmp_path / "m.json").read_text())
    assert e["network"] == "packet" and e["time_us"] == m["time_us"] and e["wrong"] == 0


def test_a_straggler_under_the_packet_rule_runs_on_every_npus_links_and_the_emulator_agrees(
    tmp_path, packet_runs
):
    """NPU 3's links at half rate on SW(8,100,500,hd): above fair's time (its packets), and 8 ranks give the model's."""
    rows = {}
    for net in ("fair", "packet"):
        r = in_process(["model", *STRAGGLER_ARGS, "--network", net, "--json", str(tmp_path / f"{net}.json")])
        assert r.returncode == 0, r.stderr
        rows[net] = json.loads((tmp_path / f"{net}.json").read_text())[0]
    assert rows["packet"]["time_us"] > rows["fair"]["time_us"]  # (one packet stored and forwarded per step)
    emu, emu_json, _ = packet_runs["straggler"]
    assert emu.returncode == 0, emu.stderr
    e = json.loads(emu_json.read_text())[0]
    assert e["network"] == "packet" and e["time_us"] == rows["packet"]["time_us"] and e["wrong"] == 0


# --- --mtu, MTU(...), traces ----------------------------------------------------------------------


def test_an_mtu_item_in_the_topology_is_the_mtu_flag():
    """`SW(8,100,500,ring)_MTU(9000)` gives --mtu 9000's times; --mtu overrides it; the spec reads back."""
    topo = parse_topology("SW(8,100,500,ring)_MTU(9000)")
    assert topo.mtu_bytes == 9000 and parse_topology(topo.spec()) == topo
    with_item = api.sweep(topo.spec(), "4M", "baseline", 4, active_per_dim=2)[0].time_us
    with_flag = api.sweep("SW(8,100,500,ring)", "4M", "baseline", 4, active_per_dim=2, mtu_bytes=9000)[0]
    default = api.sweep("SW(8,100,500,ring)", "4M", "baseline", 4, active_per_dim=2)[0].time_us
    assert with_item == with_flag.time_us != default
    over = api.sweep(topo.spec(), "4M", "baseline", 4, active_per_dim=2, mtu_bytes=4096)[0].time_us
    assert over == default


@pytest.mark.parametrize("command", ["run", "model", "train", "replay", "workload"])
def test_every_timing_command_takes_mtu(command):
    """`--mtu BYTES` is on run, model, train, replay and workload (--run); defaulted the same but on replay."""
    r = in_process([command, "--help"])
    text = " ".join(r.stdout.split())
    default = "the recorded one" if command == "replay" else "4096, or the topology's MTU(...)"
    assert r.returncode == 0 and "--mtu BYTES" in r.stdout and f"(default {default})" in text, r.stdout


def test_replay_reproduces_a_packet_trace_run_with_another_mtu(tmp_path):
    """A trace recorded with --mtu 9000 replays to the ns without --mtu; --mtu 1500 is a what-if."""
    trace = str(tmp_path / "t.h5")
    args = ["model", "-t", "2x2x2", "-b", "1M", "-c", "4", "--active-chunks-per-dim", "2", "--mtu", "9000"]
    assert in_process([*args, "-q", "--trace", trace]).returncode == 0
    same = in_process(["replay", trace])
    assert same.returncode == 0 and "reproduces all" in same.stdout, same.stdout + same.stderr
    other = in_process(["replay", trace, "--mtu", "1500", "--json", str(tmp_path / "r.json")])
    assert other.returncode == 0 and "(changed)" in other.stdout
    doc = json.loads((tmp_path / "r.json").read_text())
    assert any(c["change"] > 0 for c in doc["collectives"])


@pytest.mark.parametrize(
    "args, message",
    [
        (["--network", "fair", "--mtu", "9000"], "--mtu is the packet rule's"),
        (["--mtu", "0"], "--mtu must be a whole number"),
        (["-t", "SW(8,100,500)_MTU(x)"], "needs a whole number of bytes"),
        (["--network", "packet", "--compat", "astra-sim-1.0"], "--compat astra-sim-1.0"),
        (["--network", "packet", "-t", "SW(8,100,500,nccl)"], "nccl"),
    ],
)
def test_settings_the_packet_rule_cannot_take_are_one_line(args, message):
    """Bad combinations: one line, exit 2, before anything runs."""
    r = in_process(["model", "-b", "1M", "-c", "4", "-q", *args])
    assert r.returncode == 2 and message in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


# --- htsim's development rows (tests/data/network-reference/htsim.csv) ----------------------------


def check_htsim():
    """scripts/check_htsim.py as a module: the rows, and one row's run as the issue's command runs it."""
    return script("check_htsim")


@pytest.fixture(scope="module")
def htsim():
    """Every development row with the packet rule's time at the goodput rate (us)."""
    mod = check_htsim()
    rows = mod.read_rows()
    for row in rows:
        row["packet"] = mod.run_row(row, "packet")
    return rows


def errors(rows):
    """Each row's relative error against htsim_us."""
    return [row["packet"] / float(row["htsim_us"]) - 1 for row in rows]


def report(rows, errs, limit):
    """One line per row whose |error| is above the limit, worst first."""
    bad = sorted(
        ((e, row["case_id"]) for e, row in zip(errs, rows) if abs(e) > limit), key=lambda x: -abs(x[0])
    )
    return "\n".join(f"{100 * e:+7.2f} %  {cid}" for e, cid in bad)


def test_the_issue_command_is_the_scripts_run(tmp_path):
    """One row as `model ... --mtu 9000 --json -` runs it gives check_htsim's time to the bit."""
    mod = check_htsim()
    row = next(r for r in mod.read_rows() if r["active"] == "4")
    args = ["model", "-t", mod.row_topology(row), "-b", row["size_bytes"], "-c", row["chunks"],
            "--active-chunks-per-dim", row["active"], "-p", "baseline", "--mtu", "9000", "--json", "-", "-q"]  # fmt: skip
    r = in_process(args)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)[0]["time_us"] == mod.run_row(row, "packet")


@pytest.mark.reference
def test_the_packet_rule_is_right_alone_and_at_the_median(htsim):
    """One active chunk (the packet and latency terms alone): every row within 1 %; all rows: median within 1 %."""
    one = [row for row in htsim if row["active"] == "1"]
    errs = errors(one)
    assert len(one) == 133 and max(abs(e) for e in errs) <= 0.01, report(one, errs, 0.01)
    assert statistics.median(abs(e) for e in errors(htsim)) <= 0.01


@pytest.mark.reference
def test_the_packet_rule_never_beats_the_bandwidth_bound(htsim):
    """Every row: at least all bytes of the busiest link at the goodput rate (no link above 100 %)."""
    mod = check_htsim()
    for row in htsim:
        p, size = int(row["npus"]), int(row["size_bytes"])
        bound_us = 2 * (p - 1) / p * size / (mod.B_GBPS * 2**30 / 1e9 / float(row["wire"])) / 1e3
        assert row["packet"] >= bound_us * (1 - 1e-9), row["case_id"]


@pytest.mark.reference
@pytest.mark.xfail(
    strict=True,
    reason="issue 42's target is out of reach of a deterministic fluid rule on 35 of 399 rows: htsim's own "
    "time moves by up to 45 % under 1-10 ns of start jitter there (tests/data/network-reference/"
    "htsim-jitter.csv), PFC pauses on halving-doubling, and htsim pads every packet to 9000 B where the "
    "goodput rate charges each message its bytes (docs/time-model.md#the-packet-rule)",
)
def test_the_packet_rule_is_within_3pct_of_htsim_on_every_development_row(htsim):
    """The issue's target: every row within 3 % of htsim_us (median within 1 %); the failing rows are listed."""
    errs = errors(htsim)
    assert max(abs(e) for e in errs) <= 0.03, "rows above 3 %:\n" + report(htsim, errs, 0.03)


# --- beyond physics (results.beyond_physics) -------------------------------------------------------


def test_a_row_beyond_physics_says_so_in_every_output_and_the_table(tmp_path):
    """Under ideal, 4 active chunks on one Switch overdraw its links 4x: beyond_physics in JSON, CSV, JSONL, a `!`."""
    base = [
        "model",
        "-t",
        "SW(8,100,0,ring)",
        "-b",
        "1G",
        "-c",
        "16",
        "--active-chunks-per-dim",
        "4",
        "-p",
        "baseline",
    ]
    for network, beyond in (("ideal", True), ("packet", False), ("fair", False)):
        out = {ext: str(tmp_path / f"{network}.{ext}") for ext in ("json", "csv", "jsonl")}
        r = in_process([*base, "--network", network, *(f for ext, p in out.items() for f in (f"--{ext}", p))])
        assert r.returncode == 0, r.stderr
        (row,) = json.loads(open(out["json"]).read())
        assert row["beyond_physics"] is beyond
        assert json.loads(open(out["jsonl"]).read().splitlines()[0])["beyond_physics"] is beyond
        (csv_row,) = list(__import__("csv").DictReader(open(out["csv"])))
        assert csv_row["beyond_physics"] == str(beyond)
        (line,) = [x for x in r.stdout.splitlines() if x.strip().startswith("1 GiB")]
        util = f"{100 * row['utilization']:.2f}"
        assert (util + "!" in line) is beyond and util in line


def test_beyond_physics_is_a_link_over_its_rate_and_not_a_sharing_rules_row():
    """HGX under ideal, Themis: its NIC over 100 % (flagged); the baseline and every packet row: not flagged."""
    (base, themis) = api.sweep("HGX-H100-SW_SW_SW", "64M", "baseline,themis", 4, network="ideal")
    assert themis.beyond_physics and not base.beyond_physics
    assert not any(r.beyond_physics for r in api.sweep("HGX-H100-SW_SW_SW", "64M", "baseline,themis", 4))


def test_a_training_row_beyond_physics_says_so():
    """DLRM with little compute behind a shared NIC: under ideal its dims overdraw the NIC (flagged); packet not."""
    workload = str(ROOT / "tests" / "data" / "astra-sim-1.0-text" / "DLRM_HybridParallel.txt")
    topo = "Ring(2,100,0)_SW(4,50,0)_SW(4,50,0)_NIC(1+2,50)"
    kw = dict(compute_scale=0.001, iterations=1)
    assert all(
        r.beyond_physics for r in api.train(workload, topo, ["baseline", "themis"], 16, network="ideal", **kw)
    )
    packet = api.train(workload, topo, ["baseline", "themis"], 16, **kw)
    assert not any(r.beyond_physics for r in packet) and {r.network for r in packet} == {"packet"}
    assert all(max(link.busy_pct for link in r.links) <= 100 * (1 + 1e-9) for r in packet)


# --- nccl dims keep the NCCL-like model -------------------------------------------------------------


def test_a_calibrated_fit_without_network_keeps_its_times(tmp_path):
    """`model -t FIT.json` (nccl dims) with no --network: ideal's times to the bit, the row says ideal."""
    fit = tmp_path / "fit.json"
    log = ROOT / "tests" / "data" / "nccl-tests" / "h100x16_2node_ib_ring_issue309_gjaion.txt"
    assert in_process(["calibrate", str(log), "--json", str(fit)]).returncode == 0
    topology = json.loads(fit.read_text())["topology"]
    assert parse_topology(topology).flat  # (the NCCL-like model's dims)
    rows = {}
    for name, flags in (("default", []), ("ideal", ["--network", "ideal"])):
        for t in (str(fit), topology):
            r = in_process(["model", "-t", t, "-b", "64M", "-e", "1G", "-f", "4", "-p", "baseline", "-q",
                            *flags, "--json", str(tmp_path / "m.json")])  # fmt: skip
            assert r.returncode == 0, r.stderr
            rows[name, t] = [
                (x["time_us"], x["network"]) for x in json.loads((tmp_path / "m.json").read_text())
            ]
    for t in (str(fit), topology):
        assert rows["default", t] == rows["ideal", t] and {n for _, n in rows["default", t]} == {"ideal"}
    refused = in_process(["model", "-t", str(fit), "-b", "64M", "--network", "packet", "-q"])
    assert refused.returncode == 2 and "nccl dims take --network ideal" in refused.stderr
