{{/*
Names and labels.
*/}}
{{- define "dataplane.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "dataplane.selectorLabels" -}}
app.kubernetes.io/name: {{ .name }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
{{- end -}}

{{- define "dataplane.labels" -}}
{{ include "dataplane.selectorLabels" . }}
app.kubernetes.io/part-of: dataplane
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version | replace "+" "_" }}
{{- end -}}

{{/*
What each service's code fixes, so it is not a value: the configuration groups it reads, whether it
serves the catalogue, the consumer group and topic KEDA watches, and the egress targets it uses.
*/}}
{{/*
The outbound trust store and proxies (values `trust`, docs/configuration.md "Trust store and
proxies"), for every container that calls out: the services and the registration Job.
*/}}
{{- define "dataplane.trust.path" -}}/etc/ssl/dataplane/ca-bundle.pem{{- end -}}

{{- define "dataplane.trust.env" -}}
{{- $t := .Values.trust }}
{{- if and $t.caBundle.configMap $t.caBundle.secret }}
{{- fail "trust.caBundle: set configMap or secret, not both" }}
{{- end }}
{{- if or $t.caBundle.configMap $t.caBundle.secret }}
- name: DATAPLANE_CA_BUNDLE
  value: {{ include "dataplane.trust.path" . | quote }}
{{- end }}
{{- range $env, $key := dict "HTTPS_PROXY" "https" "HTTP_PROXY" "http" "NO_PROXY" "noProxy" }}
{{- with index $t.proxy $key }}
- name: {{ $env }}
  value: {{ . | quote }}
{{- end }}
{{- end }}
{{- end -}}

{{- define "dataplane.trust.mount" -}}
{{- $b := .Values.trust.caBundle }}
{{- if or $b.configMap $b.secret }}
- name: ca-bundle
  mountPath: {{ include "dataplane.trust.path" . | dir }}
  readOnly: true
{{- end }}
{{- end -}}

{{- define "dataplane.trust.volume" -}}
{{- $b := .Values.trust.caBundle }}
{{- $items := list (dict "key" $b.key "path" (include "dataplane.trust.path" . | base)) }}
{{- if $b.configMap }}
- name: ca-bundle
  configMap:
    name: {{ $b.configMap | quote }}
    items: {{ $items | toJson }}
{{- else if $b.secret }}
- name: ca-bundle
  secret:
    secretName: {{ $b.secret | quote }}
    items: {{ $items | toJson }}
{{- end }}
{{- end -}}

{{- define "dataplane.wiring" -}}
query-gateway:
  http: true
  catalogue: true
  env: [common, kafka, oidc, redis, datasets, rowFiltersCache, gateway, connector, dpsGateway]
  egress: [postgres, redis, kafka, oidc, ds, otel]
signaling:
  http: true
  catalogue: true
  env: [common, kafka, oidc, flowsDb, dpsSignaling]
  egress: [postgres, kafka, oidc, otel, web]
filter-resolver:
  consumer: {topic: dataplane.plan.requests, group: dataplane-filter-resolver}
  env: [common, kafka, oidc, redis, datasets, rowFiltersCache, resolver]
  egress: [postgres, redis, kafka, oidc, otel, web]
audit-relay:
  consumer: {topic: dataplane.audit.disclosures, group: dataplane-audit-relay}
  env: [common, kafka, oidc, connector]
  egress: [kafka, oidc, ds, otel]
{{- end -}}

{{/*
The effective configuration of one service: its values with `global` fallbacks filled in.
Call: include "dataplane.service" (list $ $name $values) | fromYaml
Nested maps are merged key by key in a range (not with sprig merge, whose mergo treats an explicit
`false` or 0 as unset and would let the global value win).
*/}}
{{- define "dataplane.service" -}}
{{- $root := index . 0 -}}
{{- $name := index . 1 -}}
{{- $v := index . 2 -}}
{{- $g := $root.Values.global -}}
{{- $wiring := index (include "dataplane.wiring" $root | fromYaml) $name -}}
{{- $image := deepCopy $g.image -}}
{{- range $k, $x := ($v.image | default dict) }}{{ $_ := set $image $k $x }}{{ end -}}
{{- $autoscaling := deepCopy $g.autoscaling -}}
{{- range $k, $x := ($v.autoscaling | default dict) }}{{ $_ := set $autoscaling $k $x }}{{ end -}}
{{- $pdb := deepCopy $g.pdb -}}
{{- range $k, $x := ($v.pdb | default dict) }}{{ $_ := set $pdb $k $x }}{{ end -}}
{{- /* A service choosing one PDB bound drops the other one it inherited. */ -}}
{{- if hasKey ($v.pdb | default dict) "minAvailable" }}{{ $_ := unset $pdb "maxUnavailable" }}{{ end -}}
{{- if hasKey ($v.pdb | default dict) "maxUnavailable" }}{{ $_ := unset $pdb "minAvailable" }}{{ end -}}
{{- $env := deepCopy ($g.env | default dict) -}}
{{- range $k, $x := ($v.env | default dict) }}{{ $_ := set $env $k $x }}{{ end -}}
{{- $oidc := dict "clientId" $root.Values.oidc.clientId "clientSecret" $root.Values.oidc.clientSecret -}}
{{- range $k, $x := ($v.oidc | default dict) }}{{ $_ := set $oidc $k $x }}{{ end -}}
{{- $repo := $image.repository | default (printf "%s%s" ($image.repositoryPrefix | default "") $name) -}}
{{- $ref := printf "%s:%s" $repo ($image.tag | default $root.Chart.AppVersion) -}}
{{- /* A digest pins the content; the tag stays beside it for readers (the runtime pulls by digest). */ -}}
{{- if $image.digest }}{{ $ref = printf "%s@%s" $ref $image.digest }}{{ end -}}
{{- if $image.registry }}{{ $ref = printf "%s/%s" $image.registry $ref }}{{ end -}}
{{- $probes := dict -}}
{{- range $kind := list "liveness" "readiness" "startup" }}
{{- $p := deepCopy (index ($g.probes | default dict) $kind | default dict) -}}
{{- range $k, $x := (index ($v.probes | default dict) $kind | default dict) }}{{ $_ := set $p $k $x }}{{ end -}}
{{- $_ := set $probes $kind $p -}}
{{- end -}}
{{- /* A spread constraint without a selector counts this service's own pods. */ -}}
{{- $spread := list -}}
{{- range ($v.topologySpreadConstraints | default $g.topologySpreadConstraints | default list) }}
{{- $c := deepCopy . -}}
{{- if not (hasKey $c "labelSelector") }}{{ $_ := set $c "labelSelector" (dict "matchLabels" (include "dataplane.selectorLabels" (dict "root" $root "name" $name) | fromYaml)) }}{{ end -}}
{{- $spread = append $spread $c -}}
{{- end -}}
{{- $drain := hasKey $v "preStopDrainSeconds" | ternary $v.preStopDrainSeconds $g.preStopDrainSeconds -}}
{{- if ge (int $drain) (int $g.terminationGracePeriodSeconds) }}
{{- fail (printf "services.%s: preStopDrainSeconds %v must be below global.terminationGracePeriodSeconds %v (the drain is part of the grace period)" $name $drain $g.terminationGracePeriodSeconds) }}
{{- end -}}
name: {{ $name }}
fullname: {{ printf "%s-%s" (include "dataplane.fullname" $root) $name | trunc 63 | trimSuffix "-" }}
image: {{ $ref | quote }}
pullPolicy: {{ $image.pullPolicy }}
port: {{ $v.port }}
portName: {{ if $wiring.http }}http{{ else }}metrics{{ end }}
replicas: {{ hasKey $v "replicas" | ternary $v.replicas $g.replicas }}
resources: {{ $v.resources | default $g.resources | toJson }}
autoscaling: {{ $autoscaling | toJson }}
pdb: {{ $pdb | toJson }}
env: {{ $env | toJson }}
oidc: {{ $oidc | toJson }}
podAnnotations: {{ merge (deepCopy ($v.podAnnotations | default dict)) ($g.podAnnotations | default dict) | toJson }}
podLabels: {{ merge (deepCopy ($v.podLabels | default dict)) ($g.podLabels | default dict) | toJson }}
nodeSelector: {{ $v.nodeSelector | default $g.nodeSelector | default dict | toJson }}
tolerations: {{ $v.tolerations | default $g.tolerations | default list | toJson }}
networkPolicy: {{ $v.networkPolicy | default dict | toJson }}
probes: {{ $probes | toJson }}
preStopDrainSeconds: {{ $drain }}
affinity: {{ $v.affinity | default $g.affinity | default dict | toJson }}
topologySpreadConstraints: {{ $spread | toJson }}
priorityClassName: {{ $v.priorityClassName | default $g.priorityClassName | default "" | quote }}
serviceAccountAnnotations: {{ merge (deepCopy (dig "serviceAccount" "annotations" dict $v)) (dig "serviceAccount" "annotations" dict $g) | toJson }}
extraEnvList: {{ concat ($g.extraEnv | default list) ($v.extraEnv | default list) | toJson }}
extraVolumes: {{ concat ($g.extraVolumes | default list) ($v.extraVolumes | default list) | toJson }}
extraVolumeMounts: {{ concat ($g.extraVolumeMounts | default list) ($v.extraVolumeMounts | default list) | toJson }}
initContainers: {{ concat ($g.initContainers | default list) ($v.initContainers | default list) | toJson }}
sidecars: {{ concat ($g.sidecars | default list) ($v.sidecars | default list) | toJson }}
serviceType: {{ dig "service" "type" "ClusterIP" $v }}
serviceAnnotations: {{ dig "service" "annotations" dict $v | toJson }}
wiring: {{ $wiring | toJson }}
{{- end -}}

{{/*
The hook Jobs run with the signaling image unless hooks.image is set.
*/}}
{{- define "dataplane.hookImage" -}}
{{- if .Values.hooks.image -}}
{{- .Values.hooks.image -}}
{{- else -}}
{{- (include "dataplane.service" (list . "signaling" (index .Values.services "signaling")) | fromYaml).image -}}
{{- end -}}
{{- end -}}

{{- define "dataplane.secretRef" -}}
- name: {{ .env }}
  valueFrom:
    secretKeyRef:
      name: {{ .ref.name | quote }}
      key: {{ .ref.key | quote }}
{{- end -}}

{{/*
Restricted pod and container security: non-root, read-only root file system, no capabilities.
Not configurable on purpose, apart from the uid.
*/}}
{{- define "dataplane.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: {{ .Values.global.runAsUser }}
runAsGroup: {{ .Values.global.runAsUser }}
fsGroup: {{ .Values.global.runAsUser }}
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{- define "dataplane.containerSecurityContext" -}}
runAsNonRoot: true
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities:
  drop: [ALL]
{{- end -}}
