"""The package's error types: a user's mistake (a policy's among them), and a wait that nothing will end.

Anything raised as `UsageError` is reported by the CLI as a single line on rank 0 and ends every
rank with a non-zero exit code; `Stalled` ends an MPI job with exit 3 (`cli.app`); any other
exception is a bug and keeps its traceback.
"""

import math


class UsageError(Exception):
    """Bad input from the user: a wrong flag, a malformed topology, a rank-count mismatch."""


class PolicyError(UsageError):
    """A policy (usually a plugin) raised or returned something invalid; one line naming it."""


class Stalled(Exception):
    """Nothing can move: a peer rank died or stopped answering, or NPUs of a model wait for each other."""


SHOWN_CHARS = 60  # what an error line quotes of a long input


def shown(value: object) -> str:
    """A value as an error line quotes it: whole if short, else its start and its length.

    An int too long to print (``10**5000``; Python refuses its repr) is given by its digit count.
    """
    if isinstance(value, int) and value.bit_length() > 4 * SHOWN_CHARS:
        return f"an integer of about {int(value.bit_length() * math.log10(2)) + 1} digits"
    if isinstance(value, str):
        cut = f"{value[:SHOWN_CHARS]!r}"
        return repr(value) if len(value) <= SHOWN_CHARS else f"{cut}... ({len(value)} characters)"
    text = repr(value)
    return text if len(text) <= SHOWN_CHARS else f"{text[:SHOWN_CHARS]}... ({len(text)} characters)"
