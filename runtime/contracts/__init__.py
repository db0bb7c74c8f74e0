"""Every cross-process wire contract, with its typed client: components (harness, learner, proxy, evaluation)
and the operator import each other only through this package.

- coordinator: coordinator <-> runner HTTP (leases, completions) and the status the coordinator serves;
  CoordinatorClient.
- proxy: the capture proxy's admin API (sessions, sequences, policy); ProxyClient.
- status: the coordinator's status as its readers (the operator, the live view) fetch it.
- client: what the clients share (the bearer header, a reply read into its model).
"""
