{{/*
The manifests are config/'s own files (files/ links to config/base, config/controller, config/agent,
config/autoscaler and config/cluster-autoscaler/cloud-provider): this chart chooses and adjusts them, it keeps no
second copy. tests/test_chart.py renders the default values and compares every object with
`kubectl kustomize config/default`.
*/}}

{{- define "qos.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{- define "qos.schedulerImage" -}}
{{ .Values.schedulerImage.repository }}:{{ .Values.schedulerImage.tag }}
{{- end -}}

{{/* What kustomize's labels: adds to every object (each kustomization.yaml of config), plus Helm's own. */}}
{{- define "qos.labels" -}}
app.kubernetes.io/part-of: kube-qos-extender
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/instance: {{ .Release.Name }}
helm.sh/chart: {{ .Chart.Name }}-{{ .Chart.Version | replace "+" "_" }}
{{- end -}}

{{/*
qos.load (list $ "files/base/rbac.yaml"): the objects of one config/ file as a JSON list, with the image
placeholders replaced as kustomize's `images:` does (`image: kube-qos-extender`, `image: kube-scheduler`) and the
labels above added. A missing file or a document that is not YAML fails the render, naming the file.
*/}}
{{- define "qos.load" -}}
{{- $root := index . 0 -}}
{{- $path := index . 1 -}}
{{- $raw := $root.Files.Get $path -}}
{{- if not $raw -}}
{{- fail (printf "kube-qos-extender chart: %s is missing or empty (files/ links into config/)" $path) -}}
{{- end -}}
{{- $raw = regexReplaceAll "(?m)^(\\s*(?:- )?image:) kube-qos-extender\\s*$" $raw (printf "${1} %s" (include "qos.image" $root)) -}}
{{- $raw = regexReplaceAll "(?m)^(\\s*(?:- )?image:) kube-scheduler\\s*$" $raw (printf "${1} %s" (include "qos.schedulerImage" $root)) -}}
{{- $labels := include "qos.labels" $root | fromYaml -}}
{{- $docs := list -}}
{{- range $part := regexSplit "(?m)^---[ \\t]*$" $raw -1 -}}
{{- $d := fromYaml $part -}}
{{- if hasKey $d "Error" -}}
{{- fail (printf "kube-qos-extender chart: %s: %s" $path $d.Error) -}}
{{- end -}}
{{- if hasKey $d "kind" -}}
{{- $meta := $d.metadata -}}
{{- $_ := set $meta "labels" (merge (default (dict) $meta.labels) $labels) -}}
{{- $docs = append $docs $d -}}
{{- end -}}
{{- end -}}
{{- toJson $docs -}}
{{- end -}}

{{/* qos.emit (list $ "files/x.yaml" (list "Kind" ...)): the objects of a file, those of the listed kinds left out. */}}
{{- define "qos.emit" -}}
{{- $root := index . 0 -}}
{{- $skip := index . 2 -}}
{{- range $d := include "qos.load" (list $root (index . 1)) | fromJsonArray -}}
{{- if not (has $d.kind $skip) }}
---
{{ toYaml $d }}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* Kinds of prometheus-operator left out: when monitoring says so, and each one the cluster does not serve (no
prometheus-operator CRDs: `helm install` with default values works on a bare cluster; `helm template` renders them
only with `--api-versions monitoring.coreos.com/v1/ServiceMonitor` etc.). */}}
{{- define "qos.skipKinds" -}}
{{- $skip := list -}}
{{- range $kind := list "ServiceMonitor" "PodMonitor" "PrometheusRule" -}}
{{- $wanted := ternary $.Values.monitoring.prometheusRules $.Values.monitoring.serviceMonitors (eq $kind "PrometheusRule") -}}
{{- if not (and $wanted ($.Capabilities.APIVersions.Has (printf "monitoring.coreos.com/v1/%s" $kind))) -}}
{{- $skip = append $skip $kind -}}
{{- end -}}
{{- end -}}
{{- toJson $skip -}}
{{- end -}}

{{/* A ConfigMap built from config/ files, as kustomize's configMapGenerator does (name without the hash suffix:
the pods roll on a change through their checksum annotation instead). data: key -> file text. */}}
{{- define "qos.configmap" -}}
{{- $root := index . 0 }}
---
apiVersion: v1
kind: ConfigMap
metadata:
  name: {{ index . 1 }}
  namespace: {{ index . 2 }}
  labels:
{{- include "qos.labels" $root | nindent 4 }}
{{- with index . 4 }}
{{- toYaml . | nindent 4 }}
{{- end }}
data:
{{- range $k, $v := index . 3 }}
  {{ $k }}: {{ $v | toJson }}
{{- end }}
{{- end -}}

