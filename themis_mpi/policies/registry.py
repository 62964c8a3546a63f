"""The one registry of policies: the built-in ones, then plugins from the entry-point group.

A plugin is a distribution that declares, in its packaging metadata::

    [project.entry-points."themis_mpi.policies"]
    my-policy = "my_policy:MyPolicy"

where ``MyPolicy`` subclasses `InterPolicy` or `IntraPolicy`. Communication schedulers
(`scheduler.CommScheduler`) come the same way from their own group, ``themis_mpi.schedulers``.
Entry points are read once, when a name that is not built in is looked up or the policies are
listed: a built-in name resolves without them, since reading every installed distribution's
metadata (and importing ``importlib.metadata``) cost each MPI rank about a third of the package's
import time. A plugin that fails to load, is not a policy class, or takes a built-in's name is
left out and named, under its own group, when its name is asked for or the plugins are listed;
it never hides the other plugins.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

from ..errors import UsageError
from .base import InterPolicy, IntraPolicy
from .inter import AllReducePerDim, Baseline, RoundRobin, Themis, ThemisFlex, ThemisLat
from .intra import Fifo, Lrpf, Rg, Scf
from .ports import ThemisPorts
from .predictive import Predictive
from .scheduler import BUILTIN_SCHEDULERS, CommScheduler

P = TypeVar("P")
ENTRY_POINT_GROUP = "themis_mpi.policies"
SCHEDULER_GROUP = "themis_mpi.schedulers"
BUILTIN_INTER: tuple[type[InterPolicy], ...] = (
    Baseline,
    Themis,
    ThemisFlex,
    RoundRobin,
    ThemisLat,
    ThemisPorts,
    Predictive,
    AllReducePerDim,
)
BUILTIN_INTRA: tuple[type[IntraPolicy], ...] = (Fifo, Scf, Rg, Lrpf)
_BUILTIN: dict[str, type] = {p.name: p for p in BUILTIN_INTER} | {p.name: p for p in BUILTIN_INTRA}

GROUP_WHAT = {ENTRY_POINT_GROUP: "policy", SCHEDULER_GROUP: "scheduler"}


@dataclass
class Plugins:
    """One entry-point group read: name -> class and origin of every policy, and the broken plugins.

    A plugin that fails to load, is not of the group's kind, or takes a taken name is kept out,
    under its entry point's name, with the one line that says why (`broken`): it is reported when
    its name is asked for, or by `themis-mpi policies`, and never hides the others.
    """

    classes: dict[str, type]
    origin: dict[str, str]
    broken: dict[str, str] = field(default_factory=dict)


_loaded: dict[str, Plugins] = {}


def _read(group: str, builtin: dict[str, type], base: type | tuple[type, ...], kind: str) -> Plugins:
    """The built-in classes, then the group's plugins that load and are `base` subclasses."""
    if group in _loaded:
        return _loaded[group]
    from importlib import metadata

    found = Plugins(dict(builtin), dict.fromkeys(builtin, "builtin"))
    what = GROUP_WHAT[group]
    for ep in sorted(metadata.entry_points(group=group), key=lambda e: e.name):
        dist = getattr(getattr(ep, "dist", None), "name", None) or "unknown distribution"
        where = f"{what} plugin {ep.name!r} ({ep.value}, from {dist}, entry-point group {group})"
        try:
            cls = ep.load()
        except (Exception, SystemExit) as exc:  # (a plugin that calls sys.exit is an error too)
            found.broken[ep.name] = f"{where} failed to load: {type(exc).__name__}: {str(exc)[:200]}"
            continue
        if not (isinstance(cls, type) and issubclass(cls, base)):
            found.broken[ep.name] = f"{where} is not a subclass of {kind}"
            continue
        name = getattr(cls, "name", "") or ep.name
        if name in found.classes and found.classes[name] is not cls:
            found.broken[ep.name] = f"{where} takes the name {name!r}, which {found.origin[name]} {what} has"
            continue
        found.classes[name], found.origin[name] = cls, f"plugin {ep.value}"
    _loaded[group] = found
    return found


def _registry() -> Plugins:
    """The policies: the built-in ones, then the plugins of `ENTRY_POINT_GROUP`."""
    return _read(ENTRY_POINT_GROUP, _BUILTIN, (InterPolicy, IntraPolicy), "InterPolicy or IntraPolicy")


def broken_plugins() -> list[str]:
    """One line for every plugin of either group that could not be taken (`Plugins.broken`)."""
    return [*_registry().broken.values(), *_scheduler_registry().broken.values()]


def _lookup(name: str) -> type | None:
    """A policy class by name: a built-in one without reading the entry points, else the registry's.

    A broken plugin of that name is its own error.
    """
    if name in _BUILTIN:
        return _BUILTIN[name]
    plugins = _registry()
    if name in plugins.broken:
        raise UsageError(plugins.broken[name])
    return plugins.classes.get(name)


