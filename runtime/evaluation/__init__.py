"""The standalone evaluation (`harnessrl eval`): pass@1 of one policy under each harness pool, served to unmodified
runners by the coordinator core (runtime/coordinator) over the same lease/complete protocol as training; the
matrix of checkpoints (matrix.py) and their paired comparisons on the same tasks (paired.py)."""
