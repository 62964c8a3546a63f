"""Rules of scripts/study_llm.py and of its shipped results (docs/llm/study.json)."""

import json

import pytest
from harness import ROOT, on_two_cores, script

from themis_mpi.run import priced
from themis_mpi.topology import parse_topology
from themis_mpi.workloads.llm import compute_ns, fit_groups, rank_graph

SHIPPED = ROOT / "docs" / "llm" / "study.json"


def load_script():
    """The script as a module (`harness.script`)."""
    return script("study_llm")


@pytest.fixture(scope="module")
def shipped():
    """The shipped study's cells."""
    return json.loads(SHIPPED.read_text())


def fitted(rows):
    """The cells whose groups fit their topology."""
    return [r for r in rows if r["fits"]]


def without_wall_clock(row, keys):
    """A row without its wall-clock keys."""
    return {k: v for k, v in row.items() if k not in keys}


def price_part(job: tuple) -> dict:
    """`run.priced.price_all` of some of a cell's policies (a worker of `price_on_two_cores`)."""
    return priced.price_all(*job)


def price_on_two_cores(c, layout, policies, spec, progress=None) -> dict:
    """`run.priced.price_all`, its policies in two parts priced at once (`harness.on_two_cores`).

    The same rows, in the same order: each policy's runs are its own, and the two runs without
    collectives that every row shares are run again in the second part, under its first policy,
    which schedules nothing in them (`price_all`'s docstring). The quick cell's 22 runs then take
    the time of 14 on two cores.
    """
    assert progress is None  # (the script tells no progress)
    half = (len(policies) + 1) // 2
    jobs = [(c, layout, part, spec) for part in (policies[:half], policies[half:]) if part]
    return {policy: row for part in on_two_cores(price_part, jobs) for policy, row in part.items()}


def test_the_quick_run_gives_the_shipped_rows_of_its_cells(tmp_path, shipped, monkeypatch):
    """`study_llm.py --quick` prices its cells exactly as the documented full run did (`price_on_two_cores`)."""
    module = load_script()
    monkeypatch.setattr(module, "price_all", price_on_two_cores)
    rows = module.main(["--quick", "--out", str(tmp_path)])
    assert len(rows) == len(module.QUICK) >= 1
    assert json.loads((tmp_path / "study.json").read_text()) == json.loads(json.dumps(rows))
    assert (tmp_path / "study.md").read_text().startswith("\n**mixtral-8x7b")
    keys = module.WALL_CLOCK_KEYS
    for row in rows:
        (want,) = [
            r
            for r in shipped
            if (r["model"], r["topology"], r["order"]) == (row["model"], row["topology"], row["order"])
        ]
        assert without_wall_clock(json.loads(json.dumps(row)), keys) == without_wall_clock(want, keys)


def test_the_shipped_study_holds_every_model_topology_and_order(shipped):
    """docs/llm holds the full grid: each model on each topology under each order, every policy priced."""
    module = load_script()
    cells = {(r["model"], r["topology"], r["order"]) for r in shipped}
    assert cells == {(m, t, o) for m in module.MODELS for t in module.TOPOLOGIES for o in module.ORDERS}
    for row in fitted(shipped):
        assert list(row["policies"]) == [p for p, _ in module.POLICIES]


def test_compute_is_rank_0s_generated_kernels(shipped):
    """Each cell's compute is the sum of rank 0's generated kernel times (the model adds none)."""
    module = load_script()
    for row in fitted(shipped):
        c = module.config_of(row["model"], row["order"])
        layout = fit_groups(c, parse_topology(row["topology"]))
        want_us = compute_ns(rank_graph(c, layout, 0)) / 1e3
        for r in row["policies"].values():
            assert r["compute_us"] == pytest.approx(want_us, rel=1e-9)


def test_the_parallelisms_costs_and_the_bubble_add_up_to_the_exposed_time(shipped):
    """TP + PP + DP + EP + bubble = iteration - compute, to 0.1 %: each rank's steps run one after another."""
    for row in fitted(shipped):
        for policy, r in row["policies"].items():
            parts = r["TP"] + r["PP"] + r["DP"] + r["EP"] + r["bubble_us"]
            assert parts == pytest.approx(r["exposed_us"], rel=1e-3), (row["topology"], row["order"], policy)


def test_themis_cannot_change_tp_inside_one_dim_nor_any_all_to_all(shipped):
    """Where TP lies in one dim its cost under Themis is the baseline's; EP's all-to-alls keep the baseline's order."""
    one_dim = 0
    for row in fitted(shipped):
        base, themis = row["policies"]["baseline"], row["policies"]["themis"]
        if len(row["dims"]["TP"]) == 1:
            one_dim += 1
            assert themis["TP"] == base["TP"], (row["topology"], row["order"])
        assert themis["EP"] == base["EP"]
    assert one_dim > 0


def test_themis_balances_tp_that_spans_two_dims(shipped):
    """Where TP spans two dims (the 4D topologies), Themis's TP cost is below the baseline's."""
    spanning = [r for r in fitted(shipped) if len(r["dims"]["TP"]) > 1]
    assert spanning
    for row in spanning:
        assert row["policies"]["themis"]["TP"] < row["policies"]["baseline"]["TP"], row["topology"]


def test_predictive_is_never_slower_than_the_baseline_or_themis(shipped):
    """The predictive policy times whole assignments, the baseline's and Themis's among them, so it is never slower."""
    for row in fitted(shipped):
        times = {p: r["iteration_us"] for p, r in row["policies"].items()}
        assert times["predictive"] <= min(times["baseline"], times["themis"]) * (1 + 1e-9), row["topology"]


def test_best_is_the_fastest_policy_and_speedups_are_time_ratios(shipped):
    """`best` is the fastest policy; the speedups are the baseline's time over Themis's and over the best's."""
    for row in fitted(shipped):
        times = {p: r["iteration_us"] for p, r in row["policies"].items()}
        base = times["baseline"]
        assert times[row["best"]] == min(times.values())
        assert row["themis_speedup"] == pytest.approx(base / times["themis"], rel=1e-12)
        assert row["best_speedup"] == pytest.approx(base / min(times.values()), rel=1e-12)


def test_the_bubble_is_the_fill_and_drain_plus_the_last_stages_output_layer(shipped):
    """Bubble = (p - 1) * (t_f + t_b) + m * 3 * t_head: the last stage, slowest by its output layer, paces rank 0."""
    module = load_script()
    for row in fitted(shipped):
        c = module.config_of(row["model"], row["order"])
        stage_ns = 3 * c.layer_forward_ns * c.layers_per_stage
        want_us = ((c.pp - 1) * stage_ns + c.micro_batches * 3 * c.head_forward_ns) / 1e3
        for r in row["policies"].values():
            assert r["bubble_us"] == pytest.approx(want_us, rel=1e-4), row["model"]  # "free": 1 PB/s
