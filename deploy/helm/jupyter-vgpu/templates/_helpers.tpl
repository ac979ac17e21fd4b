{{/*
The node image (node daemon, extender, MPS control daemon, init containers), tag from values.
*/}}
{{- define "jupyter-vgpu.nodeImage" -}}
{{ .Values.images.node.repository }}:{{ .Values.images.node.tag }}
{{- end -}}

{{/*
kube-scheduler: images.kubeScheduler.tag when set, else the release of tagsByMinor for the API
server's minor (.Capabilities: the cluster's at install, --kube-version for helm template).
Kubernetes' version-skew policy lets kube-scheduler be the API server's minor or one older,
never newer: a minor without an entry fails rather than run a scheduler of another version.
*/}}
{{- define "jupyter-vgpu.kubeSchedulerImage" -}}
{{- $scheduler := .Values.images.kubeScheduler -}}
{{- $tag := $scheduler.tag -}}
{{- if not $tag -}}
{{- $minor := printf "%s.%s" .Capabilities.KubeVersion.Major (regexReplaceAll "[^0-9]+$" .Capabilities.KubeVersion.Minor "") -}}
{{- $tag = get $scheduler.tagsByMinor $minor -}}
{{- if not $tag -}}
{{- fail (printf "images.kubeScheduler: no kube-scheduler release for Kubernetes %s (images.kubeScheduler.tagsByMinor has %s): set images.kubeScheduler.tag to the newest patch of your API server's minor, e.g. v%s.0" $minor (keys $scheduler.tagsByMinor | sortAlpha | join ", ") $minor) -}}
{{- end -}}
{{- end -}}
{{ $scheduler.repository }}:{{ $tag }}
{{- end -}}
