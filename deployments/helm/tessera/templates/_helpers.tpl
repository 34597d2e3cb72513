{{/* The prefix of every name the chart creates. */}}
{{- define "tessera.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- default "tessera" .Values.nameOverride | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "tessera.node.name" -}}{{ include "tessera.fullname" . }}-node{{- end -}}
{{- define "tessera.scheduler.name" -}}{{ include "tessera.fullname" . }}-scheduler{{- end -}}
{{- define "tessera.overview.name" -}}{{ include "tessera.fullname" . }}-overview{{- end -}}

{{/* Labels of every object. */}}
{{- define "tessera.labels" -}}
app.kubernetes.io/name: tessera
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* Selector labels of one component; call with (list $ "node"). */}}
{{- define "tessera.selectorLabels" -}}
{{- $root := index . 0 -}}
app.kubernetes.io/name: tessera
app.kubernetes.io/instance: {{ $root.Release.Name }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end -}}

{{/* The image of a component; call with (list $ .Values.node.image). */}}
{{- define "tessera.image" -}}
{{- $root := index . 0 -}}
{{- $o := index . 1 -}}
{{- $repo := default $root.Values.image.repository $o.repository -}}
{{- $digest := default $root.Values.image.digest $o.digest -}}
{{- if $digest -}}
{{- printf "%s@%s" $repo $digest -}}
{{- else -}}
{{- printf "%s:%s" $repo (default (default $root.Chart.AppVersion $root.Values.image.tag) $o.tag) -}}
{{- end -}}
{{- end -}}

{{/*
The namespace of the node-side pods (the node agents' DaemonSet and the MPS
daemon pods they create) and of their service account, config, Role and
metrics Service: node.namespace, else "<release namespace>-node". It is
apart from the release namespace so that the latter can enforce Pod Security
"restricted" while this one admits the privileged node agent.
*/}}
{{- define "tessera.node.namespace" -}}
{{- default (printf "%s-node" .Release.Namespace) .Values.node.namespace -}}
{{- end -}}

{{/* The service-account user names that RBAC and the admission policies name. */}}
{{- define "tessera.node.user" -}}
system:serviceaccount:{{ include "tessera.node.namespace" . }}:{{ include "tessera.node.name" . }}
{{- end -}}
{{- define "tessera.scheduler.user" -}}
system:serviceaccount:{{ .Release.Namespace }}:{{ include "tessera.scheduler.name" . }}
{{- end -}}

{{/*
Checks across values that values.schema.json cannot state with a clear
message. Every template includes it, so a bad combination fails the render.
*/}}
{{- define "tessera.validate" -}}
{{- $n := .Values.node -}}
{{- if and $n.enabled (not $n.devicePlugin.enabled) -}}
{{- $rules := list -}}
{{- with $n.partition.default }}{{ $rules = concat $rules (get . "gpus" | default list) }}{{ end -}}
{{- range $n.partition.nodes }}{{ $rules = concat $rules (get . "gpus" | default list) }}{{ end -}}
{{- range $rules -}}
{{- if eq .mode "devicePlugin" -}}
{{- fail "invalid values: node.partition puts GPUs in devicePlugin mode, which needs node.devicePlugin.enabled=true (the kubelet's device-plugin directory)" -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- if and (or .Values.prometheusRule.enabled .Values.grafanaDashboard.enabled) (not .Values.overview.enabled) -}}
{{- fail "invalid values: prometheusRule.enabled and grafanaDashboard.enabled need overview.enabled=true: the alerts and the dashboard read its tessera_cluster_* metrics" -}}
{{- end -}}
{{- $s := .Values.scheduler -}}
{{- if and $s.enabled (gt (int $s.replicas) 1) (not $s.leaderElection.enabled) -}}
{{- fail "invalid values: scheduler.replicas > 1 needs scheduler.leaderElection.enabled=true: two active schedulers would place the same pods" -}}
{{- end -}}
{{- if and $s.enabled $s.podDisruptionBudget.enabled (not $s.shadow.enabled) (ge (int $s.podDisruptionBudget.minAvailable) (int $s.replicas)) (gt (int $s.replicas) 0) -}}
{{- fail (printf "invalid values: scheduler.podDisruptionBudget.minAvailable (%d) must be below scheduler.replicas (%d), or no node running a scheduler could ever be drained" (int $s.podDisruptionBudget.minAvailable) (int $s.replicas)) -}}
{{- end -}}
{{- if and $n.enabled (gt (len (include "tessera.node.namespace" .)) 63) -}}
{{- fail (printf "invalid values: the node agents' namespace %q is longer than 63 characters (a namespace name is a DNS label); set node.namespace" (include "tessera.node.namespace" .)) -}}
{{- end -}}
{{- if and (eq $n.securityProfile "restricted") (not $n.runtimeClassName) -}}
{{- fail "invalid values: node.securityProfile=restricted needs node.runtimeClassName: an unprivileged container gets the GPUs only through the NVIDIA runtime" -}}
{{- end -}}
{{- $queues := dict -}}
{{- range .Values.exampleQueues.queues -}}
{{- if hasKey $queues .name -}}
{{- fail (printf "invalid values: exampleQueues.queues: queue %q is listed twice" .name) -}}
{{- end -}}
{{- $_ := set $queues .name true -}}
{{- end -}}
{{- $topologies := dict -}}
{{- range .Values.scheduler.topologies -}}
{{- if hasKey $topologies .name -}}
{{- fail (printf "invalid values: scheduler.topologies: topology %q is listed twice" .name) -}}
{{- end -}}
{{- $_ := set $topologies .name true -}}
{{- end -}}
{{- end -}}
