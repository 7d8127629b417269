{{- define "slowrank.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{- define "slowrank.labels" -}}
app.kubernetes.io/name: slowrank-agent
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}
