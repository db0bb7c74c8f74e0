"""The controller machinery the reconcilers (operator/handlers) run on, none of it about harnessrl's resources:
create-or-patch of children (apply.py), a watched cache of them (cache.py), the reconcile queue (queue.py),
retry delays after a refusal (backoff.py) and leader election (leader.py). It never imports the handlers."""
