"""`themis-mpi policies`: every policy and communication scheduler, built in or a plugin."""

from __future__ import annotations

import argparse
import sys

from ..policies import (
    broken_plugins,
    inter_class,
    inter_names,
    intra_class,
    intra_names,
    origin,
    scheduler_class,
    scheduler_names,
    scheduler_origin,
)


def cmd_policies(args: argparse.Namespace) -> int:
    """`themis-mpi policies`: every policy and scheduler, with where it comes from.

    A plugin that cannot be taken is left out of the lists and named once on stderr, under its
    own group (exit 2): it never hides the others.
    """
    inter, intra, schedulers = inter_names(), intra_names(), scheduler_names()
    width = max(map(len, inter + intra + schedulers))
    print(f"# inter-dim policies (--policy); {len(inter)}")
    for name in inter:
        cls = inter_class(name)
        tags = f"auto intra {cls.default_intra}" + (", sizes chunks" if cls.sizes_chunks else "")
        tags += f", in -p all under --compat {cls.compat_only}" if cls.compat_only else ""
        print(f"  {name:<{width}}  {cls.description}  [{tags}; {origin(name)}]")
    print(f"# intra-dim policies (--intra); {len(intra)}")
    for name in intra:
        print(f"  {name:<{width}}  {intra_class(name).description}  [{origin(name)}]")
    print(f"# communication schedulers between collectives (--comm-scheduler); {len(schedulers)}")
    for name in schedulers:
        scheduler = scheduler_class(name)
        tags = ("slices tensors, " if scheduler.slices else "") + scheduler_origin(name)
        print(f"  {name:<{width}}  {scheduler.description}  [{tags}]")
    broken = broken_plugins()
    for line in broken:
        print(f"themis-mpi: error: {line}", file=sys.stderr)
    return 2 if broken else 0
