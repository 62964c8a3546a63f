"""The MPI side: the Cartesian grid, quiet waits with a watchdog, and the data-moving transport.

Only this package imports mpi4py; the model and everything before the first collective run
without MPI.
"""
