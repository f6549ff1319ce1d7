{{/*
Environment of one service, assembled from the configuration groups its wiring names.
Names follow docs/configuration.md. Every secret comes from a secretKeyRef.
Call: include "dataplane.env" (dict "root" $ "s" $s)
*/}}
{{- define "dataplane.env" -}}
{{- $root := .root -}}
{{- $s := .s -}}
{{- range $group := $s.wiring.env }}
{{ include (printf "dataplane.env.%s" $group) (dict "root" $root "s" $s) | trim }}
{{- end }}
{{- end -}}

{{- define "dataplane.env.common" -}}
{{- $v := .root.Values }}
- name: HTTP_PORT
  value: {{ .s.port | quote }}
- name: LOG_LEVEL
  value: {{ $v.global.logLevel | quote }}
- name: OTEL_SERVICE_NAME
  value: {{ .s.name | quote }}
- name: OTEL_RESOURCE_ATTRIBUTES
  value: {{ printf "service.namespace=dataplane,deployment.environment=%s" .root.Release.Namespace | quote }}
{{- if $v.otel.endpoint }}
- name: OTEL_EXPORTER_OTLP_ENDPOINT
  value: {{ $v.otel.endpoint | quote }}
- name: OTEL_EXPORTER_OTLP_PROTOCOL
  value: {{ $v.otel.protocol | quote }}
{{- end }}
{{- /* in the managed list, so `env`/`extraEnv` cannot set these a second time */}}
{{- include "dataplane.trust.env" .root }}
{{- end -}}

{{- define "dataplane.env.kafka" -}}
{{- $v := .root.Values }}
{{ include "dataplane.secretRef" (dict "env" "KAFKA_BOOTSTRAP_SERVERS" "ref" $v.secrets.kafkaBootstrapServers) }}
- name: KAFKA_FETCH_MAX_WAIT_MS
  value: {{ $v.kafka.fetchMaxWaitMs | quote }}
- name: KAFKA_ENABLE_IDEMPOTENCE
  value: {{ $v.kafka.enableIdempotence | quote }}
{{- end -}}

{{- define "dataplane.env.oidc" -}}
{{- $v := .root.Values }}
- name: CELINE_OIDC_BASE_URL
  value: {{ $v.oidc.baseUrl | quote }}
{{- if $v.oidc.jwksUri }}
- name: CELINE_OIDC_JWKS_URI
  value: {{ $v.oidc.jwksUri | quote }}
{{- end }}
- name: CELINE_OIDC_AUDIENCE
  value: {{ $v.oidc.audience | quote }}
- name: CELINE_OIDC_CLIENT_ID
  value: {{ .s.oidc.clientId | quote }}
{{ include "dataplane.secretRef" (dict "env" "CELINE_OIDC_CLIENT_SECRET" "ref" .s.oidc.clientSecret) }}
{{- end -}}

{{- define "dataplane.env.redis" -}}
{{ include "dataplane.secretRef" (dict "env" "REDIS_URL" "ref" .root.Values.secrets.redisUrl) }}
{{- end -}}

{{- define "dataplane.env.datasets" -}}
{{ include "dataplane.secretRef" (dict "env" "DATASETS_DATABASE_URL" "ref" .root.Values.secrets.datasetsDatabaseUrl) }}
{{- end -}}

{{- define "dataplane.env.flowsDb" -}}
{{ include "dataplane.secretRef" (dict "env" "DATABASE_URL" "ref" .root.Values.secrets.flowsDatabaseUrl) }}
{{- end -}}

{{- define "dataplane.env.rowFiltersCache" -}}
{{- $rf := .root.Values.rowFilters }}
- name: ROW_FILTERS_CACHE_TTL
  value: {{ $rf.cacheTtlSeconds | quote }}
- name: ROW_FILTERS_CACHE_MAXSIZE
  value: {{ $rf.cacheMaxSize | quote }}
{{ include "dataplane.secretRef" (dict "env" "ROW_FILTERS_CACHE_KEY_SECRET" "ref" .root.Values.secrets.rowFiltersCacheKeySecret) }}
{{- if $rf.pluginHandlers }}
- name: ROW_FILTERS_PLUGIN_HANDLERS
  value: {{ $rf.pluginHandlers | quote }}
{{- end }}
{{- end -}}

