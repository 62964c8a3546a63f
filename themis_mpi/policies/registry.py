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
refused with one line naming it whenever they are read.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from ..errors import UsageError
from .base import InterPolicy, IntraPolicy
from .inter import AllReducePerDim, Baseline, RoundRobin, Themis, ThemisFlex, ThemisLat
from .intra import Fifo, Lrpf, Rg, Scf
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
    Predictive,
    AllReducePerDim,
)
BUILTIN_INTRA: tuple[type[IntraPolicy], ...] = (Fifo, Scf, Rg, Lrpf)
_BUILTIN: dict[str, type] = {p.name: p for p in BUILTIN_INTER} | {p.name: p for p in BUILTIN_INTRA}

_loaded: dict[str, tuple[dict[str, type], dict[str, str]]] = {}


def _plugin_error(ep, why: str) -> UsageError:
    dist = getattr(getattr(ep, "dist", None), "name", None) or "unknown distribution"
    return UsageError(f"policy plugin {ep.name!r} ({ep.value}, from {dist}) {why}")


def _registry() -> tuple[dict[str, type], dict[str, str]]:
    """Name -> class of every policy, and name -> where it comes from ("builtin" or the plugin)."""
    if "all" in _loaded:
        return _loaded["all"]
    from importlib import metadata

    classes: dict[str, type] = dict(_BUILTIN)
    origin: dict[str, str] = dict.fromkeys(_BUILTIN, "builtin")
    for ep in sorted(metadata.entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name):
        try:
            cls = ep.load()
        except (Exception, SystemExit) as exc:  # (a plugin that calls sys.exit is an error too)
            raise _plugin_error(ep, f"failed to load: {type(exc).__name__}: {exc}") from None
        if not (isinstance(cls, type) and issubclass(cls, (InterPolicy, IntraPolicy))):
            raise _plugin_error(ep, "is not a subclass of InterPolicy or IntraPolicy")
        name = getattr(cls, "name", "") or ep.name
        if name in classes and classes[name] is not cls:
            raise _plugin_error(ep, f"takes the name {name!r}, which {origin[name]} policy already has")
        classes[name], origin[name] = cls, f"plugin {ep.value}"
    _loaded["all"] = (classes, origin)
    return classes, origin


def _lookup(name: str) -> type | None:
    """A policy class by name: a built-in one without reading the entry points, else the registry's."""
    return _BUILTIN.get(name) or _registry()[0].get(name)


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
    classes, _ = _registry()
    return [n for n, c in classes.items() if issubclass(c, InterPolicy)]


def intra_names() -> list[str]:
    """Names of the intra-dim policies: the built-in ones first, then plugins."""
    classes, _ = _registry()
    return [n for n, c in classes.items() if issubclass(c, IntraPolicy)]


def origin(name: str) -> str:
    """Where a policy comes from: "builtin" or "plugin module:Class"."""
    return "builtin" if name in _BUILTIN else _registry()[1][name]


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

_BUILTIN_SCHEDULERS: dict[str, type[CommScheduler]] = {s.name: s for s in BUILTIN_SCHEDULERS}


def _scheduler_registry() -> tuple[dict[str, type[CommScheduler]], dict[str, str]]:
    """Name -> class of every scheduler, and name -> where it comes from."""
    if "schedulers" in _loaded:
        return _loaded["schedulers"]
    from importlib import metadata

    classes: dict[str, type[CommScheduler]] = dict(_BUILTIN_SCHEDULERS)
    where: dict[str, str] = dict.fromkeys(_BUILTIN_SCHEDULERS, "builtin")
    for ep in sorted(metadata.entry_points(group=SCHEDULER_GROUP), key=lambda e: e.name):
        try:
            cls = ep.load()
        except (Exception, SystemExit) as exc:  # (a plugin that calls sys.exit is an error too)
            raise _plugin_error(ep, f"failed to load: {type(exc).__name__}: {exc}") from None
        if not (isinstance(cls, type) and issubclass(cls, CommScheduler)):
            raise _plugin_error(ep, "is not a subclass of CommScheduler")
        name = getattr(cls, "name", "") or ep.name
        if name in classes and classes[name] is not cls:
            raise _plugin_error(ep, f"takes the name {name!r}, which {where[name]} scheduler already has")
        classes[name], where[name] = cls, f"plugin {ep.value}"
    _loaded["schedulers"] = (classes, where)
    return classes, where


def scheduler_names() -> list[str]:
    """Names of the communication schedulers: the built-in ones first, then plugins."""
    return list(_scheduler_registry()[0])


def scheduler_origin(name: str) -> str:
    """Where a scheduler comes from: "builtin" or "plugin module:Class"."""
    return "builtin" if name in _BUILTIN_SCHEDULERS else _scheduler_registry()[1][name]


def scheduler_class(name: str) -> type[CommScheduler]:
    """The scheduler class of a name; one line naming the choices when unknown."""
    cls = _BUILTIN_SCHEDULERS.get(name) or _scheduler_registry()[0].get(name)
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
