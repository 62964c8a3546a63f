"""`themis-mpi policies`: every inter-dim and intra-dim policy, built in or a plugin."""

from __future__ import annotations

import argparse

from ..policies import inter_class, inter_names, intra_class, intra_names, origin


def cmd_policies(args: argparse.Namespace) -> int:
    """`themis-mpi policies`: every inter-dim and intra-dim policy, with where it comes from."""
    inter, intra = inter_names(), intra_names()
    width = max(map(len, inter + intra))
    print(f"# inter-dim policies (--policy); {len(inter)}")
    for name in inter:
        cls = inter_class(name)
        tags = f"auto intra {cls.default_intra}" + (", sizes chunks" if cls.sizes_chunks else "")
        tags += f", in -p all under --compat {cls.compat_only}" if cls.compat_only else ""
        print(f"  {name:<{width}}  {cls.description}  [{tags}; {origin(name)}]")
    print(f"# intra-dim policies (--intra); {len(intra)}")
    for name in intra:
        print(f"  {name:<{width}}  {intra_class(name).description}  [{origin(name)}]")
    return 0
