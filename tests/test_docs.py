"""Docs that cannot lie: every pasted output in README.md and docs/ is re-run and compared.

Convention (docs/index.md, "How the pages are checked"): a fenced ``console`` block holds
commands, each on a line that starts with ``$ `` (continued on lines that start with ``> ``), and
below each command the output it printed. The commands run from the root of a copy of the
shipped files (what git tracks), with standard error folded into standard output; a plain
``themis-mpi ARGS`` or ``python scripts/NAME.py ARGS``, also in a ``&&`` list with ``mkdir -p`` and
piped through ``tail``/``head``/``grep``/``cut``/``sed -n`` (`simple_list`, those filters in Python),
runs in the test's own process (`run_example`), any other command under bash. The output is
compared line by line and token by token: a line of ``...`` stands for any number of lines, and
the values of the wall-clock columns in ``WALL_CLOCK_COLUMNS`` are not compared (they are found by
name in the table header above them, counted from the end of the line). Commands under
``mpiexec`` (at most 8 ranks) run only when ``THEMIS_MPI_DOC_MPI=1``, which ``.ci/run`` sets unless
``CI_QUICK=1``. Blocks of other kinds (``sh``, ``text``) are not run: ``text`` holds measurements,
each labelled with its machine and date.
"""

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

import cli_reference  # noqa: E402
import harness  # noqa: E402
from harness import in_process, script  # noqa: E402

from themis_mpi.cli.options import Meter  # noqa: E402

# Columns whose values are wall-clock measurements of this machine, never compared.
WALL_CLOCK_COLUMNS = ("wall_s", "wall_us", "scale", "error%")
MAX_MPI_RANKS = 8
COMMAND_TIMEOUT_S = 300
RUN_MPI = os.environ.get("THEMIS_MPI_DOC_MPI") == "1"


@dataclass
class Example:
    """One command of a ``console`` block and the output pasted below it."""

    page: str
    line: int
    command: str
    expected: list[str]

    @property
    def ranks(self) -> int:
        """Ranks of its mpiexec launch, 0 without one."""
        found = re.search(r"\bmpiexec\b.*?\s-n\s+(\d+)", self.command)
        return int(found.group(1)) if found else (1 if "mpiexec" in self.command else 0)

    @property
    def name(self) -> str:
        """``page:line``."""
        return f"{self.page}:{self.line}"


def pages() -> list[Path]:
    """README.md and every Markdown page under docs/."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def examples() -> list[Example]:
    """Every command of every ``console`` block, in page order."""
    found: list[Example] = []
    for page in pages():
        lines = page.read_text().splitlines()
        inside = False
        for number, line in enumerate(lines, start=1):
            if line.strip().startswith("```"):
                inside = not inside and line.strip() == "```console"
                continue
            if not inside:
                continue
            if line.startswith("$ "):
                found.append(Example(str(page.relative_to(ROOT)), number, line[2:], []))
            elif line.startswith("> ") and found and not found[-1].expected:
                found[-1].command += "\n" + line[2:]
            else:
                assert found and found[-1].line < number, f"{page.name}:{number}: output before any command"
                found[-1].expected.append(line)
    return found


def is_header(line: str) -> bool:
    """A table header: ``#`` and at least four column names, none a number or a unit in brackets."""
    words = line.lstrip("#").split()
    if not line.startswith("#") or len(words) < 4 or words[0].startswith("("):
        return False
    return not any(re.fullmatch(r"[-+]?[\d.]+%?", word) for word in words)


def wall_positions(header: str) -> set[int]:
    """Positions, counted from the end of a row, of the header's wall-clock columns."""
    words = header.lstrip("#").split()
    return {len(words) - 1 - i for i, word in enumerate(words) if word in WALL_CLOCK_COLUMNS}


def same_line(expected: str, actual: str, ignored: set[int]) -> bool:
    """Equal token by token, but for the tokens at the ignored positions from the end."""
    want, got = expected.split(), actual.split()
    if len(want) != len(got):
        return False
    return all(w == g for i, (w, g) in enumerate(zip(want, got)) if len(want) - 1 - i not in ignored)


