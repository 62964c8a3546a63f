"""The package's error types: a user's mistake (a policy's among them), and a wait that nothing will end.

Anything raised as `UsageError` is reported by the CLI as a single line on rank 0 and ends every
rank with a non-zero exit code; `Stalled` ends an MPI job with exit 3 (`cli.app`); any other
exception is a bug and keeps its traceback.
"""


class UsageError(Exception):
    """Bad input from the user: a wrong flag, a malformed topology, a rank-count mismatch."""


class PolicyError(UsageError):
    """A policy (usually a plugin) raised or returned something invalid; one line naming it."""


class Stalled(Exception):
    """Nothing can move: a peer rank died or stopped answering, or NPUs of a model wait for each other."""
