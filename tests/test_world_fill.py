"""Every NPU's links' fast paths against the plain ones they replace, to the bit (issue 43)."""

import random

import pytest
from test_classes import random_case, same_fields

from themis_mpi.config import RunConfig
from themis_mpi.run.collective import model_collective
from themis_mpi.timing import fair, planner
from themis_mpi.timing.fair import VECTOR_FLOWS, max_min_rates


def random_transfers(rng: random.Random) -> tuple[list, list[float], list[int] | None, list[int] | None]:
    """Transfers over a few to many links of mixed rates, shares of 1, 1/2 or odd, some unshared.

    Half the cases with the users a rule keeps (`Fair._users`), which may count more than these
    transfers (solo stages beside them), half with weights (``packet``'s messages).
    """
    n_links = rng.randint(2, 80)
    capacity = [
        rng.choice([46.57, 419.1, 50.0, 23.285]) * rng.choice([1.0, 0.5, 1.5]) for _ in range(n_links)
    ]
    usages = []
    for _ in range(rng.randint(VECTOR_FLOWS, 4 * VECTOR_FLOWS)):
        links = rng.sample(range(n_links), rng.randint(1, min(4, n_links)))
        usages.append(tuple((link, rng.choice([1.0, 0.5, 1 / 3, 2.0])) for link in links))
    weights = [rng.randint(1, 40) for _ in usages] if rng.random() < 0.5 else None
    users = None
    if rng.random() < 0.5:
        users = [int(rng.random() < 0.1) for _ in capacity]
        for usage in usages:
            for link, _ in usage:
                users[link] += 1
    return usages, capacity, users, weights


@pytest.mark.parametrize("seed", range(40))
def test_vectorised_filling_equals_the_loop_per_transfer(seed, monkeypatch):
    """`max_min_rates` over numpy arrays gives the loop's rates bit for bit (weighted or not)."""
    usages, capacity, users, weights = random_transfers(random.Random(seed))
    filled = []
    vectorised = fair._rates_vectorised
    monkeypatch.setattr(fair, "_rates_vectorised", lambda *a: filled.append(a) or vectorised(*a))
    fast = max_min_rates(usages, capacity, users, weights)
    assert filled  # (the case took the fast path)
    monkeypatch.setattr(fair, "VECTOR_FLOWS", 1 << 30)
    plain = max_min_rates(usages, capacity, users, weights)
    assert fast == plain
    assert all(rate > 0 for rate in fast)  # (and they fit: no link over its rate)
    used = [0.0] * len(capacity)
    for usage, rate in zip(usages, fast):
        for link, share in usage:
            used[link] += rate * share
    assert all(u <= c * (1 + 1e-9) for u, c in zip(used, capacity))


@pytest.mark.parametrize("rule", ["fair", "packet"])
def test_every_npus_links_with_the_vectorised_filling_run_as_with_the_loop(monkeypatch, rule):
    """Random topologies, a late NPU, a slow link, every NPU's links: the same, field by field.

    Whether every max-min filling goes over numpy arrays or through the loop per transfer.
    """
    monkeypatch.setattr(planner, "by_classes", lambda *args, **kwargs: None)  # (every NPU's links)
    filled = []
    vectorised = fair._rates_vectorised
    for seed in range(12):
        topo, config, coll, policy = random_case(seed)
        config = RunConfig(network=rule, npu_delay_ns=config.npu_delay_ns, link_scale=config.link_scale)
        with monkeypatch.context() as m:
            m.setattr(fair, "VECTOR_FLOWS", 1)
            m.setattr(fair, "_rates_vectorised", lambda *a: filled.append(a) or vectorised(*a))
            fast, _ = model_collective(topo, coll, policy, config)
        with monkeypatch.context() as m:
            m.setattr(fair, "VECTOR_FLOWS", 1 << 30)
            plain, _ = model_collective(topo, coll, policy, config)
        same_fields(fast, plain)
    assert filled  # (the runs shared links: the fast path ran)
