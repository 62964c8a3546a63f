"""Every option's help says something of its own: no two options of a subcommand share a text."""

import argparse
import re

import pytest
from harness import in_process

from themis_mpi.cli.parser import build_parser


def subcommands() -> dict[str, argparse.ArgumentParser]:
    """Each subcommand's parser by name."""
    action = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def own_text(action: argparse.Action) -> str:
    """An option's help without its own names, so that "layers (...)" and "heads (...)" compare equal."""
    text = action.help or ""
    for name in {action.dest, *(s.lstrip("-") for s in action.option_strings)}:
        for spelling in {name, name.replace("_", "-"), name.replace("-", "_")}:
            text = re.sub(re.escape(spelling), "", text, flags=re.IGNORECASE)
    return " ".join(text.split())


@pytest.mark.parametrize("command", sorted(subcommands()))
def test_no_two_options_share_a_help_text(command):
    """A help that only swaps in the option's name ("TP degree", "PP degree") counts as shared."""
    seen: dict[str, list[str]] = {}
    for action in subcommands()[command]._actions:
        if action.help and action.help != argparse.SUPPRESS:
            seen.setdefault(own_text(action), []).append(action.dest)
    shared = {text: dests for text, dests in seen.items() if len(dests) > 1}
    assert not shared, f"{command}: options share a help text: {shared}"


def test_workload_help_has_a_line_of_its_own_per_shape_flag():
    """`workload --help` prints each shape and parallelism flag's own text."""
    proc = in_process(["workload", "--help"])
    assert proc.returncode == 0
    text = " ".join(proc.stdout.split())
    actions = {a.dest: a for a in subcommands()["workload"]._actions}
    names = ("layers", "hidden", "heads", "seq", "vocab", "ffn", "experts", "topk", "tp", "pp", "dp", "ep")
    helps = [" ".join(str(actions[n].help).split()) for n in names]
    assert len(set(helps)) == len(names)
    for help_text in helps:
        assert help_text.replace("%%", "%") in text