def ignored_per_line(lines: list[str]) -> list[set[int]]:
    """For each line, the wall-clock positions of the table header above it (empty if none)."""
    current: set[int] = set()
    out = []
    for line in lines:
        if is_header(line):
            current = wall_positions(line)
        out.append(set() if line.startswith("#") else current)
    return out


def mismatch(expected: list[str], actual: list[str]) -> str | None:
    """Why the actual output does not match the page, or None when it does."""
    ignored = ignored_per_line(expected)
    segments: list[list[tuple[str, set[int]]]] = [[]]
    for line, skip in zip(expected, ignored):
        if line.strip() == "...":
            segments.append([])
        else:
            segments[-1].append((line, skip))
    position = 0
    for index, segment in enumerate(segments):
        starts = [position] if index == 0 else range(position, max(position, len(actual) - len(segment)) + 1)
        best, best_start = -1, position
        for start in starts:
            window = actual[start : start + len(segment)]
            matched = next(
                (
                    i
                    for i, ((want, skip), got) in enumerate(zip(segment, window))
                    if not same_line(want, got, skip)
                ),
                len(window),
            )
            if matched == len(segment):
                position = start + len(segment)
                break
            if matched > best:
                best, best_start = matched, start
        else:
            want = segment[best][0]
            got = actual[best_start + best] if best_start + best < len(actual) else "(no more output)"
            return f"page line {want!r}\n  but the command printed {got!r}"
    if segments[-1] and position != len(actual):
        return "the command printed more lines than the page shows:\n" + "\n".join(actual[position:])
    return None


def shipped_files() -> list[str]:
    """The repository's files as git ships them (tracked, or new and not ignored)."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    if listed.returncode == 0:
        return listed.stdout.splitlines()
    skip = {".git", ".venv", "__pycache__", "results", "out", ".pytest_cache", ".hypothesis"}
    return [str(p.relative_to(ROOT)) for p in ROOT.rglob("*") if not skip & set(p.relative_to(ROOT).parts)]


@pytest.fixture(scope="session")
def shipped(tmp_path_factory) -> Path:
    """A copy of the shipped files to run the examples in, so that they cannot touch the checkout."""
    copy = tmp_path_factory.mktemp("shipped")
    for name in shipped_files():
        source = ROOT / name
        if source.is_file():
            (copy / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, copy / name)
    return copy


# Results that a documented script recomputes and tests compute too: the script run in this process
# takes the test session's copy (tests/harness.py), so each is computed once per session.
SESSION_CACHED = ("compare_row", "compare_row_2")


def plain_command(command: str) -> tuple[str, list[str]] | None:
    """The program and arguments of a plain ``themis-mpi ARGS`` or ``python scripts/NAME.py ARGS``, else None.

    Plain: one command (a comment after it allowed), no pipe, redirection, list, expansion, glob
    or continuation line outside quotes, so that bash would run the program with exactly these
    arguments.
    """
    unquoted = re.sub(r"'[^']*'|\"[^\"$`\\]*\"", "", command.split(" #", 1)[0])
    if re.search(r"[|&;<>()$`*?\[\]{}~\\\n'\"]", unquoted):
        return None
    words = shlex.split(command, comments=True)
    if words[:1] == ["themis-mpi"]:
        return words[0], words[1:]
    if len(words) > 1 and words[0] == "python" and re.fullmatch(r"scripts/\w+\.py", words[1]):
        return words[1], words[2:]
    return None


def run_plain(
    program: str, args: list[str], root: Path, fold_stderr: bool = True
) -> subprocess.CompletedProcess:
    """A plain command (`plain_command`) run in this process from `root`: exit code and output.

    `fold_stderr`: standard error written into the standard output (``2>&1``). A script is the
    checkout's (the copy's is the same file); `SESSION_CACHED` results come from the session's
    cache in tests/harness.py.
    """
    main = None
    with pytest.MonkeyPatch.context() as patch:
        if program != "themis-mpi":
            module = script(Path(program).stem)
            main = module.main
            for name in SESSION_CACHED:
                if hasattr(module, name):
                    patch.setattr(module, name, getattr(harness, name))
        patch.setenv("THEMIS_MPI_PROGRESS_S", "inf")
        patch.setattr(Meter, "NOTE_S", float("inf"))  # (read when the module was imported)
        return in_process(args, cwd=root, fold_stderr=fold_stderr, main=main)


# Outside quotes: a quoted string, an operator of the few that `simple_list` reads, or other text.
_SHELL_PARTS = re.compile(r"'[^']*'|\"[^\"$`\\]*\"|(&&|\|\||[|;&<>])|[^'\"|;&<>]+")


def split_unquoted(command: str) -> list[str] | None:
    """`command` cut at its operators outside quotes: text, operator, text, ...; None if it cannot be read so."""
    parts, text, at = [], "", 0
    while at < len(command):
        found = _SHELL_PARTS.match(command, at)
        if found is None:
            return None
        if found.group(1):
            parts += [text, found.group(1)]
            text = ""
        else:
            text += found.group(0)
        at = found.end()
    return [*parts, text]


def lines_of(text: str) -> list[str]:
    """The lines of a program's output, without their newlines."""
    return text.split("\n")[:-1] if text.endswith("\n") else text.split("\n") if text else []


