{{- define "harnessrl.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "harnessrl.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end -}}

{{- define "harnessrl.labels" -}}
{{ include "harnessrl.selectorLabels" . }}
app.kubernetes.io/part-of: harnessrl
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "harnessrl.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "harnessrl.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* Namespaces watched when not cluster-wide: the listed ones, or the release namespace. */}}
{{- define "harnessrl.watchedNamespaces" -}}
{{- if .Values.watch.namespaces -}}
{{- join "," .Values.watch.namespaces -}}
{{- else -}}
{{- .Release.Namespace -}}
{{- end -}}
{{- end -}}

{{/* What the operator does in a watched namespace: its kinds, and the children it creates for them. */}}
{{- define "harnessrl.namespacedRules" -}}
- apiGroups: [harnessrl.io]
  resources: [trainingruns, harnesspools, enginepools]
  verbs: [get, list, watch, patch, update, delete]
- apiGroups: [harnessrl.io]
  resources: [trainingruns/status, harnesspools/status, harnesspools/scale, enginepools/status]
  verbs: [get, patch, update]
# Every child's ownerReference to its run (or EnginePool) sets blockOwnerDeletion: where
# OwnerReferencesPermissionEnforcement is on (OpenShift), that takes update on the owner's finalizers (and delete
# on the owner, above).
- apiGroups: [harnessrl.io]
  resources: [trainingruns/finalizers, enginepools/finalizers]
  verbs: [update]
- apiGroups: [""]
  resources: [configmaps, services, serviceaccounts, persistentvolumeclaims]
  verbs: [get, list, watch, create, patch, update, delete]
# Secrets: only the run's generated tokens, read by name (no list or watch: that would read every Secret).
- apiGroups: [""]
  resources: [secrets]
  verbs: [get, create, patch, delete]
# Pods: read only, to surface image-pull / scheduling / crash-loop trouble.
- apiGroups: [""]
  resources: [pods]
  verbs: [get, list, watch]
- apiGroups: ["", events.k8s.io]
  resources: [events]
  verbs: [create, patch]
- apiGroups: [apps]
  resources: [statefulsets, deployments]
  verbs: [get, list, watch, create, patch, update, delete]
- apiGroups: [batch]
  resources: [jobs]
  verbs: [get, list, watch, create, patch, update, delete]
# A multi-node learner (learner.nodes > 1) is a JobSet (kubernetes-sigs/jobset).
- apiGroups: [jobset.x-k8s.io]
  resources: [jobsets]
  verbs: [get, list, watch, create, patch, update, delete]
# A run with spec.queueName is one Kueue Workload: the operator writes its status as Kueue's job framework does
# (gives back an evicted run's quota once its Pods are gone; marks a finished run Finished).
- apiGroups: [kueue.x-k8s.io]
  resources: [workloads]
  verbs: [get, list, watch, create, patch, update, delete]
- apiGroups: [kueue.x-k8s.io]
  resources: [workloads/status]
  verbs: [get, patch, update]
- apiGroups: [networking.k8s.io]
  resources: [networkpolicies]
  verbs: [get, list, watch, create, patch, update, delete]
# Runners of a kubernetes-sandbox pool get the sandbox ClusterRole through a RoleBinding: the operator may bind
# that one ClusterRole, without holding its rules (no Pod creation, no exec).
- apiGroups: [rbac.authorization.k8s.io]
  resources: [rolebindings]
  verbs: [get, list, watch, create, patch, update, delete]
- apiGroups: [rbac.authorization.k8s.io]
  resources: [clusterroles]
  verbs: [bind]
  resourceNames: [harnessrl-sandbox]
{{- end -}}