{{/* The extender-settings text of a config/ file with the chart's flavour catalogue, when one is set. */}}
{{- define "qos.withFlavours" -}}
{{- $root := index . 0 -}}
{{- $text := $root.Files.Get (index . 1) -}}
{{- if $root.Values.flavours -}}
{{- $doc := fromYaml $text | default (dict) -}}
{{- $_ := set $doc "flavours" $root.Values.flavours -}}
{{- toYaml $doc -}}
{{- else -}}
{{- $text -}}
{{- end -}}
{{- end -}}

{{- define "qos.validate" -}}
{{- if and .Values.controller.enabled (not .Values.scheduler.enabled) -}}
{{- fail "controller.enabled needs scheduler.enabled: the QoS controller runs in the qos-scheduler's extender" -}}
{{- end -}}
{{- if and .Values.colocation.enabled (not .Values.controller.enabled) -}}
{{- fail "colocation.enabled needs controller.enabled: the slack controller runs beside the QoS controller" -}}
{{- end -}}
{{- if not (has .Values.autoscaler.mode (list "expander" "externalgrpc" "off")) -}}
{{- fail (printf "autoscaler.mode must be expander, externalgrpc or off, not %v" .Values.autoscaler.mode) -}}
{{- end -}}
{{- if not (has .Values.certificates.mode (list "self" "manual")) -}}
{{- fail (printf "certificates.mode must be self or manual, not %v" .Values.certificates.mode) -}}
{{- end -}}
{{- if and (eq .Values.certificates.mode "manual") .Values.controller.webhook.caBundle .Values.controller.webhook.certManagerCertificate -}}
{{- fail "controller.webhook: set caBundle or certManagerCertificate, not both" -}}
{{- end -}}
{{- if not (kindIs "slice" .Values.flavours) -}}
{{- fail "flavours must be a list of {name, cpu, memory, pods, price_per_hour} (empty: the package's catalogue)" -}}
{{- end -}}
{{- end -}}

{{/* qos.crioAgent (list $ daemonset): config/agent/crio/daemonset-patch.yaml applied to the agent DaemonSet the way
kustomize applies it (strategic merge: the container's args and capabilities replaced; volumeMounts by mountPath and volumes
by name, entries new to the list first, `$patch: delete` entries removed). The patch is the component's own file, not
a copy; tests/test_chart.py checks the result against `kubectl kustomize`. Returns JSON. */}}
{{- define "qos.crioAgent" -}}
{{- $root := index . 0 -}}
{{- $d := index . 1 -}}
{{- $patch := $root.Files.Get "files/agent/crio/daemonset-patch.yaml" | fromYaml -}}
{{- if not $patch.spec -}}
{{- fail "kube-qos-extender chart: files/agent/crio/daemonset-patch.yaml is missing (files/agent links to config/agent)" -}}
{{- end -}}
{{- $pspec := $patch.spec.template.spec -}}
{{- $pc := index $pspec.containers 0 -}}
{{- $spec := $d.spec.template.spec -}}
{{- $c := index $spec.containers 0 -}}
{{- $_ := set $c "args" $pc.args -}}
{{- $_ := set $c.securityContext "capabilities" $pc.securityContext.capabilities -}}
{{- $_ := set $c "volumeMounts" (include "qos.mergeList" (list $c.volumeMounts $pc.volumeMounts "mountPath") | fromJsonArray) -}}
{{- $_ := set $spec "volumes" (include "qos.mergeList" (list $spec.volumes $pspec.volumes "name") | fromJsonArray) -}}
{{- toJson $d -}}
{{- end -}}

{{/* qos.mergeList (list original patch key): a strategic merge of a list of maps keyed by `key` (JSON). */}}
{{- define "qos.mergeList" -}}
{{- $orig := index . 0 -}}
{{- $patch := index . 1 -}}
{{- $key := index . 2 -}}
{{- $have := dict -}}
{{- range $o := $orig }}{{- $_ := set $have (get $o $key) true }}{{- end -}}
{{- $gone := dict -}}
{{- $changes := dict -}}
{{- $out := list -}}
{{- range $p := $patch -}}
{{- if eq (toString (get $p "$patch")) "delete" -}}
{{- $_ := set $gone (get $p $key) true -}}
{{- else if hasKey $have (get $p $key) -}}
{{- $_ := set $changes (get $p $key) $p -}}
{{- else -}}
{{- $out = append $out $p -}}
{{- end -}}
{{- end -}}
{{- range $o := $orig -}}
{{- if not (hasKey $gone (get $o $key)) -}}
{{- $out = append $out (merge (deepCopy (default (dict) (get $changes (get $o $key)))) $o) -}}
{{- end -}}
{{- end -}}
{{- toJson $out -}}
{{- end -}}
