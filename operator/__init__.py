"""harnessrl.operator: the control plane (API models, plan, manifests, kopf handlers, local runner)."""
