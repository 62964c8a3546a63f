"""Draw docs/architecture.md from the layers declared in themis_mpi/layers.py.

``python scripts/architecture.py`` rewrites docs/architecture.md; ``--out F`` writes F instead.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from themis_mpi.layers import architecture_markdown
from themis_mpi.output import write_text

ROOT = Path(__file__).resolve().parent.parent


def main(argv: list[str] | None = None) -> int:
    """Write the page; print where."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "docs" / "architecture.md"), help="output file")
    args = ap.parse_args(argv)
    text = architecture_markdown(ROOT / "themis_mpi") + "\n"
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    write_text(args.out, text)
    print(f"# wrote {args.out}: {text.count(chr(10))} lines")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