def is_inter(name: str) -> bool:
    """Whether `name` is an inter-dim policy (built in, or a plugin)."""
    cls = _lookup(name)
    return cls is not None and issubclass(cls, InterPolicy)


def is_intra(name: str) -> bool:
    """Whether `name` is an intra-dim policy (built in, or a plugin)."""
    cls = _lookup(name)
    return cls is not None and issubclass(cls, IntraPolicy)


def inter_names() -> list[str]:
    """Names of the inter-dim policies: the built-in ones first, then plugins."""
    return [n for n, c in _registry().classes.items() if issubclass(c, InterPolicy)]


def intra_names() -> list[str]:
    """Names of the intra-dim policies: the built-in ones first, then plugins."""
    return [n for n, c in _registry().classes.items() if issubclass(c, IntraPolicy)]


def origin(name: str) -> str:
    """Where a policy comes from: "builtin" or "plugin module:Class"."""
    return "builtin" if name in _BUILTIN else _registry().origin[name]


def _policy_class(name: str, base: type, what: str, names: Callable[[], list[str]]) -> type:
    cls = _lookup(name)
    if cls is None or not issubclass(cls, base):
        raise UsageError(f"unknown {what} {name!r}; use one of {', '.join(names())} (themis-mpi policies)")
    return cls


def inter_class(name: str) -> type[InterPolicy]:
    """The inter-dim policy class of a name; one line naming the choices when unknown."""
    return _policy_class(name, InterPolicy, "policy", inter_names)


def intra_class(name: str) -> type[IntraPolicy]:
    """The intra-dim policy class of a name; one line naming the choices when unknown."""
    return _policy_class(name, IntraPolicy, "intra-dim policy", intra_names)


def _instance(cls: type[P], name: str, what: str) -> P:
    """A fresh instance of a policy class; a plugin that fails to construct is named in one line."""
    try:
        return cls()
    except (Exception, SystemExit) as exc:  # (a plugin that calls sys.exit is an error too)
        raise UsageError(
            f"{what} {name!r} ({origin(name)}) failed to start: {type(exc).__name__}: {exc}"
        ) from None


def make_inter(name: str) -> InterPolicy:
    """A fresh instance of an inter-dim policy (a plugin that fails to construct is named)."""
    return _instance(inter_class(name), name, "policy")


def make_intra(name: str) -> IntraPolicy:
    """A fresh instance of an intra-dim policy."""
    return _instance(intra_class(name), name, "intra-dim policy")


# --- communication schedulers (their own group and names) --------------------------------------

_BUILTIN_SCHEDULERS: dict[str, type] = {s.name: s for s in BUILTIN_SCHEDULERS}


def _scheduler_registry() -> Plugins:
    """The communication schedulers: the built-in ones, then the plugins of `SCHEDULER_GROUP`."""
    return _read(SCHEDULER_GROUP, _BUILTIN_SCHEDULERS, CommScheduler, "CommScheduler")


def scheduler_names() -> list[str]:
    """Names of the communication schedulers: the built-in ones first, then plugins."""
    return list(_scheduler_registry().classes)


def scheduler_origin(name: str) -> str:
    """Where a scheduler comes from: "builtin" or "plugin module:Class"."""
    return "builtin" if name in _BUILTIN_SCHEDULERS else _scheduler_registry().origin[name]


def scheduler_class(name: str) -> type[CommScheduler]:
    """The scheduler class of a name; one line naming the choices when unknown."""
    if name in _BUILTIN_SCHEDULERS:
        return _BUILTIN_SCHEDULERS[name]
    plugins = _scheduler_registry()
    if name in plugins.broken:
        raise UsageError(plugins.broken[name])
    cls = plugins.classes.get(name)
    if cls is None:
        raise UsageError(
            f"unknown communication scheduler {name!r}; use one of {', '.join(scheduler_names())} "
            "(themis-mpi policies)"
        )
    return cls


def default_partition_mib(name: str, partition_mib: float | None = None) -> float:
    """`partition_mib` if given, else the scheduler's default: 4 MiB for one that slices, else 0."""
    if partition_mib is not None:
        return float(partition_mib)
    return 4.0 if name and scheduler_class(name).slices else 0.0


def make_scheduler(name: str) -> CommScheduler:
    """A fresh instance of a communication scheduler (a plugin that fails to construct is named)."""
    cls = scheduler_class(name)
    try:
        return cls()
    except (Exception, SystemExit) as exc:  # (a plugin that calls sys.exit is an error too)
        raise UsageError(
            f"communication scheduler {name!r} ({scheduler_origin(name)}) failed to start: "
            f"{type(exc).__name__}: {exc}"
        ) from None
