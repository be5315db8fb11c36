{{/* Names, labels and the image, shared by every template. */}}

{{- define "outbox.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "outbox.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* The operator pods' selector: component=controller keeps it apart from the worker pods
     the operator creates (component=worker, instance=<dispatcher>). */}}
{{- define "outbox.selectorLabels" -}}
app.kubernetes.io/name: {{ include "outbox.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: controller
{{- end }}

{{- define "outbox.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "outbox.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: outbox-dispatcher
{{- end }}

{{- define "outbox.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "outbox.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "outbox.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{/* A duration of values.schema.json's form (500ms, 1.5s, 10m, 1h) in seconds, as text. */}}
{{- define "outbox.seconds" -}}
{{- $text := toString . -}}
{{- $number := regexFind "^[0-9]+(\\.[0-9]+)?" $text -}}
{{- $unit := trimPrefix $number $text -}}
{{- mulf (float64 $number) (get (dict "ms" 0.001 "s" 1.0 "m" 60.0 "h" 3600.0) $unit) -}}
{{- end }}

{{/* leaseDuration > renewDeadline > retryPeriod, as the operator requires (it exits at start
     otherwise): a leader must stop acting before a standby may take its Lease, and must try
     to renew more than once before it gives up. Refused at render, not in a crash loop. */}}
{{- define "outbox.checkLeaderElection" -}}
{{- $le := .Values.leaderElection -}}
{{- $lease := include "outbox.seconds" $le.leaseDuration | float64 -}}
{{- $renew := include "outbox.seconds" $le.renewDeadline | float64 -}}
{{- $retry := include "outbox.seconds" $le.retryPeriod | float64 -}}
{{- if not (gt $lease $renew) }}
{{- fail (printf "leaderElection.renewDeadline (%s) must be shorter than leaderElection.leaseDuration (%s): a leader must stop acting before a standby may take its Lease" $le.renewDeadline $le.leaseDuration) }}
{{- end }}
{{- if not (gt $retry 0.0) }}
{{- fail (printf "leaderElection.retryPeriod (%s) must be greater than zero" $le.retryPeriod) }}
{{- end }}
{{- if not (gt $renew $retry) }}
{{- fail (printf "leaderElection.retryPeriod (%s) must be shorter than leaderElection.renewDeadline (%s): the leader renews every retryPeriod and gives up after renewDeadline" $le.retryPeriod $le.renewDeadline) }}
{{- end }}
{{- end }}

{{/* The permissions the operator uses on the namespaces it serves, and no others:
     it watches OutboxDispatchers and writes their status, keeps one worker Deployment per
     resource (read, create, replace; resized through the scale subresource only), keeps the
     worker pods' NetworkPolicy (when networkPolicy.workers is on), reads the DSN's Secret,
     and records Events. kopf's own posting and its namespace/CRD scanning are off, so it
     needs none. */}}
{{- define "outbox.servedRules" -}}
- apiGroups: [outbox.dev]
  resources: [outboxdispatchers]
  verbs: [list, watch]
- apiGroups: [outbox.dev]
  resources: [outboxdispatchers/status]
  verbs: [patch]
- apiGroups: [apps]
  resources: [deployments]
  verbs: [get, list, watch, create, update]
- apiGroups: [apps]
  resources: [deployments/scale]
  verbs: [patch]
{{- if .Values.networkPolicy.workers.enabled }}
- apiGroups: [networking.k8s.io]
  resources: [networkpolicies]
  verbs: [get, create, update]
{{- end }}
- apiGroups: [policy]
  resources: [poddisruptionbudgets]
  verbs: [get, create, update]
- apiGroups: [""]
  resources: [secrets]
  verbs: [get]
- apiGroups: [""]
  resources: [pods]
  verbs: [list]
- apiGroups: [""]
  resources: [events]
  verbs: [create]
{{- end }}
