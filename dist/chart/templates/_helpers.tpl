{{/* The operator's namespace. */}}
{{- define "fencekeeper.namespace" -}}
{{- required "namespace.name is required" .Values.namespace.name -}}
{{- end -}}

{{/* Labels the chart adds to every object's metadata (never to selectors or
the pod template, so that a kustomize install can be taken over by Helm). */}}
{{- define "fencekeeper.chartLabels" -}}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/part-of: fencekeeper
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{/* The pod selector of the manager. */}}
{{- define "fencekeeper.selector" -}}
control-plane: controller-manager
{{- end -}}

{{- define "fencekeeper.image" -}}
{{- if .Values.image.digest -}}{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}{{- else -}}{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}{{- end -}}
{{- end -}}

{{- define "fencekeeper.serviceHost" -}}
{{- printf "fencekeeper-webhook-service.%s.svc" (include "fencekeeper.namespace" .) -}}
{{- end -}}

{{- /* The Secret the metrics endpoint serves its certificate from (tls.crt,
tls.key, ca.crt), or "" for the certificate each replica generates: the
installer's metrics.certSecret, else the one cert-manager issues for a
ServiceMonitor to verify. */ -}}
{{- define "fencekeeper.metricsCertSecret" -}}
{{- if .Values.metrics.certSecret -}}
{{- .Values.metrics.certSecret -}}
{{- else if and .Values.serviceMonitor.enabled (eq .Values.certificates.mode "cert-manager") -}}
fencekeeper-metrics-server-cert
{{- end -}}
{{- end -}}

{{- define "fencekeeper.validate" -}}
{{- if and .Values.serviceMonitor.enabled (not (include "fencekeeper.metricsCertSecret" .)) -}}
{{- fail "serviceMonitor.enabled with certificates.mode=self-signed: set metrics.certSecret to a Secret in the operator namespace with tls.crt, tls.key and ca.crt for the metrics endpoint, so that Prometheus can verify it (docs/monitoring.md, \"Scraping\"); without cert-manager the chart cannot issue one" -}}
{{- end -}}
{{- range $k, $_ := include "fencekeeper.selector" . | fromYaml }}
{{- if hasKey $.Values.podLabels $k }}
{{- fail (printf "podLabels.%s: %s is the Deployment's selector label, which the chart sets; use another label" $k $k) }}
{{- end }}
{{- end }}
{{- if not (has .Values.certificates.mode (list "cert-manager" "self-signed")) -}}
{{- fail (printf "certificates.mode=%q: use cert-manager or self-signed" .Values.certificates.mode) -}}
{{- end -}}
{{- range .Values.protectedKinds -}}
{{- if or (not .resource) (not .version) (hasKey . "group" | not) -}}
{{- fail (printf "protectedKinds entry %v: group (\"\" for the core group), version and resource (plural) are required" .) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- /* The --protected-kinds value: <resource>.<group>/<version>, comma-separated. */ -}}
{{- define "fencekeeper.protectedKindsFlag" -}}
{{- $out := list -}}
{{- range .Values.protectedKinds -}}
{{- $out = append $out (printf "%s%s/%s" .resource (ternary (printf ".%s" .group) "" (ne .group "")) .version) -}}
{{- end -}}
{{- join "," $out -}}
{{- end -}}
