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
{{- if include "gpudra.nvidiaImage" . }}
{{- /* NVIDIA's image runs NVIDIA's driver, not `gpudra`: a values file written for its chart
names it, so the chart's own image (values.yaml's default) is used instead, tag and all. */ -}}
{{- printf "ghcr.io/gpudra/gpudra:%s" .Chart.AppVersion }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag | toString) }}
{{- end }}
{{- end }}

{{/*
"true" when image.repository names NVIDIA's driver image (registry.k8s.io/dra-driver-nvidia/…,
nvcr.io/nvidia/k8s-dra-driver-gpu and its older names).
*/}}
{{- define "gpudra.nvidiaImage" -}}
{{- $repo := toString .Values.image.repository }}
{{- if or (contains "dra-driver-nvidia" $repo) (contains "k8s-dra-driver" $repo) }}true{{ end }}
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
{{- $nvidia := dig "containers" "gpus" "securityContext" dict .Values.kubeletPlugin }}
{{- if .Values.kubeletPlugin.securityContext }}
{{- if .Values.kubeletPlugin.securityContext.privileged }}true{{ end }}
{{- else if not .Values.simulate.profile }}
{{- if or (not (hasKey $nvidia "privileged")) $nvidia.privileged }}true{{ end }}
{{- end }}
{{- end }}

{{/*
The containers' security context: the override, else privileged on real GPUs, locked down
when simulating.
*/}}
{{- define "gpudra.securityContext" -}}
{{- $nvidia := dig "containers" "gpus" "securityContext" dict .Values.kubeletPlugin }}
{{- if .Values.kubeletPlugin.securityContext }}
{{- toYaml .Values.kubeletPlugin.securityContext }}
{{- else if and $nvidia (not .Values.simulate.profile) }}
{{- /* NVIDIA's kubeletPlugin.containers.gpus.securityContext, over the default below: its
image runs as root, ours does not, so its {privileged: true} alone would leave the daemon
unable to write the kubelet's root-owned directories. */ -}}
{{- toYaml (mergeOverwrite (dict "privileged" true "runAsUser" 0 "runAsGroup" 0 "runAsNonRoot" false) (deepCopy $nvidia)) }}
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
apiVersion: {{ printf "resource.k8s.io/%s" (include "gpudra.resourceApiVersion" $root) }}
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

{{/*
The CDI hook's host path: cdiHookPath, or NVIDIA's name for it, nvidiaCDIHookPath.
*/}}
{{- define "gpudra.cdiHookPath" -}}
{{- $ours := toString (.Values.cdiHookPath | default "") }}
{{- $nvidia := toString (.Values.nvidiaCDIHookPath | default "") }}
{{- if and $ours $nvidia (ne $ours $nvidia) }}
{{- fail (printf "nvidiaCDIHookPath %q and cdiHookPath %q disagree: nvidiaCDIHookPath is NVIDIA's name for cdiHookPath; set cdiHookPath only" $nvidia $ours) }}
{{- end }}
{{- default $nvidia $ours }}
{{- end }}

{{/*
The daemon's log level: logLevel, or from NVIDIA's klog logVerbosity when logLevel is left at
info. klog logs errors, warnings and level-0 information at any verbosity, and request and
response detail from 6 on, which is what gpudra's debug level adds.
*/}}
{{- define "gpudra.logLevel" -}}
{{- if and (eq (toString .Values.logLevel) "info") (hasKey .Values "logVerbosity") (ne (toString .Values.logVerbosity) "") }}
{{- ternary "debug" "info" (ge (int (toString .Values.logVerbosity)) 6) }}
{{- else }}
{{- .Values.logLevel }}
{{- end }}
{{- end }}

{{/*
The resource.k8s.io version (v1, v1beta2 or v1beta1) of the chart's DRA objects:
resourceApiVersion, in gpudra's form (v1) or NVIDIA's (resource.k8s.io/v1); auto or empty:
the newest the cluster serves (v1 when Helm cannot ask one, as in `helm template`).
*/}}
{{- define "gpudra.resourceApiVersion" -}}
{{- $asked := trimPrefix "resource.k8s.io/" (toString (.Values.resourceApiVersion | default "auto")) }}
{{- if ne $asked "auto" }}
{{- $asked }}
{{- else if .Capabilities.APIVersions.Has "resource.k8s.io/v1" }}v1
{{- else if .Capabilities.APIVersions.Has "resource.k8s.io/v1beta2" }}v1beta2
{{- else if .Capabilities.APIVersions.Has "resource.k8s.io/v1beta1" }}v1beta1
{{- else }}v1
{{- end }}
{{- end }}

