"""`predictive`: the coordinator tries candidate schedules on the model and keeps the fastest.

Rank 0 times candidate schedules with the model transport under the run's own cost model
(`PolicyContext.evaluate_collective`) and broadcasts the fastest (`fastest`): baseline with FIFO
and Themis with SCF at the requested chunk count, then themis-lat with SCF at the requested count
and at its halvings, down to one chunk or until two halvings in a row bring nothing. A candidate
whose lower bound (busiest dim, longest chunk chain) cannot beat the best time so far is skipped.
Since the baseline and Themis at the requested chunk count are candidates, the choice is never
slower than either on the model, and the emulator's virtual clock equals the model.

For a training run (`Predictive.schedule_all`) the candidates are whole assignments: every
collective under baseline, under Themis, under themis-lat, and each collective's own fastest
choice; the run's oracle (`PolicyContext.evaluate`) times the training iterations of each, so the
choice is never slower than the baseline's or Themis's iteration.

`best_found` is the yardstick beside every result: a local search over chunk orders, bounded by a
count of model evaluations and seeded (so its result is the same on any machine), that starts from
the best candidate and keeps any change of one chunk's order that the model says is faster.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from ..collectives import Collective, chunk_stages, priced_chunks
from .base import InterPolicy, PolicyContext, Schedule
from .inter import Baseline, Themis, ThemisLat

BASE_CANDIDATES = (("baseline", "fifo"), ("themis", "scf"), ("themis-lat", "scf"))
CANDIDATES: dict[str, type[InterPolicy]] = {p.name: p for p in (Baseline, Themis, ThemisLat)}
LADDER = ("themis-lat", "scf")  # the policy whose chunk count is searched
PATIENCE = 2  # halvings in a row without a better time end the chunk-count search


def chunk_variants(collective: Collective) -> list[int]:
    """The requested chunk count and its halvings down to 1 (as many as the collective allows)."""
    out, c = [], collective.n_chunks
    while c >= 1:
        out.append(c)
        c //= 2
    return out


def candidate(context: PolicyContext, collective: Collective, name: str, intra: str, chunks: int) -> Schedule:
    """One candidate: policy `name` with queue policy `intra` at `chunks` chunks, labelled."""
    s = CANDIDATES[name]().schedule(context, replace(collective, chunks=chunks))
    return replace(s, intra=intra, label=f"{name}/{intra}/{s.n_chunks}")


def lower_bound_us(context: PolicyContext, collective: Collective, schedule: Schedule) -> float:
    """A time no run of the schedule beats, in us.

    The busiest dim's stage time (over its slots), and the longest chunk's own chain of stages
    (a chunk's stages run one after another).
    """
    unit, priced, _ = priced_chunks(collective, schedule.bounds)
    topo = context.topology
    busy = [0.0] * len(topo.dims)
    chain, memo = 0.0, {}
    for k in range(schedule.n_chunks):
        key = (priced[k], tuple(schedule.orders[k].tolist()))
        if key not in memo:
            per_dim = [0.0] * len(topo.dims)
            for st in chunk_stages(topo, collective, 0, k, key[0], key[1], schedule.fuse_last, unit):
                per_dim[st.dim] += context.stage_ns(st.dim, st.op, st.full_elems, unit)
            memo[key] = per_dim
        per_dim = memo[key]
        chain = max(chain, sum(per_dim))
        busy = [b + a for b, a in zip(busy, per_dim)]
    return max(chain, max(busy) / context.config.active_per_dim) / 1e3


def fastest(
    context: PolicyContext, collective: Collective
) -> tuple[Schedule, float, list[tuple[str, float]]]:
    """The fastest candidate on the model, its time in us, and the times of those timed.

    Timed in this order: baseline and Themis at the requested chunk count (so the choice is never
    slower than either), then themis-lat at the requested count and at each halving, until
    `PATIENCE` halvings in a row bring no better time. A candidate whose `lower_bound_us` is above
    the best time so far is not timed. Equal times keep the earlier candidate.
    """
    evaluate = context.evaluate_collective
    assert evaluate is not None
    best: Schedule | None = None
    best_us, times = float("inf"), []

    def consider(s: Schedule) -> bool:
        nonlocal best, best_us
        if best is not None and lower_bound_us(context, collective, s) > best_us:
            return False
        t = evaluate(collective, s)
        times.append((s.label, t))
        if t < best_us:
            best, best_us = s, t
            return True
        return False

    for name, intra in BASE_CANDIDATES:
        if (name, intra) != LADDER:
            consider(candidate(context, collective, name, intra, collective.n_chunks))
    misses = 0
    for chunks in chunk_variants(collective):
        misses = 0 if consider(candidate(context, collective, *LADDER, chunks)) else misses + 1
        if misses >= PATIENCE and chunks < collective.n_chunks:
            break
    assert best is not None
    return best, best_us, times


class Predictive(InterPolicy):
    """Model-predictive choice among baseline, Themis and themis-lat at several chunk counts."""

    name = "predictive"
    description = "ours: rank 0 times candidate schedules on the model and broadcasts the fastest"

    def schedule(self, context: PolicyContext, collective: Collective) -> Schedule:
        """The fastest candidate of one collective (its queue policy comes with it)."""
        if collective.op == "all_to_all" or context.evaluate_collective is None:
            return ThemisLat().schedule(context, collective)
        best, _, _ = fastest(context, collective)
        return best

    def schedule_all(self, context: PolicyContext, collectives: Sequence[Collective]) -> list[Schedule]:
        """One collective: its fastest candidate; several: the fastest whole assignment."""
        own = [self.schedule(context, c) for c in collectives]
        if len(collectives) <= 1 or context.evaluate is None:
            return own
        options = [own]
        for name, intra in BASE_CANDIDATES:
            policy = CANDIDATES[name]()
            options.append(
                [
                    _with(policy.schedule(context, c), intra, f"{name}/{intra}/{c.n_chunks}")
                    for c in collectives
                ]
            )
        times = [context.evaluate(o) for o in options]
        return options[int(np.argmin(times))]  # argmin: the first of equal times


def _with(schedule: Schedule, intra: str, label: str) -> Schedule:
    return replace(schedule, intra=intra, label=label)


def best_found(
    context: PolicyContext,
    collective: Collective,
    max_evals: int = 16,
    seed: int = 0,
    start: tuple[Schedule, float] | None = None,
) -> tuple[Schedule, float, int]:
    """A local search over chunk orders with the model as the oracle, bounded by `max_evals`.

    Starts from the fastest `predictive` candidate; each move gives one chunk another order of
    its active dims (every order with up to 4 active dims), drawn from a `random.Random(seed)`,
    and is kept when the model says the collective got faster. The search makes `max_evals` model
    evaluations (wall time plays no part, so the result is the same on any machine). `start` (a
    schedule and its time) replaces the first step, whose evaluations are not counted against
    `max_evals`. Returns the best schedule, its time in us and the evaluations made in all.
    """
    assert context.evaluate_collective is not None
    if start is None:
        best, best_us, times = fastest(context, collective)
        evaluations = len(times)
    else:
        (best, best_us), evaluations = start, 0
    topo = context.topology
    active = [d for d in range(len(topo.dims)) if d in collective.dims and topo.dims[d].npus > 1]
    rest = [d for d in range(len(topo.dims)) if d not in active]
    perms = [list(p) + rest for p in itertools.permutations(active)] if len(active) <= 4 else []
    if best.n_chunks < 1 or len(perms) < 2 or collective.op == "all_to_all":
        return best, best_us, evaluations
    import random  # rank 0 only, when this policy runs

    rng = random.Random(seed)
    orders = best.orders.copy()
    for _ in range(max_evals):
        k = rng.randrange(best.n_chunks)
        order = perms[rng.randrange(len(perms) - 1)]
        if list(orders[k]) == order:  # draw among the others: every move is a change
            order = perms[-1]
        trial = orders.copy()
        trial[k] = order
        candidate = Schedule(best.bounds, trial, best.fuse_last, best.intra, best.label + "+search")
        t = context.evaluate_collective(collective, candidate)
        evaluations += 1
        if t < best_us:
            best, best_us, orders = candidate, t, trial
    return best, best_us, evaluations
