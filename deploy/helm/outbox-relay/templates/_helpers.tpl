{{- define "outbox-relay.name" -}}
{{- default .Release.Name .Values.relay.name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "outbox-relay.labels" -}}
app.kubernetes.io/name: outbox-relay
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "outbox-relay.selector" -}}
app.kubernetes.io/name: outbox-relay
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}
