"""Rules for plugins as untrusted code: a plugin that exits or meddles is an error of one line, exit 2.

Each plugin is installed alone into its own temporary site directory (as pip lays it out), so
that one that breaks on import breaks only its own test.
"""

import json

import pytest
from harness import at_once, cli, local
from test_plugins import install

EXITS_IN_ORDER = """
import sys
from themis_mpi.policies import InterPolicy


class Quitter(InterPolicy):
    name = "quitter"
    description = "calls sys.exit(0) while choosing"

    def order(self, chunk):
        sys.exit(0)
"""

EXITS_IN_INIT = EXITS_IN_ORDER.replace(
    "def order(self, chunk):", "def __init__(self):\n        sys.exit(0)\n\n    def order(self, chunk):"
)

EXITS_ON_IMPORT = "import sys\nsys.exit(0)\n"

MUTATES_QUEUE = """
from themis_mpi.policies import IntraPolicy


class Thief(IntraPolicy):
    name = "thief"
    description = "takes a stage out of the queue it is shown"

    def position(self, queue, stage):
        if queue.waiting:
            queue.waiting.pop()
        return 0
"""


@pytest.fixture
def plugin(tmp_path, monkeypatch):
    """Install one plugin module (source, entry-point line) and put it on PYTHONPATH."""

    def put(module: str, source: str, entry: str) -> None:
        install(tmp_path, f"{module}-dist", module, source, entry)
        monkeypatch.setenv("PYTHONPATH", str(tmp_path))

    return put


def one_line(proc, *words):
    assert proc.returncode == 2, (proc.returncode, proc.stdout[-500:], proc.stderr)
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr, proc.stderr
    for word in words:
        assert word in proc.stderr, proc.stderr


@pytest.mark.parametrize(
    ("source", "where"), [(EXITS_IN_ORDER, "raised SystemExit"), (EXITS_IN_INIT, "failed to start")]
)
def test_a_policy_that_calls_sys_exit_is_an_error_not_a_quiet_exit_0(plugin, source, where):
    """sys.exit(0) in a plugin's constructor or in `order` ends the run with exit 2 and one line naming it."""
    plugin("quitter_policy", source, 'quitter = "quitter_policy:Quitter"')
    one_line(local(["model", "-b", "1M", "-c", "4", "-p", "quitter", "-q"]), "quitter", where)


def test_a_plugin_module_that_exits_on_import_is_named(plugin):
    """A plugin module that calls sys.exit on import makes `policies` fail with one line, not exit 0."""
    plugin("exits_policy", EXITS_ON_IMPORT, 'exits = "exits_policy:Nothing"')
    one_line(local(["policies"]), "exits", "failed to load")


def test_an_intra_policy_that_changes_its_queue_is_stopped(plugin):
    """An intra-dim plugin that pops a stage from the queue it is shown: one line, not an IndexError."""
    plugin("thief_policy", MUTATES_QUEUE, 'thief = "thief_policy:Thief"')
    one_line(
        local(["model", "-b", "1M", "-c", "16", "-p", "themis", "--intra", "thief", "-q"]),
        "thief",
        "changed the queue",
    )


SLOW = """
import time
from themis_mpi.policies import InterPolicy


class Slow(InterPolicy):
    name = "slow"
    description = "thinks for 4 s before its first order"

    def order(self, chunk):
        if chunk.index == 0:
            time.sleep(4)
        return [0]  # (a one-dim topology)
"""


def installed(tmp_path_factory, module: str, source: str, entry: str):
    """A site folder of its own holding one plugin module (source, entry-point line)."""
    site = tmp_path_factory.mktemp(module)
    install(site, f"{module}-dist", module, source, entry)
    return site


def thinks_slowly(tmp_path_factory):
    """The slow policy on 4 ranks with --timeout-s 1: the job and its rows' path."""
    site = installed(tmp_path_factory, "slow_policy", SLOW, 'slow = "slow_policy:Slow"')
    out = site / "rows.json"
    proc = cli(4, ["run", "-t", "Ring(4,100,20)", "-b", "1M", "-c", "4", "-p", "slow", "-n", "1", "-w", "0",
                   "--timeout-s", "1", "--json", str(out)], timeout_s=120, site=site)  # fmt: skip
    return proc, out


def test_a_policy_that_thinks_longer_than_the_timeout_is_not_taken_for_dead(request, waits):
    """Rank 0 deciding for 4 s with --timeout-s 1 answers the others' pings: the run ends right, not aborted."""
    proc, out = waits[request.node.name].result()
    assert proc.returncode == 0, proc.stderr
    (row,) = json.loads(out.read_text())
    assert row["policy"] == "slow" and row["wrong"] == 0 and row["decision_s"] >= 4


STUCK = SLOW.replace('name = "slow"', 'name = "stuck"').replace("time.sleep(4)", "time.sleep(3600)")


def stuck_on_the_model(tmp_path_factory):
    """`model -p stuck --timeout-s 1`, its plugin never returning."""
    site = installed(tmp_path_factory, "stuck_policy", STUCK, 'stuck = "stuck_policy:Slow"')
    return local(["model", "-t", "Ring(4,100,20)", "-b", "1M", "-c", "4", "-p", "stuck", "--timeout-s", "1", "-q"],
                 timeout_s=60, site=site)  # fmt: skip


def test_a_plugin_that_never_returns_on_the_model_is_ended_by_the_timeout(request, waits):
    """`model -p stuck --timeout-s 1`: one line naming the plugin and exit 3 within seconds, not a hang."""
    proc = waits[request.node.name].result()
    assert proc.returncode == 3, proc.stderr
    assert proc.stderr.count("\n") == 1 and "policy 'stuck'" in proc.stderr and "--timeout-s" in proc.stderr


