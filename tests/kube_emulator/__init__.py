"""A Kubernetes API emulator for tests: kmock's HTTP server and Kubernetes scaffold plus a stateful shim.

kopf and the official `kubernetes` client talk to it over real HTTP on 127.0.0.1 as to an API server.
Use it through the `kube_api` fixture (tests/fixtures/kube.py); `EmulatorThread` runs one directly.

Why kmock plus a shim, and where the line is: kmock 0.8 gives the HTTP server (`kmock.Server`), the request
log and DSL (tests can inject faults: `kube_api.emulator['get /api/v1/pods'] << 500`), and Status error
rendering (`kmock.KubernetesScaffold`). Its own `KubernetesEmulator` is too shallow to build on (objects are
plain dicts merged on every write: no uid, resourceVersion or generation; watch ignores resourceVersion;
no selectors, no garbage collection, no subresources), and its path parser fails on `/api/v1/namespaces`
and misreads `/api/v1/namespaces/NAME`. So the shim subclasses the scaffold, parses paths itself
(`routing.py`), and answers every Kubernetes path from one low-priority kmock reaction backed by `Store`.

What it emulates: discovery (/api, /apis, group versions, /version); the built-in kinds in `resources.py`
and every served version of applied CRDs; create/get/list/update/patch/delete with uid, a global
monotonic resourceVersion, generation (bumped on spec changes only), creationTimestamp; status and scale
subresources; merge, JSON (with `test`) and strategic-merge patches; server-side apply as create-or-merge;
optimistic concurrency (409); watch with resume from a resourceVersion, 410 Gone once history is
compacted, initial-events bookmarks, timeoutSeconds; label and field selectors on list and watch (objects
entering/leaving a selector are ADDED/DELETED); finalizers and deletionTimestamp; ownerReference garbage
collection (Background, Foreground approximated, Orphan); namespace termination; CRD schema pruning,
defaulting and validation, and `x-kubernetes-validations` CEL rules (incl. transition rules with oldSelf,
messageExpression), answered with the API server's 422 messages.

What it does NOT emulate:
- no controllers besides GC and namespace/CRD cleanup: nothing creates Pods for Deployments, StatefulSets or
  Jobs, no scheduler or kubelet (pods stay without status), no Service endpoints, no workload status — tests
  write status themselves;
- no authentication or authorization (any token is accepted; RBAC objects are stored, never enforced), no
  admission webhooks, no ValidatingAdmissionPolicy, no ResourceQuota/LimitRange;
- no validation or defaulting of built-in kinds beyond metadata.name, the immutable fields in `builtins.py`,
  Pod/PVC Pending status, Service ClusterIPs and Secret stringData (validate manifests with kubernetes-validate);
- CRD versions share storage with no conversion (only apiVersion is rewritten); no `format` checks;
  CEL cost limits are not checked; list items of non-map lists get no oldSelf;
- server-side apply has no field ownership, conflicts or removal of fields dropped from the applied config;
- no dryRun (400), no `resourceVersionMatch=Exact` lists of old states (lists are always current),
  no /watch/ legacy paths, no protobuf, no tables (`Accept: ...;as=Table`), no pod logs/exec/port-forward;
- garbage collection and namespace cleanup run synchronously inside the delete request;
- deleting a CRD removes its objects at once, even those with finalizers;
- gracePeriodSeconds is ignored (deletion is immediate unless finalizers remain).
"""

from .client import KubeApiError, load_manifests
from .server import KubeEmulator
from .store import Store
from .thread import EmulatorThread

__all__ = ["EmulatorThread", "KubeApiError", "KubeEmulator", "Store", "load_manifests"]
