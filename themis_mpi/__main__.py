"""`python -m themis_mpi` is the `themis-mpi` command."""

import sys

from .cli import main

sys.exit(main())
