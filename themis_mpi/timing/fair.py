"""``fair``: max-min fair sharing of every link at every instant (progressive filling), cut-through.

A transfer uses every link of every hop at once; at each instant the transfers on the links get
max-min fair rates (`max_min_rates`), set anew whenever a transfer starts or ends. The rule
keeps no event of its own on the loop but for steps' delays: when the next transfer is through
moves with the rates, so it reports that time (`Fair.next_ns`).

Shortcuts (what keeps HGX at about 2.5x of ``ideal``'s cost, `scripts/bench_network.py`), on
one NPU's view only (`Fair.solo`; every NPU's links go step by step, a step waiting for its
peers):

- **Solo.** A stage whose steps all use the same links (`links.Flow.uniform`) and that finds
  them free runs solo: its end is summed at once, step by step in the order the step-wise path
  sums it, so both give the same number. When another transfer joins one of its links, it is
  placed where it is at that instant (`Fair._unsolo`) and goes on step by step, sharing.
- **Interleave.** Solo stages may share links while their transfers do not meet (one sends
  while the other waits out its delay, as latency-bound stages behind one NIC do): each stays
  solo until their transfers first meet (`_first_meet`).
- **Meeting.** Two solo stages whose transfers meet take their max-min rates until one
  transfer is through, then each goes on alone, summed again (`Fair._meet`); with a third on
  their links all go step by step.
- **Re-solo.** A stage left alone on its links goes solo again from where it is.

The step-by-step path gives every stage the same start and end up to float rounding (a test
turns `solo` off and compares, on random topologies and on the HGX preset).
"""

from __future__ import annotations

import math
from itertools import chain

import numpy as np

from .links import Flow, Host, Link, LinkModel, Step, Usage

SATURATED = 1e-12  # relative slack within which a link counts as full when rates are filled
VECTOR_FLOWS = 48  # shared transfers from which `max_min_rates` fills over numpy arrays


def max_min_rates(
    usages: list[Usage],
    capacity: list[float],
    users: list[int] | None = None,
    weights: list[int] | None = None,
) -> list[float]:
    """Max-min fair rates (bytes per ns) of transfers on links (progressive filling).

    Every transfer's rate grows at the same pace until a link it uses is full; then it keeps
    that rate while the others grow on. A transfer that shares no link gets its links' rate
    directly (the same number whatever else runs). `users`, when the caller keeps it, is how
    many of these transfers use each link. `weights` (``packet``: each transfer's messages): a
    transfer of weight w grows w times as fast, as w transfers would (weights of 1: the
    unweighted rates to the bit).
    """
    if len(usages) >= VECTOR_FLOWS and all(usages):
        return _rates_vectorised(usages, capacity, users, weights)
    if users is None:
        users = [0] * len(capacity)
        for usage in usages:
            for link, _ in usage:
                users[link] += 1
    rates = [0.0] * len(usages)
    active = []
    for f, usage in enumerate(usages):
        rate, shared = math.inf, False
        for link, share in usage:
            if users[link] > 1:
                shared = True
            r = capacity[link] / share
            if r < rate:
                rate = r
        if shared:
            active.append(f)
        else:
            rates[f] = rate
    left: dict[int, float] = {}
    while active:
        load: dict[int, float] = {}
        for f in active:
            weight = 1 if weights is None else weights[f]
            for link, share in usages[f]:
                load[link] = load.get(link, 0.0) + share * weight
        step = math.inf
        for link, w in load.items():
            r = left.setdefault(link, capacity[link]) / w
            if r < step:
                step = r
        full = set()
        for link, w in load.items():
            left[link] -= step * w
            if left[link] <= SATURATED * capacity[link]:
                full.add(link)
        still = []
        for f in active:
            rates[f] += step if weights is None else step * weights[f]
            for link, _ in usages[f]:
                if link in full:
                    break
            else:
                still.append(f)
        active = still
    return rates