def text_of(lines: list[str]) -> str:
    """Lines as a program prints them."""
    return "".join(line + "\n" for line in lines)


def span(spec: str) -> tuple[int, int | None] | None:
    """``N``, ``N-M``, ``N-`` or ``-M`` of cut, as a slice of 0-based positions; None for any other list."""
    found = re.fullmatch(r"(\d*)(-?)(\d*)", spec)
    if not found or not (found.group(1) or found.group(3)):
        return None
    first = int(found.group(1) or 1)
    last = int(found.group(3)) if found.group(3) else (first if not found.group(2) else None)
    return first - 1, last


def same_in_re(pattern: str, extended: bool) -> bool:
    """Whether a grep pattern means the same in Python's re as in POSIX basic (or `extended`) syntax.

    Only literal word characters, ``.``, ``*`` after an atom, bracket lists without classes,
    ``^`` and ``$`` as anchors at the ends (of each branch: ``|`` only in extended syntax).
    """
    allowed = r"[\w .*:#,%\[\]^$|-]*" if extended else r"[\w .*:#,%\[\]^$-]*"
    if not re.fullmatch(allowed, pattern) or re.search(r"\[[:=.]|\*\*|^\*", pattern):
        return False
    for branch in pattern.split("|") if extended else [pattern]:
        bare = re.sub(r"\[\^?\]?[^\]]*\]", "", branch)  # (inside a bracket list ^ and $ are the same)
        if not branch or "^" in bare[1:] or "$" in bare[:-1] or "[" in bare or "]" in bare:
            return False
    return True


Filter = Callable[[list[str]], tuple[list[str], int] | None]