{{- define "dataplane.env.gateway" -}}
{{- $v := .root.Values }}
- name: CATALOGUE_PATH
  value: /etc/dataplane/catalogue.yaml
- name: ROW_FILTERS_RESOLVE_TIMEOUT_MS
  value: {{ $v.rowFilters.resolveTimeoutMs | quote }}
- name: AUDIT_PUBLISH_TIMEOUT_MS
  value: {{ $v.gateway.auditPublishTimeoutMs | quote }}
- name: QUERY_STATEMENT_TIMEOUT_MS
  value: {{ $v.gateway.queryStatementTimeoutMs | quote }}
- name: EDR_ENABLED
  value: {{ $v.gateway.edrEnabled | quote }}
{{- range $env, $key := dict "QUERY_MAX_SQL_CHARS" "queryMaxSqlChars" "QUERY_MAX_BODY_BYTES" "queryMaxBodyBytes" "DATASETS_POOL_MAX_SIZE" "datasetsPoolMaxSize" "RATE_LIMIT_PER_SECOND" "rateLimitPerSecond" "RATE_LIMIT_BURST" "rateLimitBurst" "QUERY_MAX_CONCURRENT_PER_CONSUMER" "queryMaxConcurrentPerConsumer" "QUERY_MAX_CONCURRENT_PER_CONSUMER_TOTAL" "queryMaxConcurrentPerConsumerTotal" "QUERY_PLAN_COST_CALIBRATE" "queryPlanCostCalibrate" "QUERY_MAX_VALUE_BYTES" "queryMaxValueBytes" }}
{{- if hasKey $v.gateway $key }}
- name: {{ $env }}
  value: {{ index $v.gateway $key | toString | quote }}
{{- end }}
{{- end }}
{{- if hasKey $v.gateway "queryMaxPlanCost" }}
- name: QUERY_MAX_PLAN_COST
  value: {{ $v.gateway.queryMaxPlanCost | int64 | toString | quote }}
{{- end }}
{{- with $v.gateway.dsDecisionCache }}
{{- if hasKey . "enabled" }}
- name: DS_DECISION_CACHE_ENABLED
  value: {{ .enabled | quote }}
{{- end }}
{{- if hasKey . "maxSize" }}
- name: DS_DECISION_CACHE_MAXSIZE
  value: {{ .maxSize | toString | quote }}
{{- end }}
{{- end }}
{{- with $v.secrets.columnMaskKey }}
{{ include "dataplane.secretRef" (dict "env" "COLUMN_MASK_KEY" "ref" .) }}
{{- end }}
{{- with $v.secrets.recordsCursorSecret }}
{{ include "dataplane.secretRef" (dict "env" "RECORDS_CURSOR_SECRET" "ref" .) }}
{{- end }}
{{- end -}}

{{- define "dataplane.env.resolver" -}}
{{- $rf := .root.Values.rowFilters }}
{{- if $rf.modules }}
- name: ROW_FILTERS_MODULES
  value: {{ $rf.modules | quote }}
{{- end }}
{{- if $rf.recRegistryUrl }}
- name: REC_REGISTRY_URL
  value: {{ $rf.recRegistryUrl | quote }}
{{- end }}
{{- end -}}

{{- define "dataplane.env.connector" -}}
{{- $c := .root.Values.connector }}
{{- if $c.internalUrl }}
- name: CONNECTOR_INTERNAL_URL
  value: {{ $c.internalUrl | quote }}
{{- end }}
{{- if $c.internalUrls }}
- name: CONNECTOR_INTERNAL_URLS
  value: {{ $c.internalUrls | quote }}
{{- end }}
{{- end -}}

{{- define "dataplane.env.dpsGateway" -}}
{{- $v := .root.Values }}
- name: DPS_ENABLED
  value: {{ $v.dps.enabled | quote }}
{{- if $v.dps.enabled }}
{{ include "dataplane.secretRef" (dict "env" "DPS_FLOWS_DATABASE_URL" "ref" $v.secrets.pullGrantDatabaseUrl) }}
{{ include "dataplane.secretRef" (dict "env" "DPS_TOKEN_PUBLIC_KEY" "ref" $v.secrets.dpsTokenPublicKey) }}
{{- end }}
{{- end -}}