STUCK_INTRA = """
import time
from themis_mpi.policies import IntraPolicy


class Stuck(IntraPolicy):
    name = "stuck_intra"
    description = "never places its fifth stage"

    def __init__(self):
        self.calls = 0

    def position(self, queue, stage):
        self.calls += 1
        if self.calls == 5:
            time.sleep(3600)
        return len(queue.waiting)
"""


def stuck_intra_on_the_model(tmp_path_factory):
    """`model --intra stuck_intra --timeout-s 1`, its plugin never placing its fifth stage."""
    site = installed(
        tmp_path_factory, "stuck_intra_policy", STUCK_INTRA, 'stuck_intra = "stuck_intra_policy:Stuck"'
    )
    return local(["model", "-t", "Ring(4,100,20)", "-b", "1M", "-c", "8", "-p", "themis", "--intra", "stuck_intra",
                  "--timeout-s", "1", "-q"], timeout_s=60, site=site)  # fmt: skip


def test_an_intra_plugin_that_never_returns_on_the_model_is_ended_by_the_timeout(request, waits):
    """`model --intra stuck_intra --timeout-s 1`: one line naming the intra plugin and exit 3, not a hang."""
    proc = waits[request.node.name].result()
    assert proc.returncode == 3, proc.stderr
    assert proc.stderr.count("\n") == 1 and "'stuck_intra'" in proc.stderr and "--timeout-s" in proc.stderr


HOSTILE_SCHEDULERS = """
import os
import time
from themis_mpi.policies import CommScheduler


class Stuck(CommScheduler):
    name = "stuck_sched"
    description = "never answers its third priority"

    def __init__(self):
        self.calls = 0

    def priority(self, coll_id, need, collective):
        self.calls += 1
        if self.calls == 3:
            time.sleep(3600)
        return coll_id


class PerRank(CommScheduler):
    name = "per_rank"
    description = "priorities that differ between ranks"

    def priority(self, coll_id, need, collective):
        rank = int(os.environ.get("PMI_RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "0")))
        return -coll_id if rank % 2 else coll_id
"""

MICRO = "DATA\n2\nconv1 -1 5000 NONE 0 5000 NONE 0 5000 ALLREDUCE 1048576 5\nfc -1 5000 NONE 0 5000 NONE 0 5000 ALLREDUCE 4194304 5\n"


def under_a_scheduler(tmp_path_factory, name: str, timeout_s: int):
    """A two-layer training on 4 ranks under the hostile scheduler `name` (installed with the other)."""
    site = tmp_path_factory.mktemp(name)
    install(site, "hostile-sched", "hostile_sched", HOSTILE_SCHEDULERS, "")
    info = next(site.glob("*.dist-info"))
    entries = "stuck_sched = hostile_sched:Stuck\nper_rank = hostile_sched:PerRank\n"
    (info / "entry_points.txt").write_text(f"[themis_mpi.schedulers]\n{entries}")
    micro = site / "micro.txt"
    micro.write_text(MICRO)
    args = ["train", str(micro), "-t", "2x2", "-n", "2", "-c", "4", "--active-chunks-per-dim", "2"]
    return cli(4, [*args, "--comm-scheduler", name, "--timeout-s", str(timeout_s)], timeout_s=60, site=site)


@pytest.fixture(scope="module")
def waits(request, tmp_path_factory) -> dict:
    """The module's runs that wait for a plugin (a sleep, a timeout), at once (`harness.at_once`)."""
    return at_once(
        request,
        {
            "test_a_policy_that_thinks_longer_than_the_timeout_is_not_taken_for_dead": lambda: thinks_slowly(
                tmp_path_factory
            ),
            "test_a_plugin_that_never_returns_on_the_model_is_ended_by_the_timeout": lambda: (
                stuck_on_the_model(tmp_path_factory)
            ),
            "test_an_intra_plugin_that_never_returns_on_the_model_is_ended_by_the_timeout": lambda: (
                stuck_intra_on_the_model(tmp_path_factory)
            ),
            "test_a_scheduler_plugin_that_never_returns_under_mpi_ends_the_job_at_the_timeout": lambda: (
                under_a_scheduler(tmp_path_factory, "stuck_sched", 2)
            ),
            "test_priorities_that_differ_between_ranks_are_named_under_mpi": lambda: under_a_scheduler(
                tmp_path_factory, "per_rank", 5
            ),
        },
    )


def test_a_scheduler_plugin_that_never_returns_under_mpi_ends_the_job_at_the_timeout(request, waits):
    """Every rank runs the scheduler, so no rank's watchdog saw it hang: the plugin watchdog ends the job, exit 3."""
    proc = waits[request.node.name].result()
    assert proc.returncode == 3, proc.stderr
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("themis-mpi: error")]
    assert len(errors) == 1 and "'stuck_sched' did not answer within 2 s (--timeout-s)" in errors[0], (
        proc.stderr
    )


def test_priorities_that_differ_between_ranks_are_named_under_mpi(request, waits):
    """Ranks that order their stages differently meet other stages' messages: the line names the plugin."""
    proc = waits[request.node.name].result()
    assert proc.returncode == 3, proc.stderr
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("themis-mpi: error")]
    assert len(errors) == 1, proc.stderr
    assert "ranks started different stages" in errors[0] and "--comm-scheduler per_rank" in errors[0]
