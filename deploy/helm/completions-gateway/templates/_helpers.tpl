{{/* Names and labels. */}}
{{- define "cg.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "cg.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* The name of a component's objects: <fullname>-<component>, the gateway's is <fullname>. */}}
{{- define "cg.componentName" -}}
{{- $ctx := index . 0 -}}{{- $component := index . 1 -}}
{{- if eq $component "gateway" -}}
{{- include "cg.fullname" $ctx -}}
{{- else -}}
{{- printf "%s-%s" (include "cg.fullname" $ctx | trunc 50 | trimSuffix "-") $component -}}
{{- end -}}
{{- end -}}

{{/* Selector labels of a component: (list $ component). The component is also the Prometheus job. */}}
{{- define "cg.selectorLabels" -}}
{{- $ctx := index . 0 -}}{{- $component := index . 1 -}}
app.kubernetes.io/name: {{ include "cg.name" $ctx }}
app.kubernetes.io/instance: {{ $ctx.Release.Name }}
app.kubernetes.io/component: {{ $component }}
{{- end -}}

{{- define "cg.labels" -}}
{{- $ctx := index . 0 -}}
{{ include "cg.selectorLabels" . }}
app.kubernetes.io/part-of: completions-gateway
app.kubernetes.io/version: {{ $ctx.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ $ctx.Release.Service }}
helm.sh/chart: {{ printf "%s-%s" $ctx.Chart.Name $ctx.Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end -}}

{{/* The gateway container's image: the slim gateway, or the gateway on vLLM's image for vllmPool. */}}
{{- define "cg.image" -}}
{{- $image := ternary .Values.vllmPool.image .Values.image .Values.vllmPool.enabled -}}
{{- printf "%s:%s" $image.repository (default .Chart.AppVersion $image.tag) -}}
{{- end -}}

{{/* Whether the gateway gets a Redis URL (GATEWAY_REDIS_URL): a Redis of the release, or an external one. */}}
{{- define "cg.hasRedis" -}}
{{- if or .Values.redis.enabled .Values.redis.external.url .Values.redis.external.existingSecret -}}true{{- end -}}
{{- end -}}

{{/* A config value that is exactly one ${VAR} reference (the gateway reads it from the environment). */}}
{{- define "cg.isReference" -}}
{{- if regexMatch "^\\$\\{[A-Za-z_][A-Za-z0-9_]*(:[-?][^}]*)?\\}$" (toString .) -}}true{{- end -}}
{{- end -}}

{{/*
The inline config as the gateway reads it: when Redis is configured, `config` with
`auth.store: ${GATEWAY_REDIS_URL}` added if it has auth without a store, and
`responses.store: ${GATEWAY_REDIS_URL}` if it sets no `responses.store` (stored responses and the
conversations they continue, shared by every process). Fails, naming the YAML path, when a secret
field holds a literal instead of a ${VAR} (it would sit in a ConfigMap).
*/}}
{{- define "cg.config" -}}
{{- $config := deepCopy .Values.config -}}
{{- $auth := get $config "auth" -}}
{{- if and $auth (not (hasKey $auth "store")) (include "cg.hasRedis" .) -}}
{{- $_ := set $auth "store" "${GATEWAY_REDIS_URL}" -}}
{{- end -}}
{{- $responses := get $config "responses" | default dict -}}
{{- if and (not (hasKey $responses "store")) (include "cg.hasRedis" .) -}}
{{- $_ := set $responses "store" "${GATEWAY_REDIS_URL}" -}}
{{- $_ := set $config "responses" $responses -}}
{{- end -}}
{{- $responsesStore := toString (get $responses "store") -}}
{{- if and (contains "@" $responsesStore) (not (include "cg.isReference" $responsesStore)) -}}
{{- fail "config.responses.store holds a password: put the URL in a Secret (redis.external.existingSecret) and leave responses.store out" -}}
{{- end -}}
{{- if $auth -}}
{{- range $i, $key := $auth.keys -}}
{{- if and (hasKey $key "key") (not (include "cg.isReference" $key.key)) -}}
{{- fail (printf "config.auth.keys[%d].key is a literal: a ConfigMap is no place for a key. Write ${VAR} and set VAR from a Secret (secretEnv), or give sha256 instead of key" $i) -}}
{{- end -}}
{{- end -}}
{{- if and (hasKey $auth "metrics_key") (not (include "cg.isReference" $auth.metrics_key)) -}}
{{- fail "config.auth.metrics_key is a literal: write ${VAR} and set VAR from a Secret (secretEnv), or give metrics_key_sha256" -}}
{{- end -}}
{{- $store := toString (get $auth "store") -}}
{{- if and (contains "@" $store) (not (include "cg.isReference" $store)) -}}
{{- fail "config.auth.store holds a password: put the URL in a Secret (redis.external.existingSecret) and leave auth.store out" -}}
{{- end -}}
{{- end -}}
{{- range $i, $backend := $config.backends -}}
{{- if and (hasKey $backend "api_key") (not (include "cg.isReference" $backend.api_key)) -}}
{{- fail (printf "config.backends[%d].api_key is a literal: write ${VAR} and set VAR from a Secret (secretEnv)" $i) -}}
{{- end -}}
{{- range $header, $value := (get $backend "headers" | default dict) -}}
{{- if not (include "cg.isReference" $value) -}}
{{- fail (printf "config.backends[%d].headers.%s is a literal: headers are secrets to the gateway; write ${VAR} and set VAR from a Secret (secretEnv)" $i $header) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- toYaml $config -}}
{{- end -}}

{{- define "cg.inlineConfig" -}}
{{- if not (or .Values.existingConfigMap .Values.existingConfigSecret) -}}true{{- end -}}
{{- end -}}