def filter_of(words: list[str]) -> Filter | None:
    """A simple filter in Python: a function from lines to (lines, exit status); None for any other.

    ``tail -N``, ``head -N``, ``grep [-E|-c|-v] PATTERN``, ``cut -cLIST``, ``cut -dD -fLIST``,
    ``sed -n Np``: exactly what the program does with those flags (POSIX), nothing it does with others; a
    function gives None for input it cannot be sure of (cut -c counts bytes: ASCII lines only).
    """
    name, flags = words[0], words[1:]
    if name in ("tail", "head") and len(flags) == 1 and re.fullmatch(r"-\d+", flags[0]):
        n = int(flags[0][1:])
        return (
            (lambda ls: (ls[max(len(ls) - n, 0) :] if n else [], 0))
            if name == "tail"
            else (lambda ls: (ls[:n], 0))
        )
    if name == "sed" and flags[:1] == ["-n"] and len(flags) == 2 and re.fullmatch(r"[1-9]\d*p", flags[1]):
        n = int(flags[1][:-1])
        return lambda ls: (ls[n - 1 : n], 0)
    if name == "grep" and len(flags) in (1, 2) and flags[:-1] in ([], ["-E"], ["-c"], ["-v"]):
        if not same_in_re(flags[-1], extended=flags[0] == "-E"):
            return None
        pattern, invert, count = re.compile(flags[-1]), flags[0] == "-v", flags[0] == "-c"

        def grep(lines: list[str]) -> tuple[list[str], int]:
            picked = [line for line in lines if bool(pattern.search(line)) != invert]
            return [str(len(picked))] if count else picked, 0 if picked else 1

        return grep
    if name == "cut" and len(flags) == 1 and flags[0].startswith("-c") and (chars := span(flags[0][2:])):
        return lambda ls: (
            ([line[chars[0] : chars[1]] for line in ls], 0) if all(map(str.isascii, ls)) else None
        )
    if (
        name == "cut"
        and len(flags) == 2
        and re.fullmatch(r"-d.", flags[0])
        and flags[1][:2] == "-f"
        and (fields := span(flags[1][2:]))
    ):
        sep = flags[0][2]
        return lambda ls: (
            [sep.join(line.split(sep)[fields[0] : fields[1]]) if sep in line else line for line in ls],
            0,
        )
    return None


def simple_list(command: str):
    """The steps of a ``&&`` list of plain commands and ``mkdir -p DIR``; None for any other command.

    Each plain command (`plain_command`) maybe piped through filters (`filter_of`) or sent to
    ``> /dev/null``. Returned as steps ``(kind, program, filters)`` that `run_simple` runs in this process.
    """
    try:
        return _simple_list(command)
    except ValueError:  # (shlex: a quote that does not close)
        return None


def _simple_list(command: str):
    """`simple_list`, which may raise ValueError."""
    parts = split_unquoted(command.split(" #", 1)[0])
    if parts is None:
        return None
    chains: list[list[str]] = [[""]]  # the commands of the list, each the stages of its pipe
    for index, part in enumerate(parts):
        if index % 2 == 0:
            chains[-1][-1] += part
        elif part == "&&":
            chains.append([""])
        elif part == "|":
            chains[-1].append("")
        elif part == ">" and index + 1 < len(parts) and parts[index + 1].strip() == "/dev/null":
            chains[-1][-1] += " >/dev/null"  # (a ">" of its own: `plain_command` takes no such stage)
            parts[index + 1] = ""
        else:
            return None
    steps = []
    for stages in chains:
        words = shlex.split(stages[0])
        if len(stages) == 1 and len(words) == 3 and words[:2] == ["mkdir", "-p"] and "'" not in stages[0]:
            steps.append(("mkdir", words[2], []))
            continue
        null = stages[0].rstrip().endswith(" >/dev/null")
        program = plain_command(stages[0].rstrip().removesuffix(" >/dev/null"))
        filters = [filter_of(shlex.split(stage)) if ">" not in stage else None for stage in stages[1:]]
        if program is None or None in filters or (null and filters):
            return None
        steps.append(("null" if null else "run", program, filters))
    return steps


def run_simple(steps, root: Path) -> str | None:
    """A `simple_list`'s output, standard error folded in, run in this process from `root`.

    None when it cannot be sure to print what bash would: a piped program that writes to standard
    error (bash orders those lines against the filter's as the programs run), or a filter that
    declines its input.
    """
    output = ""
    for kind, program, filters in steps:
        if kind == "mkdir":
            (root / program).mkdir(parents=True, exist_ok=True)
            continue
        done = run_plain(*program, root, fold_stderr=kind == "run" and not filters)
        if filters and done.stderr:
            return None
        lines, code = lines_of(done.stdout), done.returncode
        for step in filters:
            filtered = step(lines)
            if filtered is None:
                return None
            lines, code = filtered
        output += done.stderr if kind == "null" else text_of(lines) if filters else done.stdout
        if code != 0:
            break
    return output