{{/*
The daemon container's resources: kubeletPlugin.resources, or NVIDIA's
kubeletPlugin.containers.gpus.resources when that is set. The init container's: NVIDIA's
kubeletPlugin.containers.init.resources when set, else the daemon's.
*/}}
{{- define "gpudra.pluginResources" -}}
{{- $nvidia := dig "containers" "gpus" "resources" dict .Values.kubeletPlugin }}
{{- with (default .Values.kubeletPlugin.resources $nvidia) }}
{{- toYaml . }}
{{- end }}
{{- end }}

{{- define "gpudra.initResources" -}}
{{- $nvidia := dig "containers" "init" "resources" dict .Values.kubeletPlugin }}
{{- if $nvidia }}
{{- toYaml $nvidia }}
{{- else }}
{{- include "gpudra.pluginResources" . }}
{{- end }}
{{- end }}

{{/*
More environment for the daemon: kubeletPlugin.extraEnv, then NVIDIA's
kubeletPlugin.containers.gpus.env.
*/}}
{{- define "gpudra.extraEnv" -}}
{{- $env := concat (.Values.kubeletPlugin.extraEnv | default list) (dig "containers" "gpus" "env" list .Values.kubeletPlugin) }}
{{- with $env }}
{{- toYaml . }}
{{- end }}
{{- end }}

{{/*
Every key path under .value (a map), one per line, prefixed with .prefix: the keys of NVIDIA's
chart that gpudra ignores, for the install notes to name.
*/}}
{{- define "gpudra.keyPaths" -}}
{{- if and (kindIs "map" .value) (gt (len .value) 0) }}
{{- range $key, $value := .value }}
{{- include "gpudra.keyPaths" (dict "prefix" (printf "%s.%s" $.prefix $key) "value" $value) }}
{{- end }}
{{- else }}
{{ .prefix }}
{{- end }}
{{- end }}

