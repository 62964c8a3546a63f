"""`themis-mpi topologies`: the presets with their inline form, links, description and source."""

from __future__ import annotations

import argparse
import textwrap

from ..timing.links import describe_links
from ..topology import DESCRIPTIONS, PRESETS, SOURCES, parse_topology


def cmd_topologies(args: argparse.Namespace) -> int:
    """`themis-mpi topologies`: the presets with their inline form."""
    width = max(map(len, PRESETS))
    print(
        f"# {'preset':<{width}} {'npus':>5}  inline form (KIND(npus,GB/s,ns,algorithm)); "
        "GB/s with 1 GB = 2^30 B"
    )
    for name in PRESETS:
        topo = parse_topology(name)
        print(
            f"  {name:<{width}} {topo.npus:>5}  {topo.spec()}\n  {'':<{width}} {'':>5}  "
            f"# {DESCRIPTIONS[name]}"
        )
        for line in textwrap.wrap(f"links per NPU: {describe_links(topo)}", 96):
            print(f"  {'':<{width}} {'':>5}  #   {line}")
        if name in SOURCES:
            for line in textwrap.wrap(SOURCES[name], 96):
                print(f"  {'':<{width}} {'':>5}  #   {line}")
    return 0
