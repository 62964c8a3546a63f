"""The one exception type for user mistakes.

Anything raised as `UsageError` is reported by the CLI as a single line on rank 0 and ends every
rank with a non-zero exit code; any other exception is a bug and keeps its traceback.
"""


class UsageError(Exception):
    """Bad input from the user: a wrong flag, a malformed topology, a rank-count mismatch."""
