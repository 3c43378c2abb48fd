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
The containers' security context: the override, else privileged on real GPUs, locked down
when simulating.
*/}}
{{- define "gpudra.securityContext" -}}
{{- if .Values.kubeletPlugin.securityContext }}
{{- toYaml .Values.kubeletPlugin.securityContext }}
{{- else if not .Values.simulate.profile -}}
# NVML opens every /dev/nvidia* device, and MIG management creates and destroys
# GPU and compute instances through /dev/nvidia-caps nodes that appear at run
# time and needs CAP_SYS_ADMIN for it. An unprivileged container's device cgroup
# denies those devices and no set of capabilities lifts that, so privileged is
# the least that lets NVML and MIG work.
privileged: true
# Root (the image defaults to a non-root user): the kubelet's socket
# directories are root-owned and 0750.
runAsUser: 0
runAsGroup: 0
runAsNonRoot: false
{{- else -}}
# Simulated GPUs: no devices to open, so no privilege at all.
privileged: false
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities:
  drop: ["ALL"]
# Still root (the image defaults to a non-root user): the kubelet's socket
# directories are root-owned and 0750, and the owner needs no capability to
# write there.
runAsUser: 0
runAsGroup: 0
runAsNonRoot: false
seccompProfile:
  type: RuntimeDefault
{{- end }}
{{- end }}

{{/*
The host's device nodes and /proc, where the daemon and its init container look for the
kernel module (live views: HostToContainer).
*/}}
{{- define "gpudra.devRootMounts" -}}
- name: dev-root-dev
  mountPath: /dev-root/dev
  readOnly: true
  mountPropagation: HostToContainer
- name: dev-root-proc
  mountPath: /dev-root/proc
  readOnly: true
  mountPropagation: HostToContainer
{{- end }}

{{/*
The daemon's node affinity: the override, else the chart's GPU-node terms when
kubeletPlugin.gpuNodeAffinity asks for them (auto: unless simulating), else nothing. The
terms are ORed: any of the labels marks a node with an NVIDIA GPU. Unless
allowWithDevicePlugin (or simulating), every term also keeps off nodes where the GPU
Operator deploys NVIDIA's device plugin: both would hand out the same GPUs.
*/}}
{{- define "gpudra.affinity" -}}
{{- $mode := toString .Values.kubeletPlugin.gpuNodeAffinity }}
{{- $gpuTerms := or (eq $mode "true") (and (eq $mode "auto") (not .Values.simulate.profile)) }}
{{- $guard := and (not .Values.allowWithDevicePlugin) (not .Values.simulate.profile) }}
{{- if .Values.kubeletPlugin.affinity }}
{{- toYaml .Values.kubeletPlugin.affinity }}
{{- else if or $gpuTerms $guard }}
nodeAffinity:
  requiredDuringSchedulingIgnoredDuringExecution:
    nodeSelectorTerms:
{{- if $gpuTerms }}
      # Node Feature Discovery: an NVIDIA (vendor 0x10de) PCI device, by vendor or by
      # class (0302 3D controller, 0300 VGA); GPU Feature Discovery (GPU Operator).
{{- range $key := list "feature.node.kubernetes.io/pci-10de.present" "feature.node.kubernetes.io/pci-0302_10de.present" "feature.node.kubernetes.io/pci-0300_10de.present" "nvidia.com/gpu.present" }}
      - matchExpressions:
          - key: {{ $key }}
            operator: In
            values: ["true"]
          {{- if $guard }}
          {{- include "gpudra.devicePluginGuard" $ | nindent 10 }}
          {{- end }}
{{- end }}
{{- else }}
      - matchExpressions:
          {{- include "gpudra.devicePluginGuard" . | nindent 10 }}
{{- end }}
{{- end }}
{{- end }}

{{/*
Keeps the daemon off nodes where NVIDIA's device plugin advertises nvidia.com/gpu (the GPU
Operator labels them): a chart cannot look at nodes while rendering, the scheduler can.
*/}}
{{- define "gpudra.devicePluginGuard" -}}
- key: {{ .Values.devicePluginNodeLabel }}
  operator: NotIn
  values: ["true"]
{{- end }}

{{/*
The namespace of every namespaced object: namespaceOverride, else the release's.
*/}}
{{- define "gpudra.namespace" -}}
{{- default .Release.Namespace .Values.namespaceOverride }}
{{- end }}

{{/*
The host's driver root: driverRoot, or NVIDIA's name for it, nvidiaDriverRoot (deprecated).
*/}}
{{- define "gpudra.driverRoot" -}}
{{- if .Values.nvidiaDriverRoot }}
{{- if and (ne (toString .Values.driverRoot) "/") (ne .Values.driverRoot .Values.nvidiaDriverRoot) }}
{{- fail (printf "nvidiaDriverRoot %q and driverRoot %q disagree: nvidiaDriverRoot is NVIDIA's name for driverRoot; set driverRoot only" .Values.nvidiaDriverRoot .Values.driverRoot) }}
{{- end }}
{{- .Values.nvidiaDriverRoot }}
{{- else }}
{{- .Values.driverRoot }}
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
