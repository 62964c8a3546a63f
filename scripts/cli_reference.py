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
