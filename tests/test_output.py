"""Rules for output files: complete or absent, checked before any work, symlinks and devices respected."""

import json
import os

import pytest
from harness import in_process

from themis_mpi.errors import UsageError
from themis_mpi.output import atomic_path, check_output_path, write_json


def themis(*args):
    """`themis-mpi ARGS` in this process."""
    return in_process(args)


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path):
    """An exception while writing keeps the previous complete file and removes the temporary."""
    path = tmp_path / "out.json"
    write_json(str(path), {"a": 1})
    with pytest.raises(RuntimeError), atomic_path(str(path)) as tmp:
        with open(tmp, "w") as f:
            f.write("{half")
        raise RuntimeError("disk full")
    assert json.loads(path.read_text()) == {"a": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["out.json"]


def test_writing_through_a_symlink_replaces_its_target_and_keeps_the_link(tmp_path):
    """A symlinked output path: the target gets the new content; the link stays a link."""
    target, link = tmp_path / "target.json", tmp_path / "link.json"
    target.write_text("old")
    link.symlink_to(target)
    write_json(str(link), [1, 2])
    assert link.is_symlink() and json.loads(target.read_text()) == [1, 2]


@pytest.mark.parametrize(
    "path,fragment",
    [
        ("/dev/null", "special filesystem"),
        ("/proc/self/x.json", "special filesystem"),
        ("{tmp}", "not a regular file"),
        ("{tmp}/no/such/dir/x.json", "no directory"),
        ("{tmp}/" + "x" * 250 + ".json", "too long"),
    ],
)
def test_bad_output_paths_are_refused_before_any_work(tmp_path, path, fragment):
    """Devices, special filesystems, directories, missing directories and over-long names get one line."""
    with pytest.raises(UsageError, match=fragment):
        check_output_path(path.format(tmp=tmp_path))


def test_the_cli_refuses_a_bad_json_path_before_running(tmp_path):
    """`model --json /dev/null`: exit 2 with one line, no table printed, /dev/null untouched."""
    proc = themis("model", "-t", "2x2x2", "--json", "/dev/null")
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "special filesystem" in proc.stderr
    assert "time_us" not in proc.stdout
    assert not os.path.isfile("/dev/null")


def test_export_refuses_to_overwrite_its_input(tmp_path):
    """`export t.h5 --perfetto t.h5` is refused and the trace stays readable."""
    trace = tmp_path / "t.h5"
    assert themis("model", "-t", "2x2x2", "-b", "1M", "-c", "4", "--trace", str(trace)).returncode == 0
    before = trace.read_bytes()
    proc = themis("export", str(trace), "--perfetto", str(trace))
    assert proc.returncode == 2 and "input of this command" in proc.stderr
    assert trace.read_bytes() == before


def test_json_to_standard_output():
    """`--json -` writes the rows to standard output after the table."""
    proc = themis("model", "-t", "2x2x2", "-b", "1M", "-p", "themis", "--json", "-")
    assert proc.returncode == 0
    rows = json.loads(proc.stdout[proc.stdout.index("[") :])
    assert rows[0]["policy"] == "themis" and rows[0]["size_bytes"] == 1 << 20