def _rates_vectorised(
    usages: list[Usage],
    capacity: list[float],
    users: list[int] | None,
    weights: list[int] | None,
) -> list[float]:
    """`max_min_rates` over numpy arrays of (transfer, link, share) entries, to the bit.

    The same float operations in the same order: a transfer's solo rate is its least
    ``capacity / share``; a link's load sums its growing transfers' shares in transfer order
    (`numpy.bincount` adds in input order); each round takes the least ``left / load`` and adds
    it to every growing transfer's rate. Every NPU's links share thousands of transfers, where
    the loops per transfer and round were most of the run.
    """
    n, n_links = len(usages), len(capacity)
    lengths = [len(usage) for usage in usages]
    flat = chain.from_iterable  # (the entries' numbers in one pass: half the time of an array of tuples)
    entries = np.fromiter(flat(flat(usages)), float, 2 * sum(lengths)).reshape(-1, 2)
    links, shares = entries[:, 0].astype(np.intp), entries[:, 1]
    owners = np.repeat(np.arange(n), lengths)
    firsts = np.concatenate(([0], np.cumsum(lengths)[:-1]))
    cap = np.array(capacity, dtype=float)
    count = np.bincount(links, minlength=n_links) if users is None else np.array(users)
    shared = np.logical_or.reduceat(count[links] > 1, firsts)
    got = np.where(shared, 0.0, np.minimum.reduceat(cap[links] / shares, firsts))
    grow = None if weights is None else np.array(weights, dtype=float)
    loads = shares if grow is None else shares * grow[owners]
    left, saturated = cap.copy(), SATURATED * cap
    growing = shared
    while growing.any():
        on = growing[owners]
        at = links[on]
        load = np.bincount(at, weights=loads[on], minlength=n_links)
        touched = np.bincount(at, minlength=n_links) > 0
        step = np.min(left[touched] / load[touched])
        left[touched] -= step * load[touched]
        full = touched & (left <= saturated)
        got[growing] += step if grow is None else step * grow[growing]
        stopped = np.zeros(n, dtype=bool)
        stopped[owners[on & full[links]]] = True
        growing = growing & ~stopped
    return got.tolist()


# a solo stage's transfer: start, end, its step, bytes left at its start, rate (a plain tuple: made and
# read in fair's hottest loops, where a NamedTuple cost 7-8 % of the HGX benchmark's CPU)
Window = tuple[float, float, int, float, float]


def _windows(steps: tuple[Step, ...], k: int, t_ns: float, left: float, rate: float) -> list[Window]:
    """A stage's transfers alone at `rate`, from step k with `left` bytes at t_ns (as `_solo_end` sums)."""
    windows = []
    while True:
        end = t_ns + left / rate
        windows.append((t_ns, end, k, left, rate))
        delay_ns = steps[k].delay_ns
        k += 1
        if k == len(steps):
            return windows
        t_ns, left = (end + delay_ns if delay_ns > 0 else end), steps[k].bytes


def _first_meet(mine: list[Window], theirs: list[Window], after_ns: float) -> float:
    """The first instant after `after_ns` at which a transfer of each list is under way (inf if none)."""
    n, m, i, j = len(mine), len(theirs), 0, 0
    while i < n and mine[i][1] <= after_ns:
        i += 1
    while j < m and theirs[j][1] <= after_ns:
        j += 1
    while i < n and j < m:
        a, b = mine[i], theirs[j]
        start = a[0] if a[0] > b[0] else b[0]
        if start < after_ns:
            start = after_ns
        if start < (a[1] if a[1] < b[1] else b[1]):
            return start
        if a[1] <= b[1]:
            i += 1
        else:
            j += 1
    return math.inf


def _solo_end(steps: tuple[Step, ...], k: int, t_ns: float, left: float, rate: float) -> float:
    """The end of a stage alone at `rate` from step k with `left` bytes at t_ns (as `_windows` sums)."""
    while True:
        end = t_ns + left / rate
        delay_ns = steps[k].delay_ns
        if delay_ns > 0:
            end = end + delay_ns
        k += 1
        if k == len(steps):
            return end
        t_ns, left = end, steps[k].bytes


