"""The registry of sharing rules: ``--network`` name -> rule class, and the one default.

A new rule is one module with a `links.LinkModel` class and one line in `RULES` (or, from outside
the package, `register_rule` before the command runs): docs/design.md#adding-a-rule.
"""

from __future__ import annotations

from ..cost import ASTRA_SIM_1_0, ASTRA_SIM_2
from ..errors import UsageError
from ..topology import Topology
from .fair import Fair
from .ideal import Ideal
from .links import Host, Link, LinkModel, Settings
from .packet import Packet
from .store_forward import StoreForward

IDEAL, FAIR, STORE_FORWARD, PACKET = Ideal.name, Fair.name, StoreForward.name, Packet.name
DEFAULT_RULE = PACKET  # what runs without --network (outside the compat modes)
RULES: dict[str, type[LinkModel]] = {PACKET: Packet, FAIR: Fair, STORE_FORWARD: StoreForward, IDEAL: Ideal}


def register_rule(cls: type[LinkModel]) -> None:
    """Make a rule class known by its ``name`` (``--network NAME``, `RunConfig.network`)."""
    RULES[cls.name] = cls


def rule_class(name: str) -> type[LinkModel]:
    """The class of a rule's name; one line naming the rules when unknown."""
    if name not in RULES:
        raise UsageError(f"unknown sharing rule {name!r}; use one of {', '.join(RULES)}")
    return RULES[name]


def rule_names() -> tuple[str, ...]:
    """Every rule's name, built-in ones first."""
    return tuple(RULES)


def default_rule(compat: str, per_link: bool = True) -> str:
    """The rule without ``--network``: `DEFAULT_RULE`; 1.0's ``ideal``, 2.x's congestion-aware backend.

    Outside the compat modes a run that no rule times per link (`per_link` False: nccl dims, timed
    by the NCCL-like model; the endpoint model; the wall clock) takes ``ideal``.
    """
    if compat:
        return {ASTRA_SIM_1_0: IDEAL, ASTRA_SIM_2: STORE_FORWARD}.get(compat, DEFAULT_RULE)
    return DEFAULT_RULE if per_link else IDEAL


def check_rule(topology: Topology, rule: str) -> None:
    """Refuse a sharing rule the topology cannot take (nccl dims are timed flat, not per link)."""
    if rule != IDEAL and topology.flat:
        raise UsageError(
            f"--network {rule} shares the links of per-dim stages; nccl dims take --network ideal"
        )


def make_rule(
    name: str,
    links: tuple[Link, ...],
    host: Host,
    topology: Topology,
    settings: Settings,
    count_bytes: bool = True,
) -> LinkModel:
    """The rule of a name on these links, in this host, with its parameters (`LinkModel.made`)."""
    cls = rule_class(name)
    check_rule(topology, name)
    return cls.made(links, host, topology, settings, count_bytes)