def run_example(example: Example, root: Path) -> None:
    """Run one example in the copy and compare its output with the page.

    A plain command (`plain_command`), or a list of them with simple filters (`simple_list`), runs
    in this process (`run_simple`): the same command line, without an interpreter's start-up; any
    other (mpiexec, loops, other programs) runs under bash, standard error folded into standard
    output.
    """
    steps = simple_list(example.command)
    output = None if steps is None else run_simple(steps, root)
    if (
        output is None
    ):  # (the pages are terminal sessions: the progress bar clears, as THEMIS_MPI_PROGRESS_S=inf has it)
        output = subprocess.run(
            ["bash", "-c", example.command],
            cwd=root,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=COMMAND_TIMEOUT_S,
            env={**os.environ, "THEMIS_MPI_PROGRESS_S": "inf"},
        ).stdout
    actual = output.rstrip("\n").split("\n") if output.strip() else []
    why = mismatch(example.expected, actual)
    assert why is None, f"{example.name}: $ {example.command}\n{why}"


SERIAL = [e for e in examples() if not e.ranks]
MPI = [e for e in examples() if e.ranks]


def test_pages_show_examples():
    """The pages hold both kinds of example: commands without MPI and under mpiexec."""
    assert len(SERIAL) >= 20 and len(MPI) >= 3, (len(SERIAL), len(MPI))


@pytest.mark.docs
@pytest.mark.parametrize("example", SERIAL, ids=[e.name for e in SERIAL])
def test_example_reproduces(example, shipped):
    """A pasted command without MPI prints what its page shows, wall-clock columns aside."""
    run_example(example, shipped)


def test_mpi_examples_fit_the_ci_job():
    """Every mpiexec example launches at most 8 ranks and shows the output it checks."""
    assert all(1 <= e.ranks <= MAX_MPI_RANKS and e.expected for e in MPI), [e.name for e in MPI]


if RUN_MPI:

    @pytest.mark.docs
    @pytest.mark.parametrize("example", MPI, ids=[e.name for e in MPI])
    def test_mpi_example_reproduces(example, shipped):
        """A pasted mpiexec command prints what its page shows, wall-clock columns aside."""
        run_example(example, shipped)


FILTER_INPUT = (
    "# topology a|b|c\n  2x2x2 1.5|x|y\n# machine: link 3\nno bar here\ntime error 4%\n\nlast line\n"
)
FILTERS = [
    "tail -3", "tail -0", "tail -99", "head -2", "head -99", "sed -n 2p", "sed -n 99p",
    "grep '^topology'", "grep '^# [tm]'", "grep -v '^# [g1rm]'", "grep -c .", "grep -c '^zz'",
    "grep -E '^# topology|^# machine: link|time error'", "grep 'error 4%$'",
    "cut -c1-9", "cut -c3-", "cut -c-2", "cut -c5", "cut -d'|' -f2-10", "cut -d'|' -f1", "cut -d'|' -f2-",
]  # fmt: skip


@pytest.mark.parametrize("command", FILTERS)
def test_a_filter_in_python_prints_what_the_program_prints(command):
    """Each filter that `simple_list` runs in Python gives the program's lines and exit status."""
    program = subprocess.run(command, shell=True, input=FILTER_INPUT, capture_output=True, text=True)
    step = filter_of(shlex.split(command))
    assert step is not None
    assert step(lines_of(FILTER_INPUT)) == (lines_of(program.stdout), program.returncode)


def test_other_commands_stay_under_bash():
    """A filter or flag the Python filters do not implement, or another list, leaves the command to bash."""
    plain = "themis-mpi model -t 4x2 -q"
    for other in (
        "tail -n 3",
        "grep -i x",
        "grep 'a\\|b'",
        "grep 'a+'",
        "grep 'x^'",
        "cut -c1,3",
        "sort",
        "wc -l",
    ):
        assert filter_of(shlex.split(other)) is None, other
    for command in (
        f"{plain} | sort",
        f"{plain} > out.txt",
        f"{plain}; {plain}",
        f"{plain} || true",
        "ls | tail -1",
    ):
        assert simple_list(command) is None, command
    assert simple_list(f"mkdir -p out && {plain} | tail -2 | cut -c1-9") is not None
    assert sum(simple_list(e.command) is not None and plain_command(e.command) is None for e in SERIAL) >= 30


