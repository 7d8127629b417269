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

{{/*
Where the agents forward their facts (forward.address; docs/deploy.md
section 6): "off" none; an address as given; "" this release's aggregator
Service when aggregator.enabled with one replica (grpcs:// with its TLS).
None when extraArgs set --aggregator themselves (the values of releases
from before forward), and none by default where the Service cannot work:
several replicas (one job must reach one aggregator: the loadbalancing
collector's address is needed) or client certificates the agents lack.
*/}}
{{- define "slowrank.forwardAddress" -}}
{{- $f := .Values.forward -}}
{{- $a := .Values.aggregator -}}
{{- $own := false -}}
{{- range .Values.extraArgs -}}
{{- if hasPrefix "--aggregator" (toString .) -}}{{- $own = true -}}{{- end -}}
{{- end -}}
{{- if or $own (eq $f.address "off") -}}
{{- else if $f.address -}}
{{ $f.address }}
{{- else if and $a.enabled (eq (int $a.replicas) 1) (not $a.tls.requireClientCerts) -}}
{{ ternary "grpcs" "grpc" (not (empty $a.tls.secretName)) }}://{{ .Release.Name }}-aggregator.{{ .Release.Namespace }}.svc:{{ $a.port }}
{{- end -}}
{{- end -}}

{{/*
The Secret of the agents' bearer token: forward.token, else, forwarding to
this release's aggregator, aggregator.token.
*/}}
{{- define "slowrank.forwardToken" -}}
{{- if .Values.forward.token.secretName -}}
{{ .Values.forward.token.secretName }}/{{ .Values.forward.token.key }}
{{- else if and (not .Values.forward.address) .Values.aggregator.token.secretName -}}
{{ .Values.aggregator.token.secretName }}/{{ .Values.aggregator.token.key }}
{{- end -}}
{{- end -}}

{{/*
The Secret of the CA that verifies a TLS aggregator (forward.ca; none: the
system's CAs). Not taken from aggregator.tls by default: a missing ca.crt
key there would keep every agent pod from starting.
*/}}
{{- define "slowrank.forwardCA" -}}
{{- with .Values.forward.ca.secretName -}}
{{ . }}/{{ $.Values.forward.ca.key }}
{{- end -}}
{{- end -}}