class Fair(LinkModel):
    """Max-min fair rates on every link at every instant, cut-through, with the module's shortcuts.

    Args:
        links: the links it runs (one NPU's, or every NPU's).
        host: the container; its loop runs the steps' delays.
    """

    name = "fair"
    moving = True
    solo = True  # (a test turns the shortcuts off to compare them with the step-wise path)

    def __init__(self, links: tuple[Link, ...], host: Host, *, count_bytes: bool = True):
        super().__init__(links, host, count_bytes=count_bytes)
        self._moving: list[Flow] = []  # transfers in progress (solo stages too)
        self._users = [0] * len(links)  # moving transfers on each link
        self._rates_stale = False
        self._had_solo = False  # a stage went solo here (never on every NPU's links: no scan for them)
        self.rates_set = 0  # times the rates were set (classes by state check each new set: `world.World`)

    # --- flows in and out --------------------------------------------------------------------------

    def start(self, flow: Flow) -> None:
        """The flow's first step leaves now."""
        self._begin_step(flow)

    def resume(self, flow: Flow) -> None:
        """Its transfer is done: the step's delay, then the next step (at once without a delay)."""
        delay_ns = flow.steps[flow.k].delay_ns
        if delay_ns > 0:
            self.loop.at(self.loop.now_ns + delay_ns, self._delay_over, flow)
        else:
            flow.k += 1
            self._begin_step(flow)

    def idle(self) -> bool:
        """No transfer moves (a solo stage counts until it ends)."""
        return not self._moving

    @property
    def moving_flows(self) -> list[Flow]:
        """The transfers in progress, solo stages too (what classes by state check: `world.World`)."""
        return self._moving

    # --- time ------------------------------------------------------------------------------------

    def next_ns(self) -> float:
        """The earliest end of a moving transfer (or of a solo stage), the rates set first."""
        if self._rates_stale:
            self._set_rates()
        t = math.inf
        for f in self._moving:
            if f.end_ns < t:
                t = f.end_ns
        return t

    def advance(self, t_ns: float) -> None:
        """Move the transfers on to t_ns (their ends stay as their rates set them)."""
        dt = t_ns - self.loop.now_ns
        if dt > 0:
            for f in self._moving:
                if f.solo_ns < 0:
                    f.left -= f.rate * dt

    def fire(self, t_ns: float) -> None:
        """The transfers that are through at t_ns, and the solo stages that end then."""
        done = [f for f in self._moving if f.end_ns <= t_ns] if self._moving else None
        if done:
            self._moving = [f for f in self._moving if f.end_ns > t_ns]
            for f in done:
                f.left = 0.0
                self._leave(f.steps[f.k].usage)
            for f in done:
                if f.solo_ns >= 0:  # a solo stage is over
                    self._passed(f, len(f.steps) - 1)
                    self.host.ended(f.owner)
                else:
                    self._through(f)

    def _through(self, flow: Flow) -> None:
        """Step k's transfer is through (off its links): the host says when it goes on."""
        if self.host.through(flow):
            self.resume(flow)

    def _delay_over(self, flow: Flow) -> None:
        flow.k += 1
        self._begin_step(flow)

    def _overlap(self, flow: Flow) -> None:
        if flow.solo_ns >= 0 and flow.overlap_ns == self.loop.now_ns:
            self._meet(flow)

    def _begin_step(self, flow: Flow) -> None:
        """Start the flow's step k, or end the flow after its last step."""
        step = self._leaving(flow)
        if step is not None:
            self._enter(flow, step)

    def _enter(self, flow: Flow, step: Step) -> None:
        """The step's transfer takes its share of its links from now."""
        flow.left, flow.rate, flow.end_ns = step.bytes, 0.0, math.inf  # (set by `_join`)
        self._moving.append(flow)
        self._join(flow, step)

    def _passed(self, flow: Flow, k: int) -> None:
        """A solo stage's steps after the one it went solo in, up to k, are over: count their bytes."""
        if self.count_bytes:
            for j in range(flow.solo_k + 1, k + 1):
                self._count(flow.steps[j])

    # --- fair sharing ------------------------------------------------------------------------------

    def _join(self, flow: Flow, step: Step) -> None:
        """A transfer starts: alone on its links it takes their rate, else every rate is set anew."""
        self.rates_set += 1
        users, usage = self._users, step.usage
        if self._had_solo and any(users[link] for link, _ in usage):
            # a link in use: solo stages on mine share from now, or interleave
            overlap_ns = -math.inf  # (no solo stage to interleave with)
            mine, solos, plain = step.links, [], False
            for other in self._moving:
                if other is not flow and not mine.isdisjoint(other.steps[other.k].links):
                    if other.solo_ns >= 0:
                        solos.append(other)
                    else:
                        plain = True
            windows = None
            if solos and not plain and flow.uniform and self.solo:
                windows = _windows(flow.steps, flow.k, self.loop.now_ns, flow.left, step.solo_rate)
                overlap_ns = self._first_overlap(windows, solos)
            if overlap_ns >= self.loop.now_ns:  # they interleave until then (`_meet`): solo beside them
                for link, _ in usage:
                    users[link] += 1
                self._go_solo(flow, step.solo_rate, overlap_ns, windows)
                return
            for other in solos:
                if other.solo_ns >= 0:  # (not yet with one it interleaved with)
                    self._unsolo(other)
        alone = True
        for link, _ in usage:
            if users[link]:
                alone = False
            users[link] += 1
        if not alone or self._rates_stale:
            self._rates_stale = True
            return
        if flow.uniform and self.solo:  # solo: its end summed as `resume` and `_begin_step` would
            self._go_solo(flow, step.solo_rate, math.inf, None)
        else:
            flow.rate = step.solo_rate
            flow.end_ns = self.loop.now_ns + flow.left / flow.rate

    def _go_solo(self, flow: Flow, rate: float, overlap_ns: float, windows: list[Window] | None) -> None:
        """The stage is solo from now at its links' rate, until its transfers meet another's (if ever)."""
        flow.rate, flow.solo_ns, flow.overlap_ns, flow.windows = rate, self.loop.now_ns, overlap_ns, windows
        self._had_solo = True
        flow.solo_k = flow.k
        if windows is None:
            flow.end_ns = _solo_end(flow.steps, flow.k, self.loop.now_ns, flow.left, rate)
        else:
            self._solo_until(flow, windows, overlap_ns)

    def _solo_until(self, flow: Flow, windows: list[Window], overlap_ns: float) -> None:
        """Its transfers are these windows: it ends after the last one's delay, or meets another."""
        flow.windows, flow.overlap_ns = windows, overlap_ns
        delay_ns = flow.steps[-1].delay_ns
        flow.end_ns = windows[-1][1] + delay_ns if delay_ns > 0 else windows[-1][1]
        if overlap_ns < math.inf:
            self.loop.at(overlap_ns, self._overlap, flow)

    def _solo_windows(self, flow: Flow) -> list[Window]:
        """A solo stage's transfers from the step it went solo in."""
        if flow.windows is None:
            flow.windows = _windows(flow.steps, flow.k, flow.solo_ns, flow.left, flow.rate)
        return flow.windows

    def _first_overlap(self, mine: list[Window], solos: list[Flow]) -> float:
        """When transfers in these windows would first meet a transfer of one of the solo stages."""
        first = math.inf
        for other in solos:
            t = _first_meet(mine, self._solo_windows(other), self.loop.now_ns)
            if t < first:
                first = t
        return first

    def _partners(self, flow: Flow) -> list[Flow]:
        """The other solo stages on the flow's links (those it interleaves with)."""
        mine = flow.steps[flow.k].links
        return [
            f
            for f in self._moving
            if f.solo_ns >= 0 and f is not flow and not mine.isdisjoint(f.steps[f.k].links)
        ]

    def _meet(self, flow: Flow) -> None:
        """Two solo stages' transfers meet now: they share their links until one is through, then go on solo.

        Each takes its max-min rate beside the other until one transfer is done, the other goes
        on at its own rate, and both keep their later steps (each alone at its rate), as the
        step-wise path would run them; if they meet again, the same at that instant. With a
        third solo stage on their links, all go step by step instead.
        """
        partners = self._partners(flow)
        if len(partners) != 1 or self._partners(partners[0]) != [flow]:
            self._unsolo(flow)
            return
        other = partners[0]
        place_a, place_b = self._transfer_now(flow), self._transfer_now(other)
        if place_a is None or place_b is None:  # (one is between transfers: not a meeting after all)
            self._unsolo(flow)
            return
        (wa, left_a), (wb, left_b) = place_a, place_b
        now = self.loop.now_ns
        usages = [flow.steps[wa[2]].usage, other.steps[wb[2]].usage]  # (`_users` counts just these two there)
        rate_a, rate_b = max_min_rates(usages, self.capacity, self._users)
        end_a, end_b = now + left_a / rate_a, now + left_b / rate_b
        first_ns = end_a if end_a < end_b else end_b
        windows_a = self._shared(flow, wa[2], left_a, rate_a, first_ns, end_a <= end_b)
        windows_b = self._shared(other, wb[2], left_b, rate_b, first_ns, end_b <= end_a)
        self._solo_until(flow, windows_a, _first_meet(windows_a, windows_b, first_ns))
        self._solo_until(other, windows_b, math.inf)

    def _transfer_now(self, flow: Flow) -> tuple[Window, float] | None:
        """A solo stage's window under way now and the bytes left of it, or None between transfers."""
        now = self.loop.now_ns
        for w in self._solo_windows(flow):
            if now < w[1]:
                return (w, w[3] - w[4] * (now - w[0])) if w[0] <= now else None
        return None

    def _shared(
        self, flow: Flow, k: int, left: float, rate: float, first_ns: float, first: bool
    ) -> list[Window]:
        """A solo stage's windows from now: step k's transfer at `rate` until `first_ns`, alone after."""
        steps, now = flow.steps, self.loop.now_ns
        if first:  # its transfer is the one through at first_ns
            windows = [(now, first_ns, k, left, rate)]
            end = first_ns
        else:
            rest = left - rate * (first_ns - now)
            end = first_ns + rest / flow.rate
            windows = [(now, first_ns, k, left, rate), (first_ns, end, k, rest, flow.rate)]
        if k + 1 < len(steps):
            delay_ns = steps[k].delay_ns
            start = end + delay_ns if delay_ns > 0 else end
            windows += _windows(steps, k + 1, start, steps[k + 1].bytes, flow.rate)
        return windows

    def _unsolo(self, flow: Flow) -> None:
        """Place a solo stage where it is now, and the solo stages it interleaved with, and theirs.

        Their transfers may meet now, so they go step by step too: depth first, in the order a
        recursion would take, on a stack of its own (1024 active chunks chain 1024 stages).
        """
        self._unsolo_one(flow)
        pending = [iter(self._partners(flow))]
        while pending:
            other = next(pending[-1], None)
            if other is None:
                pending.pop()
            elif other.solo_ns >= 0:  # (not yet with one it interleaved with)
                self._unsolo_one(other)
                pending.append(iter(self._partners(other)))

    def _unsolo_one(self, flow: Flow) -> None:
        """Place one solo stage where it is now: in a step's transfer (left bytes), or in its delay."""
        steps, now = flow.steps, self.loop.now_ns
        windows = self._solo_windows(flow)
        flow.solo_ns = -1.0
        for i, (start, end, k, left, rate) in enumerate(windows):
            if now < end:  # in the transfer of step k
                left = left - rate * (now - start)
                if i + 1 < len(windows) and windows[i + 1][2] == k:  # (a meeting's part: its end is
                    end = now + left / rate  # where the other's transfer ends, not where this one does)
                flow.k, flow.left, flow.rate, flow.end_ns = k, left, rate, end
                self._passed(flow, k)
                self._rates_stale = True
                break
            delay_ns = steps[k].delay_ns
            last = i + 1 == len(windows) or windows[i + 1][2] != k
            if last and delay_ns > 0 and now < end + delay_ns:  # in the delay after step k: off the links
                flow.k = k
                self._passed(flow, k)
                self._moving.remove(flow)
                self._leave(steps[k].usage)
                self.loop.at(end + delay_ns, self._delay_over, flow)
                break

    def _leave(self, usage: Usage) -> None:
        """A transfer ends: the others' rates change only if one shared a link with it."""
        users = self._users
        for link, _ in usage:
            users[link] -= 1
            if users[link]:
                self._rates_stale = True

    def _set_rates(self) -> None:
        """The max-min rates of the transfers that are not solo (a solo stage shares with solo stages only).

        A stage left alone on its links goes solo again from where it is.
        """
        moving = [f for f in self._moving if f.solo_ns < 0]
        self._rates_stale = False
        self.rates_set += 1
        if not moving:
            return
        users = self._users
        if len(moving) == 1:  # (alone: its links' rate)
            rates = [moving[0].steps[moving[0].k].solo_rate]
        else:
            rates = max_min_rates([f.steps[f.k].usage for f in moving], self.capacity, users)
        for f, r in zip(moving, rates):
            if f.uniform and self.solo:
                for link, _ in f.steps[f.k].usage:
                    if users[link] != 1:
                        break
                else:
                    self._go_solo(f, r, math.inf, None)
                    continue
            if r != f.rate:
                f.rate = r
                f.end_ns = self.loop.now_ns + f.left / r
