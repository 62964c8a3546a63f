"""Write the CLI reference (docs/cli.md) from the argument parser, so that it cannot drift.

Usage::

    python scripts/cli_reference.py [--out docs/cli.md]

The page is built from the parser's own data (each subcommand's description, positionals and
options with their metavars, choices and help), not from argparse's help formatter, so it does not
depend on the terminal width or on the Python version. ``tests/test_docs.py`` checks that the shipped
page equals what this script writes.
"""

import argparse
import sys
from pathlib import Path

from themis_mpi.cli import build_parser
from themis_mpi.output import write_text

ROOT = Path(__file__).resolve().parent.parent

HEADER = """# CLI reference

Generated from the parser by `python scripts/cli_reference.py` (a test checks that this page equals
what it writes: edit the parser's help, then re-run the script). `python -m themis_mpi` is the same
program. For what the numbers mean, see [the time model](time-model.md); for worked examples,
[the tutorial](tutorial.md).

**What goes where.** Standard output carries the results: the `# ...` header lines, then the table.
With `--json -` (and `model`'s and `train`'s `--csv -`, `--jsonl -`) it carries the data alone, and
the header and table go to standard error. Standard error carries progress and warnings; under
mpiexec only rank 0 prints. `train`, `workload ... --run`, `replay` and `calibrate` print their
header at once, before any simulation (`model` and `run`: each topology's before its first row; a
`train` sweep: each topology's before its runs). Then progress: on a terminal a bar with the share
done, the time spent and the ETA; off a terminal (a pipe, a job's log) a line such as `themis-mpi:
baseline: 40% done in 12 s, ETA 18 s` every 5 s (`THEMIS_MPI_PROGRESS_S` sets the interval; `model`
and `run`: a line a minute); nothing with `-q`. It counts real work where it happens: layer steps
for a text workload (a layer's forward, its backward once its gradient is applied), graph nodes
finished for a Chakra trace and for every run `workload --run` prices, collectives for `replay`,
whole staged fits for `calibrate`, cells for `model` and `run`. Before it starts, `train` (and
`workload ... --run`) asks the planner what the run will cost (`timing.planner.estimate`: the
simulator it chose, the NPUs and the chunk steps, at costs per step measured on the development
machine,
[performance](performance.md#what-a-run-will-cost-issue-43)); above 30 s (`THEMIS_MPI_EXPECT_S`
moves that threshold) it adds one line to the header; GNMT on `HGX-H100-SW_SW_SW` with `-c 16
--network fair --npu-compute-scale 5=1.5` prints `# expect ~4 min, ~0.37 GB: every NPU's links under
fair (NPU 5 computes slower, 1024 NPUs x 4,480 chunk steps, at most: classes by state may run fewer
NPUs)` (both policies; the memory where every NPU runs, and a run expected beyond the machine's
memory is refused before it starts; under `fair` the run may prove classes by state and take far
less: baseline's 1024 NPUs run as 12 classes in about 4 CPU s).
"""


def cell(text: str) -> str:
    """Text made safe for one Markdown table cell."""
    return " ".join(text.split()).replace("|", "\\|")


def subcommands(parser: argparse.ArgumentParser) -> list[tuple[str, str, argparse.ArgumentParser]]:
    """(name, one-line help, parser) of every subcommand, in the order they were added."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help or "" for choice in action._choices_actions}
            return [(name, helps.get(name, ""), sub) for name, sub in action.choices.items()]
    raise SystemExit("the parser has no subcommands")


def spelling(action: argparse.Action) -> str:
    """How an argument is written: its flags and its value's metavar or choices."""
    if action.metavar is not None:
        value = action.metavar if isinstance(action.metavar, str) else " ".join(action.metavar)
    elif action.choices is not None:
        value = "{" + ",".join(str(choice) for choice in action.choices) + "}"
    else:
        value = action.dest.upper()
    if not action.option_strings:
        return f"`{value}`"
    takes_value = action.nargs != 0
    flags = ", ".join(action.option_strings)
    return f"`{flags} {value}`" if takes_value else f"`{flags}`"


def synopsis(name: str, parser: argparse.ArgumentParser) -> str:
    """``themis-mpi NAME [options] POSITIONAL...``."""
    positionals = [spelling(a).strip("`") for a in parser._actions if not a.option_strings]
    has_options = any(a.option_strings and a.dest != "help" for a in parser._actions)
    words = ["themis-mpi", name] + (["[options]"] if has_options else []) + positionals
    return " ".join(words)


def reference() -> str:
    """The whole page."""
    parser = build_parser()
    commands = subcommands(parser)
    lines = [HEADER, "| command | what it does |", "| --- | --- |"]
    lines += [f"| [`{name}`](#{name}) | {cell(text)} |" for name, text, _ in commands]
    lines.append("")
    if parser.description:
        lines += [cell(parser.description), ""]
    for name, text, sub in commands:
        lines += [f"## {name}", "", cell(sub.description or text), "", "```", synopsis(name, sub), "```", ""]
        arguments = [a for a in sub._actions if a.dest != "help"]
        if not arguments:
            lines += ["No options.", ""]
            continue
        lines += ["| argument | meaning |", "| --- | --- |"]
        lines += [f"| {spelling(a)} | {cell(a.help or '')} |" for a in arguments]
        lines.append("")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "docs" / "cli.md"), help="output file, - for stdout")
    args = ap.parse_args()
    text = reference()
    if args.out == "-":
        sys.stdout.write(text)
    else:
        write_text(args.out, text)
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
