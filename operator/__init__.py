"""harnessrl.operator: the control plane: API models (api/), the plan (plan/), manifests (kube/), the reconcilers
(handlers/) and the controller machinery they run on (control/). `harnessrl run` (harnessrl/local) realises the
same plan as local processes."""
