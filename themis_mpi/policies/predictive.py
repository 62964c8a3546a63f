"""`predictive`: the coordinator tries candidate schedules on the model and keeps the fastest.

Rank 0 builds the candidates (baseline with FIFO, Themis with SCF and themis-lat with SCF, each at
the requested chunk count and at every halving of it down to one chunk), times each with the
model transport under the run's own cost model (`PolicyContext.evaluate_collective`), and
broadcasts the fastest; ties go to the earlier candidate. Since the baseline and Themis at the
requested chunk count are candidates, the choice is never slower than either on the model, and the
emulator's virtual clock equals the model.

For a training run (`Predictive.schedule_all`) the candidates are whole assignments: every
collective under baseline, under Themis, under themis-lat, and each collective's own fastest
choice; the run's oracle (`PolicyContext.evaluate`) times the training iterations of each, so the
choice is never slower than the baseline's or Themis's iteration.

`best_found` is the yardstick beside every result: a local search over chunk orders, bounded in
time, that starts from the best candidate and keeps any change of one chunk's order that the model
says is faster.
"""

from __future__ import annotations

import itertools
import random
import time
from collections.abc import Sequence

import numpy as np

from ..collectives import Collective
from .base import InterPolicy, PolicyContext, Schedule

BASE_CANDIDATES = (("baseline", "fifo"), ("themis", "scf"), ("themis-lat", "scf"))


def chunk_variants(collective: Collective) -> list[int]:
    """The requested chunk count and its halvings down to 1 (as many as the collective allows)."""
    out, c = [], collective.n_chunks
    while c >= 1:
        out.append(c)
        c //= 2
    return out


def candidates(context: PolicyContext, collective: Collective) -> list[Schedule]:
    """Every candidate schedule of a collective, labelled ``policy/intra/chunks``."""
    from dataclasses import replace

    from .registry import make_inter

    out = []
    for name, intra in BASE_CANDIDATES:
        policy = make_inter(name)
        for chunks in chunk_variants(collective):
            variant = replace(collective, chunks=chunks)
            s = policy.schedule(context, variant)
            out.append(replace(s, intra=intra, label=f"{name}/{intra}/{s.n_chunks}"))
    return out


def fastest(
    context: PolicyContext, collective: Collective
) -> tuple[Schedule, float, list[tuple[str, float]]]:
    """The fastest candidate on the model, its time in us, and every candidate's time."""
    assert context.evaluate_collective is not None
    best, best_us, times = None, float("inf"), []
    for s in candidates(context, collective):
        t = context.evaluate_collective(collective, s)
        times.append((s.label, t))
        if t < best_us:
            best, best_us = s, t
    assert best is not None
    return best, best_us, times


class Predictive(InterPolicy):
    """Model-predictive choice among baseline, Themis and themis-lat at several chunk counts."""

    name = "predictive"
    description = "ours: rank 0 times candidate schedules on the model and broadcasts the fastest"

    def schedule(self, context: PolicyContext, collective: Collective) -> Schedule:
        """The fastest candidate of one collective (its queue policy comes with it)."""
        if collective.op == "all_to_all" or context.evaluate_collective is None:
            from .registry import make_inter

            return make_inter("themis-lat").schedule(context, collective)
        best, _, _ = fastest(context, collective)
        return best

    def schedule_all(self, context: PolicyContext, collectives: Sequence[Collective]) -> list[Schedule]:
        """One collective: its fastest candidate; several: the fastest whole assignment."""
        own = [self.schedule(context, c) for c in collectives]
        if len(collectives) <= 1 or context.evaluate is None:
            return own
        from .registry import make_inter

        options = [own]
        for name, intra in BASE_CANDIDATES:
            policy = make_inter(name)
            options.append(
                [
                    _with(policy.schedule(context, c), intra, f"{name}/{intra}/{c.n_chunks}")
                    for c in collectives
                ]
            )
        times = [context.evaluate(o) for o in options]
        return options[int(np.argmin(times))]  # argmin: the first of equal times


def _with(schedule: Schedule, intra: str, label: str) -> Schedule:
    from dataclasses import replace

    return replace(schedule, intra=intra, label=label)


def best_found(
    context: PolicyContext, collective: Collective, budget_s: float = 0.2, seed: int = 0
) -> tuple[Schedule, float, int]:
    """A local search over chunk orders with the model as the oracle, bounded in time.

    Starts from the fastest `predictive` candidate; each move gives one chunk another order of
    its active dims (every order with up to 4 active dims) and is kept when the model says the
    collective got faster. Returns the best schedule, its time in us and the evaluations made.
    """
    assert context.evaluate_collective is not None
    best, best_us, times = fastest(context, collective)
    evaluations = len(times)
    topo = context.topology
    active = [d for d in range(len(topo.dims)) if d in collective.dims and topo.dims[d].npus > 1]
    rest = [d for d in range(len(topo.dims)) if d not in active]
    perms = [list(p) + rest for p in itertools.permutations(active)] if len(active) <= 4 else []
    if best.n_chunks < 1 or len(perms) < 2 or collective.op == "all_to_all":
        return best, best_us, evaluations
    rng = random.Random(seed)
    deadline = time.perf_counter() + budget_s
    orders = best.orders.copy()
    while time.perf_counter() < deadline:
        k = rng.randrange(best.n_chunks)
        order = perms[rng.randrange(len(perms))]
        if list(orders[k]) == order:
            continue
        trial = orders.copy()
        trial[k] = order
        candidate = Schedule(best.bounds, trial, best.fuse_last, best.intra, best.label + "+search")
        t = context.evaluate_collective(collective, candidate)
        evaluations += 1
        if t < best_us:
            best, best_us, orders = candidate, t, trial
    return best, best_us, evaluations
