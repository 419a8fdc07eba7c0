{{/* Chart name, bounded to 63 characters. */}}
{{- define "schedlock.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Fully qualified release name. */}}
{{- define "schedlock.fullname" -}}
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

{{/* "<fullname>-<suffix>", the prefix cut so the result stays a DNS label (63). */}}
{{- define "schedlock.suffixed" -}}
{{- $ctx := index . 0 }}{{ $suffix := index . 1 }}
{{- $prefix := include "schedlock.fullname" $ctx | trunc (int (sub 62 (len $suffix))) | trimSuffix "-" }}
{{- printf "%s-%s" $prefix $suffix }}
{{- end }}

{{/* The operator's Deployment, Service and ClusterRole(Binding) name. */}}
{{- define "schedlock.operatorName" -}}
{{- include "schedlock.suffixed" (list . "operator") }}
{{- end }}

{{/* Secret holding the webhook's serving certificate (self-managed or cert-manager's). */}}
{{- define "schedlock.webhookTLSSecret" -}}
{{- include "schedlock.suffixed" (list . "webhook-tls") }}
{{- end }}

{{/* Recommended labels (app.kubernetes.io/*). */}}
{{- define "schedlock.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "schedlock.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: schedlock
{{- end }}

{{- define "schedlock.selectorLabels" -}}
app.kubernetes.io/name: {{ include "schedlock.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* Labels of the operator's objects; its pods are selected by these. */}}
{{- define "schedlock.operatorSelectorLabels" -}}
{{ include "schedlock.selectorLabels" . }}
app.kubernetes.io/component: operator
{{- end }}

{{- define "schedlock.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "schedlock.operatorName" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* repository:tag, or repository@digest when a digest is given. */}}
{{- define "schedlock.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{/* The injected sidecars' image: injection.sidecar.image, each part defaulting to the
operator's (the repository with "-sidecar" appended: the Dockerfile's schedlock-sidecar target). */}}
{{- define "schedlock.sidecarImage" -}}
{{- $image := .Values.injection.sidecar.image }}
{{- $repository := default (printf "%s-sidecar" .Values.image.repository) $image.repository }}
{{- if $image.digest }}
{{- printf "%s@%s" $repository $image.digest }}
{{- else }}
{{- printf "%s:%s" $repository (default (default .Chart.AppVersion .Values.image.tag) $image.tag) }}
{{- end }}
{{- end }}

{{/* The operator serves HTTPS admission (validation and/or injection): "true" or "". */}}
{{- define "schedlock.webhooksOn" -}}
{{- if or .Values.webhook.enabled .Values.injection.enabled }}true{{ end }}
{{- end }}

{{/* Name and key of the Secret holding the operator's database URL. */}}
{{- define "schedlock.databaseSecret" -}}
{{- if .Values.database.url }}
{{- include "schedlock.suffixed" (list . "database") }}
{{- else }}
{{- required "database.existingSecret (or database.url) is required" .Values.database.existingSecret }}
{{- end }}
{{- end }}

{{/*
Render the Prometheus-operator objects: "true" when monitoring.coreos.com/v1 is served, or
when monitoring.forceRender says so (helm template knows no cluster).
*/}}
{{- define "schedlock.monitoringAPI" -}}
{{- if or .Values.monitoring.forceRender (.Capabilities.APIVersions.Has "monitoring.coreos.com/v1") }}true{{ end }}
{{- end }}

{{/* A chart file that must exist (the monitoring files are generated); fails with a hint. */}}
{{- define "schedlock.requiredFile" -}}
{{- $ctx := index . 0 }}{{ $path := index . 1 }}
{{- $content := $ctx.Files.Get $path }}
{{- if not $content }}
{{- fail (printf "%s is missing from the chart (it is generated; see docs/install.md)" $path) }}
{{- end }}
{{- $content }}
{{- end }}
