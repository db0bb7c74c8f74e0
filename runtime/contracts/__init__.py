"""Every cross-process wire contract, with its typed client: components (harness, learner, proxy, evaluation)
and the operator import each other only through this package.

- coordinator: coordinator <-> runner HTTP (leases, completions) and the status the coordinator serves.
- proxy: the capture proxy's admin API (sessions, sequences, policy).
- status: the coordinator's status as its readers (the operator, the live view) fetch it.
"""