{{- define "dataplane.env.dpsSignaling" -}}
{{- $d := .root.Values.dps }}
- name: DPS_ENABLED
  value: {{ $d.enabled | quote }}
- name: DPS_PULL_GRANT_ROLE
  value: {{ $d.pullGrantRole | quote }}
{{- if $d.enabled }}
- name: DPS_DATAPLANE_ID
  value: {{ $d.dataplaneId | quote }}
{{- range $env, $key := dict "DPS_SIGNALING_URL" "signalingUrl" "DPS_PUBLIC_URL" "publicUrl" "DPS_TRANSFER_TYPES" "transferTypes" "DPS_LABELS" "labels" "DPS_CONTROL_PLANE_CLIENTS" "controlPlaneClients" "DPS_TOKEN_KEY_ID" "tokenKeyId" "DPS_REFRESH_URL" "refreshUrl" }}
{{- with index $d $key }}
- name: {{ $env }}
  value: {{ . | quote }}
{{- end }}
{{- end }}
{{- with $d.tokenTtlSeconds }}
- name: DPS_TOKEN_TTL_SECONDS
  value: {{ . | toString | quote }}
{{- end }}
{{- if hasKey $d "asyncSignals" }}
- name: DPS_ASYNC_SIGNALS
  value: {{ $d.asyncSignals | quote }}
{{- end }}
- name: CATALOGUE_PATH
  value: /etc/dataplane/catalogue.yaml
{{ include "dataplane.secretRef" (dict "env" "DPS_TOKEN_SIGNING_KEY" "ref" .root.Values.secrets.dpsTokenSigningKey) }}
{{- end }}
{{- end -}}

{{/*
Plain environment from `global.env` / `services.<svc>.env`, then the EnvVar entries of
`global.extraEnv` / `services.<svc>.extraEnv` (which may reference a Secret or a field), after
checking that none repeats a variable the chart or another entry sets (two definitions: the last
silently wins) and that no secret arrives as a literal value.
*/}}
{{- define "dataplane.extraEnv" -}}
{{- $managed := list -}}
{{- range (include "dataplane.env" . | fromYamlArray) }}{{ $managed = append $managed .name }}{{ end -}}
{{- $secretNames := list "KAFKA_BOOTSTRAP_SERVERS" "REDIS_URL" "DATASETS_DATABASE_URL" "DATABASE_URL" "DPS_FLOWS_DATABASE_URL" "ROW_FILTERS_CACHE_KEY_SECRET" "CELINE_OIDC_CLIENT_SECRET" "DPS_TOKEN_SIGNING_KEY" "COLUMN_MASK_KEY" "RECORDS_CURSOR_SECRET" -}}
{{- range $name, $value := .s.env }}
{{- if has $name $secretNames }}
{{- fail (printf "services.%s.env.%s (or global.env): %s is a secret; name its Secret under `secrets:` instead of giving the value" $.s.name $name $name) }}
{{- else if has $name $managed }}
{{- fail (printf "services.%s.env.%s (or global.env): %s is set by the chart from its own value; set that value instead" $.s.name $name $name) }}
{{- end }}
{{- $managed = append $managed $name }}
- name: {{ $name }}
  value: {{ $value | quote }}
{{- end }}
{{- range $e := .s.extraEnvList }}
{{- if has $e.name $managed }}
{{- fail (printf "services.%s.extraEnv (or global.extraEnv): %s is already set (by the chart, `env` or another entry); set it once" $.s.name $e.name) }}
{{- else if and (has $e.name $secretNames) (not $e.valueFrom) }}
{{- fail (printf "services.%s.extraEnv (or global.extraEnv): %s is a secret; reference its Secret (valueFrom.secretKeyRef) instead of giving the value" $.s.name $e.name) }}
{{- end }}
{{- $managed = append $managed $e.name }}
- {{ toJson $e }}
{{- end }}
{{- end -}}