def test_edited_figure_is_caught():
    """Changing one figure of a pasted row, or dropping a row, makes the comparison fail."""
    header = "#   policy  time_us  util%  wall_s"
    page = [header, "  baseline  627.56  58.10  0.4777"]
    assert mismatch(page, [header, "  baseline  627.56  58.10  9.9999"]) is None
    assert mismatch(page, [header, "  baseline  627.57  58.10  0.4777"]) is not None
    assert mismatch(page, [header]) is not None
    assert mismatch(["...", page[1]], ["x", header, page[1]]) is None
    assert mismatch([*page, "..."], [*page, "more"]) is None
    assert mismatch(page, [*page, "more"]) is not None


def test_cli_reference_is_generated():
    """docs/cli.md is exactly what scripts/cli_reference.py writes from the parser."""
    assert (ROOT / "docs" / "cli.md").read_text() == cli_reference.reference()


def test_readme_is_short():
    """The README is at most 200 lines."""
    assert len((ROOT / "README.md").read_text().splitlines()) <= 200


def test_readme_links_every_page():
    """Every Markdown page under docs/ is linked from the README."""
    readme = (ROOT / "README.md").read_text()
    missing = [str(p.relative_to(ROOT)) for p in sorted((ROOT / "docs").rglob("*.md"))]
    missing = [name for name in missing if f"]({name}" not in readme]
    assert not missing, missing


def anchors(page: Path) -> set[str]:
    """The heading anchors of a page, as GitHub spells them."""
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    headings = re.findall(r"^#+ (.+)$", text, flags=re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}


def test_links_resolve():
    """Every relative link of README.md and docs/ names a file of the repository, and its heading."""
    broken = []
    for page in pages():
        for target, anchor in re.findall(r"\]\(([^)#\s]*)(?:#([^)\s]*))?\)", page.read_text()):
            if "://" in target or target.startswith("mailto:"):
                continue
            linked = (page.parent / target) if target else page
            if not linked.exists():
                broken.append(f"{page.relative_to(ROOT)} -> {target}")
            elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
                broken.append(f"{page.relative_to(ROOT)} -> {target}#{anchor}")
    assert not broken, broken


def test_readme_test_command_is_ci():
    """The README's test command is the last line of .ci/run, character for character."""
    last = (ROOT / ".ci" / "run").read_text().strip().splitlines()[-1]
    assert f"```sh\n{last}\n```" in (ROOT / "README.md").read_text()


def test_cited_documents_exist():
    """Every Markdown document that the code, scripts and tests cite is a file of the repository."""
    names = {p.name for p in ROOT.rglob("*.md") if ".venv" not in p.parts}
    missing = set()
    for folder in ("themis_mpi", "scripts", "tests"):
        for source in (ROOT / folder).rglob("*.py"):
            for cited in re.findall(r"[\w./-]*[\w-]+\.md\b", source.read_text()):
                if not (ROOT / cited).is_file() and Path(cited).name not in names:
                    missing.add(f"{source.relative_to(ROOT)}: {cited}")
    assert not missing, sorted(missing)


@pytest.mark.docs
def test_allreduce_study_regenerates(tmp_path):
    """The all-reduce study's documented command rewrites its shipped data, timings aside."""
    done = in_process(
        ["--out", tmp_path], main=script("study_allreduce").main
    )  # (its command, in this process)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    timings = ("wall_s", "decision_s")
    shipped_rows = json.loads((ROOT / "docs" / "study" / "study.json").read_text())
    new_rows = json.loads((tmp_path / "study.json").read_text())
    strip = [
        [{k: v for k, v in row.items() if k not in timings} for row in rows]
        for rows in (shipped_rows, new_rows)
    ]
    assert strip[0] == strip[1]
    untimed = [
        [line for line in text.splitlines() if not re.search(r"runs in [\d.]+ s", line)]
        for text in ((ROOT / "docs" / "study" / "study.md").read_text(), (tmp_path / "study.md").read_text())
    ]
    assert untimed[0] == untimed[1]
