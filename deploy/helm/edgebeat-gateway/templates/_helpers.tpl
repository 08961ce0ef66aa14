{{/*
Labels of every object: those deploy/'s kustomize bases give (name, part-of), and Helm's
own (chart, release, manager). Object names are fixed, as in deploy/: one release per
cluster (its ClusterRoles are cluster-wide).
*/}}
{{- define "edgebeat.labels" -}}
app.kubernetes.io/name: edgebeat-gateway
app.kubernetes.io/part-of: edgebeat
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{/* The ServiceAccount as an RBAC subject. */}}
{{- define "edgebeat.subject" -}}
subjects:
  - kind: ServiceAccount
    name: edgebeat-gateway
    namespace: {{ .Release.Namespace }}
{{- end -}}

{{/* Whether the gateway keeps the site CA itself (enrollment). */}}
{{- define "edgebeat.ownCA" -}}
{{- if .Values.enrollment.enabled }}true{{ end -}}
{{- end -}}

{{/* Nodes per replica: the value, else sized per transport (BENCHMARKS.md). */}}
{{- define "edgebeat.maxNodes" -}}
{{- if .Values.maxNodes }}{{ .Values.maxNodes }}{{ else if .Values.grpc.enabled }}8000{{ else }}10000{{ end -}}
{{- end -}}
