{{/*
Chart name, cut to the 63 characters a label value allows.
*/}}
{{- define "gpudra.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Full name of the release's objects. Cluster-scoped objects (ClusterRole, admission policy)
carry it too, so two releases never fight over one object.
*/}}
{{- define "gpudra.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "gpudra.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "gpudra.selectorLabels" -}}
app.kubernetes.io/name: {{ include "gpudra.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "gpudra.labels" -}}
helm.sh/chart: {{ include "gpudra.chart" . }}
{{ include "gpudra.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/*
Labels that select the node daemon's pods (DaemonSet selector, metrics Service).
*/}}
{{- define "gpudra.kubeletPluginSelectorLabels" -}}
{{ include "gpudra.selectorLabels" . }}
app.kubernetes.io/component: kubelet-plugin
{{- end }}

{{- define "gpudra.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "gpudra.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "gpudra.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag | toString) }}
{{- end }}

{{/*
featureGates as the daemon's flag value: "A=true,B=false", in name order (range sorts map
keys), empty when no gate is set. Values must be booleans: a quoted "true" in a values file
is a mistake the daemon would reject, so the chart names it first.
*/}}
{{- define "gpudra.featureGates" -}}
{{- $gates := list }}
{{- range $name, $value := .Values.featureGates }}
{{- if not (kindIs "bool" $value) }}
{{- fail (printf "featureGates.%s: want true or false, got %q" $name (toString $value)) }}
{{- end }}
{{- $gates = append $gates (printf "%s=%t" $name $value) }}
{{- end }}
{{- join "," $gates }}
{{- end }}

{{/*
Where the simulated node keeps its hardware state: under the plugin data dir, a hostPath,
so the simulated MIG instances survive a pod restart the way real ones do.
*/}}
{{- define "gpudra.simState" -}}
{{- printf "%s/%s/sim" (trimSuffix "/" .Values.kubeletPlugin.kubeletPluginsDirectoryPath) .Values.driverName }}
{{- end }}

{{/*
The container runs privileged unless simulating, or as the securityContext override says.
Only a privileged container may use Bidirectional mount propagation.
*/}}
{{- define "gpudra.privileged" -}}
{{- if .Values.kubeletPlugin.securityContext }}
{{- if .Values.kubeletPlugin.securityContext.privileged }}true{{ end }}
{{- else if not .Values.simulate.profile }}true
{{- end }}
{{- end }}

{{/*
The daemon's node affinity: the override, else the chart's GPU-node default when
kubeletPlugin.gpuNodeAffinity asks for it (auto: unless simulating), else nothing.
The two terms are ORed: either label marks a node with an NVIDIA GPU.
*/}}
{{- define "gpudra.affinity" -}}
{{- $mode := toString .Values.kubeletPlugin.gpuNodeAffinity }}
{{- if .Values.kubeletPlugin.affinity }}
{{- toYaml .Values.kubeletPlugin.affinity }}
{{- else if or (eq $mode "true") (and (eq $mode "auto") (not .Values.simulate.profile)) }}
nodeAffinity:
  requiredDuringSchedulingIgnoredDuringExecution:
    nodeSelectorTerms:
      # Node Feature Discovery: a PCI device of vendor 0x10de (NVIDIA).
      - matchExpressions:
          - key: feature.node.kubernetes.io/pci-10de.present
            operator: In
            values: ["true"]
      # GPU Feature Discovery (GPU Operator).
      - matchExpressions:
          - key: nvidia.com/gpu.present
            operator: In
            values: ["true"]
{{- end }}
{{- end }}

{{/*
One DeviceClass. Device attributes are published without a domain, so they live in the
driver's own domain: the selector indexes device.attributes by the driver name.
*/}}
{{- define "gpudra.deviceClass" -}}
{{- $root := .root }}
{{- $class := .class }}
{{- $driver := $root.Values.driverName -}}
apiVersion: resource.k8s.io/v1
kind: DeviceClass
metadata:
  name: {{ $class.name }}
  labels:
    {{- include "gpudra.labels" $root | nindent 4 }}
spec:
  selectors:
    - cel:
        expression: {{ printf "device.driver == '%s' && device.attributes['%s'].type == '%s'" $driver $driver .type | quote }}
  {{- with $class.extendedResourceName }}
  extendedResourceName: {{ . | quote }}
  {{- end }}
{{- end }}