{{/*
The keys of NVIDIA's chart in these values that gpudra ignores, one line each:
"<reason>|<key>, <key>…", for NOTES.txt. Keys gpudra maps are not named here.
*/}}
{{- define "gpudra.nvidiaIgnored" -}}
{{- $v := .Values }}
{{- $groups := list }}
{{- $cd := list }}
{{- with $v.resources }}{{ with .computeDomains }}
{{- $cd = concat $cd (splitList "\n" (include "gpudra.keyPaths" (dict "prefix" "resources.computeDomains" "value" .) | trim)) }}
{{- end }}{{ end }}
{{- with $v.controller }}
{{- $cd = concat $cd (splitList "\n" (include "gpudra.keyPaths" (dict "prefix" "controller" "value" .) | trim)) }}
{{- end }}
{{- with (dig "containers" "computeDomains" dict $v.kubeletPlugin) }}
{{- $cd = concat $cd (splitList "\n" (include "gpudra.keyPaths" (dict "prefix" "kubeletPlugin.containers.computeDomains" "value" .) | trim)) }}
{{- end }}
{{- if hasKey $v "altProcDevices" }}{{ $cd = append $cd "altProcDevices" }}{{ end }}
{{- $mapped := include "gpudra.nvidiaComputeDomainKeys" . | splitList " " }}
{{- $unmapped := list }}
{{- range $key := $cd }}
{{- $covered := false }}
{{- range $mapped }}
{{- if or (eq $key .) (hasPrefix (printf "%s." .) $key) }}{{ $covered = true }}{{ end }}
{{- end }}
{{- if not $covered }}{{ $unmapped = append $unmapped $key }}{{ end }}
{{- end }}
{{- with $unmapped }}
{{- $groups = append $groups (printf "settings of NVIDIA's ComputeDomain components that gpudra's (computeDomains.*) do not have|%s" (join ", " .)) }}
{{- end }}
{{- with $v.webhook }}
{{- $hook := list }}
{{- range $key, $value := . }}
{{- if ne $key "enabled" }}
{{- $hook = concat $hook (splitList "\n" (include "gpudra.keyPaths" (dict "prefix" (printf "webhook.%s" $key) "value" $value) | trim)) }}
{{- end }}
{{- end }}
{{- with $hook }}
{{- $groups = append $groups (printf "NVIDIA's webhook pod and its certificate: gpudra checks opaque configs with an admission policy in the API server, which needs neither|%s" (join ", " .)) }}
{{- end }}
{{- end }}
{{- $plugin := list }}
{{- with $v.kubeletPlugin.metrics }}
{{- range $key, $value := . }}
{{- /* The GPU plugin's endpoint is the metrics port (gpudra.metricsPort); its path is ours. */ -}}
{{- if not (or (eq $key "gpuHttpEndpoint") (and (eq $key "metricsPath") (eq (toString $value) "/metrics"))) }}
{{- $plugin = append $plugin (printf "kubeletPlugin.metrics.%s" $key) }}
{{- end }}
{{- end }}
{{- end }}
{{- if hasKey (dig "containers" "gpus" dict $v.kubeletPlugin) "healthcheckPort" }}
{{- $plugin = append $plugin "kubeletPlugin.containers.gpus.healthcheckPort" }}
{{- end }}
{{- with $plugin }}
{{- $groups = append $groups (printf "the daemon serves /metrics, /healthz and /readyz on metrics.port (its probes use them)|%s" (join ", " .)) }}
{{- end }}
{{- with $v.kubeletPlugin.networkPolicy }}
{{- $groups = append $groups (printf "the chart renders no NetworkPolicy|%s" (join ", " (splitList "\n" (include "gpudra.keyPaths" (dict "prefix" "kubeletPlugin.networkPolicy" "value" .) | trim)))) }}
{{- end }}
{{- if hasKey (dig "containers" "init" dict $v.kubeletPlugin) "securityContext" }}
{{- $groups = append $groups "the init container runs with the daemon's security context (NVIDIA's chart ignores this key too)|kubeletPlugin.containers.init.securityContext" }}
{{- end }}
{{- $misc := list }}
{{- range $key := list "selectorLabelsOverride" "consumableShares" "gpuResourcesEnabledOverride" "maskNvidiaDriverParams" }}
{{- if hasKey $v $key }}{{ $misc = append $misc $key }}{{ end }}
{{- end }}
{{- with $misc }}
{{- $groups = append $groups (printf "no meaning in gpudra (fixed selector labels; GPU sharing through shareableGpus; no device-plugin override or driver-params mask needed)|%s" (join ", " .)) }}
{{- end }}
{{- if include "gpudra.nvidiaImage" . }}
{{- $groups = append $groups (printf "it names NVIDIA's image (%s), which does not run gpudra; the chart's own image is used|image.repository, image.tag" $v.image.repository) }}
{{- end }}
{{- join "\n" $groups }}
{{- end }}

{{/*
Environment for `kubectl exec` into the daemon's container: what `gpudra inventory` and
`gpudra sim` need to see the node as the daemon does. Only settings the daemon's flags also
carry (an unset DYNAMIC_MIG_GPUS differs from "none": it follows the DynamicMIG gate).
*/}}
{{- define "gpudra.execEnv" -}}
- name: DRIVER_NAME
  value: {{ .Values.driverName | quote }}
- name: KUBELET_PLUGINS_DIRECTORY_PATH
  value: {{ .Values.kubeletPlugin.kubeletPluginsDirectoryPath | quote }}
{{- if .Values.simulate.profile }}
- name: SIMULATE
  value: {{ .Values.simulate.profile | quote }}
- name: SIM_STATE
  value: {{ include "gpudra.simState" . | quote }}
{{- else }}
- name: DRIVER_ROOT
  value: /driver-root
- name: DEV_ROOT
  value: /dev-root
{{- end }}
{{- with include "gpudra.featureGates" . }}
- name: FEATURE_GATES
  value: {{ . | quote }}
{{- end }}
{{- if ne (toString .Values.shareableGpus) "none" }}
- name: SHAREABLE_GPUS
  value: {{ toString .Values.shareableGpus | quote }}
{{- end }}
{{- with .Values.dynamicMig }}
{{- if ne (toString (.gpus | default "none")) "none" }}
- name: DYNAMIC_MIG_GPUS
  value: {{ toString .gpus | quote }}
{{- end }}
{{- if ne (toString (.profiles | default "all")) "all" }}
- name: DYNAMIC_MIG_PROFILES
  value: {{ toString .profiles | quote }}
{{- end }}
{{- if ne (toString (.placements | default "all")) "all" }}
- name: DYNAMIC_MIG_PLACEMENTS
  value: {{ toString .placements | quote }}
{{- end }}
{{- end }}
{{- end }}