{{/* CPUs of a Kubernetes quantity ("500m", "2", 1.5), rounded up as the Downward API does with divisor 1. */}}
{{- define "cg.cpuCeil" -}}
{{- $q := toString . -}}
{{- if hasSuffix "m" $q -}}
{{- ceil (divf (trimSuffix "m" $q | float64) 1000) | int -}}
{{- else -}}
{{- ceil ($q | float64) | int -}}
{{- end -}}
{{- end -}}

{{/* Worker processes per pod, as the gateway will start them. */}}
{{- define "cg.workers" -}}
{{- $w := toString .Values.workers -}}
{{- $requests := (.Values.vllmPool.enabled | ternary .Values.vllmPool.resources .Values.resources).requests | default dict -}}
{{- $limits := (.Values.vllmPool.enabled | ternary .Values.vllmPool.resources .Values.resources).limits | default dict -}}
{{- if eq $w "requests" -}}
{{- if not $requests.cpu -}}
{{- fail "workers: requests sizes the workers from resources.requests.cpu, which is not set" -}}
{{- end -}}
{{- include "cg.cpuCeil" $requests.cpu -}}
{{- else if eq $w "auto" -}}
{{- if not $limits.cpu -}}
{{- fail "workers: auto reads the cgroup CPU quota, which only resources.limits.cpu sets: without it the gateway would start a worker per core of the node. Set limits.cpu, or use workers: requests" -}}
{{- end -}}
{{- include "cg.cpuCeil" $limits.cpu -}}
{{- else if regexMatch "^[1-9][0-9]*$" $w -}}
{{- $w -}}
{{- else -}}
{{- fail (printf "workers: expected requests, auto or a positive count, got %q" $w) -}}
{{- end -}}
{{- end -}}

{{/* The most gateway processes that can serve at once: replicas (or the autoscaler's max) x workers. */}}
{{- define "cg.maxProcesses" -}}
{{- $replicas := ternary .Values.autoscaling.maxReplicas .Values.replicaCount .Values.autoscaling.enabled | int -}}
{{- mul $replicas (include "cg.workers" . | int) -}}
{{- end -}}

{{/*
Refuses per-key limits that would not hold: a key with rpm/tpm/max_concurrent counted in memory
while more than one process serves (each would allow the whole limit).
*/}}
{{- define "cg.checkLimits" -}}
{{- if include "cg.inlineConfig" . -}}
{{- $config := include "cg.config" . | fromYaml -}}
{{- $auth := get $config "auth" | default dict -}}
{{- $store := toString (get $auth "store" | default "memory") -}}
{{- $processes := include "cg.maxProcesses" . | int -}}
{{- if and (eq $store "memory") (gt $processes 1) -}}
{{- $limited := list -}}
{{- range $auth.keys -}}
{{- if or (hasKey . "rpm") (hasKey . "tpm") (hasKey . "max_concurrent") -}}
{{- $limited = append $limited .name -}}
{{- end -}}
{{- end -}}
{{- if $limited -}}
{{- fail (printf "keys %s have per-key limits and up to %d gateway processes serve (replicas x workers): each would allow the whole limit. Enable redis (redis.enabled or redis.external)" (join ", " $limited) $processes) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/*
Refuses stored conversations that would be split between processes: Responses' `store: true` and
`previous_response_id` kept in each process's memory while more than one process serves (with
workers > 1 the gateway refuses them, 400 store_not_shared; across replicas a continuation that
lands on another pod is a 404). Redis fixes it (cg.config names it); `responses.store: memory`
set explicitly is the operator's choice, and the chart lets it be.
*/}}
{{- define "cg.checkStore" -}}
{{- if include "cg.inlineConfig" . -}}
{{- $responses := get (include "cg.config" . | fromYaml) "responses" | default dict -}}
{{- $processes := include "cg.maxProcesses" . | int -}}
{{- if and (not (hasKey $responses "store")) (gt $processes 1) -}}
{{- fail (printf "up to %d gateway processes serve (replicas x workers) and Responses' stored conversations (store: true, previous_response_id) would be kept in each one's memory: with workers > 1 the gateway refuses them (400 store_not_shared), and a continuation that lands on another replica is a 404. Enable redis (redis.enabled or redis.external; the chart then sets responses.store to it), or set config.responses.store: memory to accept that" $processes) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* Seconds from SIGTERM to the end of the gateway's shutdown: drain delay + drain + pool stop. */}}
{{- define "cg.shutdownSeconds" -}}
{{- if include "cg.inlineConfig" . -}}
{{- $server := get .Values.config "server" | default dict -}}
{{- $seconds := add (get $server "drain_delay" | default 0 | ceil) (get $server "drain_timeout" | default 30 | ceil) -}}
{{- $stop := 0 -}}
{{- range .Values.config.backends -}}
{{- if eq (toString .type) "vllm-pool" -}}
{{- $stop = max $stop (get . "stop_timeout" | default 30 | ceil | int) -}}
{{- end -}}
{{- end -}}
{{- add $seconds $stop -}}
{{- else -}}
{{- .Values.externalConfigShutdownSeconds | int -}}
{{- end -}}
{{- end -}}

{{- define "cg.terminationGrace" -}}
{{- add .Values.preStopSleepSeconds (include "cg.shutdownSeconds" . | int) .Values.terminationGraceMarginSeconds -}}
{{- end -}}

{{/* Liveness failures before a restart: enough that the probes outlast the grace period (a drain answers 503). */}}
{{- define "cg.livenessFailures" -}}
{{- $p := .Values.probes.liveness -}}
{{- $needed := add (div (include "cg.terminationGrace" . | int) $p.periodSeconds) 1 -}}
{{- max $p.failureThreshold $needed -}}
{{- end -}}
