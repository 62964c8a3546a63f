"""Rank 0 decides, every rank learns: each collective's schedule chosen once and broadcast.

Rank 0 asks the inter-dim policy for every collective's schedule (chunk bounds, orders, queue
policy), with the model as its oracle (`model_oracle`; `run.training.training_oracle` for a
training run), checks it (`validate_schedule`) and broadcasts it (`share_schedules`); a policy
that fails becomes one `PolicyError` line that every rank raises together.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import replace
from typing import Any

import numpy as np

from ..collectives import Collective, priced_words
from ..config import RunConfig
from ..engine import CollectiveRun, Engine, Transport
from ..policies import (
    InterPolicy,
    PolicyContext,
    PolicyError,
    Schedule,
    is_inter,
    is_intra,
    make_inter,
    origin,
)
from ..timing.planner import Run, each_npu, plan
from ..topology import Topology
from ..watchdog import watch

PolicyLike = str | InterPolicy


def as_policy(policy: PolicyLike) -> InterPolicy:
    """A policy instance: the given one, or a fresh one of that name."""
    return make_inter(policy) if isinstance(policy, str) else policy


def policy_name(policy: PolicyLike) -> str:
    """The registry name of a policy given by name or as an instance."""
    return policy if isinstance(policy, str) else policy.name


def model_oracle(topology: Topology, config: RunConfig):
    """The model as an oracle for policies: one collective's time in us under a schedule.

    The collective as NPUs alike run it (`RunConfig.alike`), on what the planner runs it on; where
    every NPU runs, from the first issue to the last end.
    """
    planned: list = []  # (the plan, made when first asked: most policies never ask)

    def evaluate_collective(collective: Collective, schedule: Schedule) -> float:
        if not planned:
            alike = config.alike()
            planned.append((alike, plan(Run(topology, alike))))
        alike, timing = planned[0]

        def issue(transport: Transport) -> CollectiveRun:
            engine = Engine(topology, transport, alike)
            run = engine.issue(collective, schedule)
            engine.run()
            return run

        runs = each_npu(timing, alike, issue)
        return (max(r.end_ns for r in runs) - min(r.issued_ns for r in runs)) / 1e3

    return evaluate_collective


def validate_schedule(schedule: Schedule, collective: Collective, n_dims: int) -> Schedule:
    """The schedule with numpy types checked; `PolicyError` when it cannot run the collective."""
    if not isinstance(schedule, Schedule):
        raise PolicyError(f"returned {type(schedule).__name__}, not a Schedule")
    bounds = np.asarray(schedule.bounds)
    orders = np.asarray(schedule.orders)
    chunks = len(bounds) - 1
    if bounds.ndim != 1 or chunks < 1 or orders.shape != (chunks, n_dims):
        raise PolicyError(
            f"returned bounds of shape {bounds.shape} and orders of shape {orders.shape}; "
            f"they must be (chunks + 1,) and (chunks, {n_dims})"
        )
    ends = (collective.count, priced_words(collective))  # elements, or words (a sized stream)
    if bounds[0] != 0 or bounds[-1] not in ends or np.any(np.diff(bounds) < 1):
        raise PolicyError(
            f"returned chunk bounds that do not cut [0, {collective.count}) into non-empty chunks"
        )
    if np.any(np.sort(orders, axis=1) != np.arange(n_dims)):
        k = int(np.argmax(np.any(np.sort(orders, axis=1) != np.arange(n_dims), axis=1)))
        raise PolicyError(
            f"returned order {orders[k].tolist()} for chunk {k}; it must be a permutation of the dims"
        )
    if schedule.intra and not is_intra(schedule.intra):
        raise PolicyError(f"asked for the unknown intra-dim policy {schedule.intra!r}")
    return replace(schedule, bounds=bounds.astype(np.int64), orders=orders.astype(np.int32))


def _watched(transport: Transport, policy: PolicyLike, given) -> Any:
    """On the model, a plugin's decision gets `--timeout-s`.

    Built-in policies are trusted; under MPI the other ranks watch rank 0, which answers their
    pings while it decides.
    """
    name = policy_name(policy)
    if transport.name != "model" or given is not None or not is_inter(name) or origin(name) == "builtin":
        return nullcontext()
    timeout_s = transport.config.timeout_s
    return watch(timeout_s, f"policy {name!r} ({origin(name)}) did not decide within {timeout_s:g} s "
                     "(--timeout-s); a plugin that never returns?")  # fmt: skip


def share_schedules(
    transport: Transport,
    policy: PolicyLike,
    collectives: Sequence[Collective],
    given: Sequence[Schedule] | None = None,
    evaluate=None,
) -> tuple[list[Schedule], float]:
    """Every collective's schedule, chosen on rank 0 and broadcast; and rank 0's decision time in s.

    Rank 0 asks the policy (or takes `given`, a replay's) and checks the result; a policy that
    raises or returns an invalid schedule becomes one `PolicyError` line naming it, which every
    rank raises together. Four uppercase broadcasts: a header of known shape (status, text length,
    decision time, then chunks and fused flag per collective), the text (the error, or each
    collective's queue policy and label), and one int64 table of every chunk's bounds and order.

    Args:
        transport: the run's transport.
        policy: a policy instance (its state carries over between calls) or a name.
        collectives: every collective the run issues (distinct ones for training).
        given: schedules to broadcast instead of asking the policy.
        evaluate: the whole run's oracle for `PolicyContext.evaluate` (training); a single
            collective gets the model of that collective.
    """
    n_dims, n_coll = len(transport.topology.dims), len(collectives)
    header = np.zeros(3 + 2 * n_coll, dtype=np.int64)
    text = ""
    schedules: list[Schedule] = []
    if transport.rank == 0:
        schedules, text = _rank0(transport, policy, collectives, given, evaluate, header)
    transport.bcast(header, "the broadcast of the schedule header (rank 0 decides)", patient=True)
    if header[1]:
        raw = (
            np.frombuffer(text.encode(), np.uint8).copy()
            if transport.rank == 0
            else np.empty(header[1], np.uint8)
        )
        transport.bcast(raw, "the broadcast of the schedule text")
        text = raw.tobytes().decode()
    if header[0]:
        raise PolicyError(text)
    counts = header[3::2].tolist()
    table = np.zeros((sum(counts), 2 + n_dims), dtype=np.int64)
    if transport.rank == 0 and len(table):
        table[:] = np.concatenate(
            [np.column_stack([s.bounds[:-1], s.bounds[1:], s.orders]) for s in schedules]
        )
    if len(table):
        transport.bcast(table, "the broadcast of the chunk bounds and orders")
    lines = text.split("\n") if n_coll else []
    out, row = [], 0
    for i, c in enumerate(counts):
        part = table[row : row + c]
        row += c
        intra, label = lines[i].split("\t", 1)
        bounds = np.append(part[:, 0], part[-1, 1]).astype(np.int64)
        out.append(Schedule(bounds, part[:, 2:].astype(np.int32), int(header[4 + 2 * i]), intra, label))
    return out, float(header[2]) / 1e9


def _rank0(
    transport: Transport,
    policy: PolicyLike,
    collectives: Sequence[Collective],
    given: Sequence[Schedule] | None,
    evaluate,
    header: np.ndarray,
) -> tuple[list[Schedule], str]:
    """Rank 0: the checked schedules and their text, the header filled (`share_schedules`).

    A policy that fails leaves status 1 and its one line as the text.
    """
    t0 = time.perf_counter()
    schedules: list[Schedule] = []
    text = ""
    try:
        with transport.serving(), _watched(transport, policy, given):  # busy is not silent
            schedules = (
                list(given) if given is not None else _decide(transport, policy, collectives, evaluate)
            )
        if len(schedules) != len(collectives):
            raise PolicyError(f"returned {len(schedules)} schedules for {len(collectives)} collectives")
        n_dims = len(transport.topology.dims)
        schedules = [validate_schedule(s, c, n_dims) for s, c in zip(schedules, collectives)]
        text = "\n".join(f"{s.intra}\t{s.label}" for s in schedules)
        header[3::2] = [s.n_chunks for s in schedules]
        header[4::2] = [s.fuse_last for s in schedules]
    except (Exception, SystemExit) as exc:  # (a plugin that calls sys.exit is an error too)
        name = policy_name(policy)
        where = origin(name) if given is None and is_inter(name) else "given"
        why = str(exc) if isinstance(exc, PolicyError) else f"raised {type(exc).__name__}: {exc}"
        why = why.removeprefix(f"policy {name!r} ")  # (named once, with where it comes from)
        header[0], text = 1, f"policy {name!r} ({where}) {why}".replace("\n", " ")
    header[2] = int((time.perf_counter() - t0) * 1e9)
    header[1] = len(text.encode())
    return schedules, text


def _decide(
    transport: Transport, policy: PolicyLike, collectives: Sequence[Collective], evaluate
) -> list[Schedule]:
    """Rank 0: the policy's schedules, with the model as its oracle."""
    config = transport.config
    one = model_oracle(transport.topology, config)
    if evaluate is None and len(collectives) == 1:
        (only,) = collectives

        def evaluate(schedules: Sequence[Schedule]) -> float:
            return one(only, schedules[0])

    context = PolicyContext(transport.topology, config, transport.cost, one, evaluate)
    return as_policy(policy).schedule_all(context, collectives)


def share_orders(
    transport: Transport, policy: PolicyLike, collectives: Sequence[Collective]
) -> list[Schedule]:
    """The schedules alone (`share_schedules` without the decision time)."""
    return share_schedules(transport, policy, collectives)[0]