{{/*
NVIDIA's ComputeDomain keys that gpudra's computeDomains values take over (space-separated),
as "gpudra.computeDomains" maps them: its IMEX mode and isolation only when they are what
gpudra does (driver-managed IMEX daemons, one channel per domain).
*/}}
{{- define "gpudra.nvidiaComputeDomainKeys" -}}
{{- $keys := list "resources.computeDomains.enabled" "controller.replicas" "controller.nodeSelector" "controller.tolerations" "controller.containers.computeDomain.resources" }}
{{- $imex := dig "computeDomains" "imex" dict (.Values.resources | default dict) }}
{{- if eq (toString ($imex.mode | default "driverManaged")) "driverManaged" }}{{ $keys = append $keys "resources.computeDomains.imex.mode" }}{{ end }}
{{- if eq (toString ($imex.isolation | default "domain")) "domain" }}{{ $keys = append $keys "resources.computeDomains.imex.isolation" }}{{ end }}
{{- join " " $keys }}
{{- end }}

{{/*
The computeDomains values with NVIDIA's names for them filled in: resources.computeDomains
.enabled (unless computeDomains.enabled is true already), and the controller's replicas,
nodeSelector, tolerations and resources where gpudra's are left at their defaults.
*/}}
{{- define "gpudra.computeDomains" -}}
{{- $ours := deepCopy .Values.computeDomains }}
{{- $nvidia := dig "computeDomains" dict (.Values.resources | default dict) }}
{{- if and (not $ours.enabled) (hasKey $nvidia "enabled") }}
{{- $_ := set $ours "enabled" (eq (toString $nvidia.enabled) "true") }}
{{- end }}
{{- with .Values.controller }}
{{- $ctl := $ours.controller }}
{{- if and (hasKey . "replicas") (eq (int $ctl.replicas) 1) }}{{ $_ := set $ctl "replicas" (int .replicas) }}{{ end }}
{{- if and .nodeSelector (not $ctl.nodeSelector) }}{{ $_ := set $ctl "nodeSelector" .nodeSelector }}{{ end }}
{{- if and .tolerations (not $ctl.tolerations) }}{{ $_ := set $ctl "tolerations" .tolerations }}{{ end }}
{{- with (dig "containers" "computeDomain" "resources" dict .) }}{{ $_ := set $ctl "resources" . }}{{ end }}
{{- end }}
{{- toYaml $ours }}
{{- end }}

{{/*
kubeletPlugin.updateStrategy, without maxSurge when maxUnavailable is not zero: the API server
refuses a DaemonSet with both. The chart's default surges (maxUnavailable 0), so a non-zero
maxUnavailable is the admin's (NVIDIA's chart sets "100%"), and means replace without a surge.
*/}}
{{- define "gpudra.updateStrategy" -}}
{{- $strategy := deepCopy .Values.kubeletPlugin.updateStrategy }}
{{- with $strategy.rollingUpdate }}
{{- if include "gpudra.surgeDropped" $ }}
{{- $_ := unset . "maxSurge" }}
{{- end }}
{{- end }}
{{- toYaml $strategy }}
{{- end }}

{{/*
"true" when gpudra.updateStrategy drops maxSurge (for NOTES.txt to say so).
*/}}
{{- define "gpudra.surgeDropped" -}}
{{- with .Values.kubeletPlugin.updateStrategy.rollingUpdate }}
{{- $unavailable := toString (.maxUnavailable | default 0) }}
{{- $surge := toString (.maxSurge | default 0) }}
{{- if and (not (has $unavailable (list "0" "0%"))) (not (has $surge (list "0" "0%"))) }}true{{ end }}
{{- end }}
{{- end }}

{{/*
The daemon's HTTP port (/metrics, /healthz, /readyz): metrics.port, or the port of NVIDIA's
kubeletPlugin.metrics.gpuHttpEndpoint (":8080") while metrics.port is left at its 8080.
*/}}
{{- define "gpudra.metricsPort" -}}
{{- $port := int .Values.metrics.port }}
{{- $nvidia := toString (dig "metrics" "gpuHttpEndpoint" "" .Values.kubeletPlugin) }}
{{- if and (eq $port 8080) (regexMatch ":[0-9]+$" $nvidia) }}
{{- $port = int (regexFind "[0-9]+$" $nvidia) }}
{{- end }}
{{- $port }}
{{- end }}
