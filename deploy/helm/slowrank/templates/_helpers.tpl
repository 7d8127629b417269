{{/*
The agent's image. "latest" is refused: the init container copies the
injection library that every training pod on the node loads. A digest, when
given, pins the image (repository:tag@sha256:...).
*/}}
{{- define "slowrank.image" -}}
{{- $tag := .Values.image.tag | default .Chart.AppVersion -}}
{{- if or (eq $tag "latest") (not $tag) -}}
{{- fail "image.tag must name a release (the chart refuses latest): set image.tag and image.digest" -}}
{{- end -}}
{{- with .Values.image.digest -}}
{{- if not (regexMatch "^sha256:[a-f0-9]{64}$" .) -}}
{{- fail (printf "image.digest must be sha256:<64 hex digits>, got %q" .) -}}
{{- end -}}
{{ $.Values.image.repository }}:{{ $tag }}@{{ . }}
{{- else -}}
{{ .Values.image.repository }}:{{ $tag }}
{{- end -}}
{{- end -}}

{{- define "slowrank.labels" -}}
app.kubernetes.io/name: slowrank-agent
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/*
The capabilities of the agent (agent/privilege/caps.go says why each is needed).
*/}}
{{- define "slowrank.capabilities" -}}
drop: [ALL]
add: [BPF, PERFMON, SYS_ADMIN, SYS_PTRACE, DAC_READ_SEARCH, DAC_OVERRIDE, CHECKPOINT_RESTORE{{ if .Values.legacyKernel }}, SYS_RESOURCE{{ end }}]
{{- end -}}
