"""`python -m themis_mpi` is the `themis-mpi` command.

The guard lets mpi4py.futures' workers import this module (as ``__worker__``) without running it.
"""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
