"""The ``resource.k8s.io/v1`` API limits this driver builds and checks against, in one place.

Each number is the apiserver's, at ``KUBERNETES_VERSION``. Names follow the Go constants in
upper snake case; the comment names the Go constant and its file:

- ``types.go`` is ``k8s.io/api/resource/v1/types.go``;
- ``validation.go`` is ``pkg/apis/resource/validation/validation.go`` of kubernetes/kubernetes;
- ``util/validation`` is ``k8s.io/apimachinery/pkg/util/validation/validation.go``.

(Read at kubernetes ``009801d9``; see the project's dra-interfaces reference, §5.)
"""

from __future__ import annotations

from typing import Final

KUBERNETES_VERSION: Final = "1.37"
"""The Kubernetes release (development cycle) whose apiserver rules these limits and
``slice_validation`` mirror. Change it together with them."""

# --- ResourceSlice --------------------------------------------------------------------------

DRIVER_NAME_MAX_LENGTH: Final = 63
"""types.go ``DriverNameMaxLength``: driver names and attribute/capacity domains."""
POOL_NAME_MAX_LENGTH: Final = 253
"""types.go ``PoolNameMaxLength`` (= util/validation ``DNS1123SubdomainMaxLength``)."""
RESOURCE_SLICE_MAX_DEVICES: Final = 128
"""types.go ``ResourceSliceMaxDevices``."""
RESOURCE_SLICE_MAX_DEVICES_WITH_ADVANCED_FEATURES: Final = 64
"""types.go ``ResourceSliceMaxDevicesWithAdvancedFeatures``: applies when any device in the
slice has taints, consumesCounters or list attributes (validation.go)."""
RESOURCE_SLICE_MAX_COUNTER_SETS: Final = 8
"""types.go ``ResourceSliceMaxCounterSets``: ``sharedCounters`` entries per slice."""
RESOURCE_SLICE_MAX_COUNTERS_PER_COUNTER_SET: Final = 32
"""types.go ``ResourceSliceMaxCountersPerCounterSet``."""
RESOURCE_SLICE_MAX_DEVICE_COUNTER_CONSUMPTIONS_PER_DEVICE: Final = 2
"""types.go ``ResourceSliceMaxDeviceCounterConsumptionsPerDevice``."""
RESOURCE_SLICE_MAX_COUNTERS_PER_DEVICE_COUNTER_CONSUMPTION: Final = 32
"""types.go ``ResourceSliceMaxCountersPerDeviceCounterConsumption``."""
CAPACITY_REQUEST_POLICY_DISCRETE_MAX_OPTIONS: Final = 10
"""types.go ``CapacityRequestPolicyDiscreteMaxOptions``: ``validValues`` entries per policy."""
RESOURCE_SLICE_MAX_ATTRIBUTES_AND_CAPACITIES_PER_DEVICE: Final = 32
"""types.go ``ResourceSliceMaxAttributesAndCapacitiesPerDevice``: len(attributes) +
len(capacity)."""
RESOURCE_SLICE_MAX_ATTRIBUTE_VALUES_PER_DEVICE: Final = 48
"""types.go ``ResourceSliceMaxAttributeValuesPerDevice``: a scalar counts 1, a list its
length."""
DEVICE_MAX_DOMAIN_LENGTH: Final = 63
"""types.go ``DeviceMaxDomainLength``: the domain of a qualified attribute/capacity name."""
DEVICE_MAX_ID_LENGTH: Final = 32
"""types.go ``DeviceMaxIDLength``: the C identifier of a qualified attribute/capacity name."""
DEVICE_ATTRIBUTE_MAX_VALUE_LENGTH: Final = 64
"""types.go ``DeviceAttributeMaxValueLength``: bytes of a string or version value."""
DEVICE_TAINTS_MAX_LENGTH: Final = 16
"""types.go ``DeviceTaintsMaxLength``: taints per device."""
BINDING_CONDITIONS_MAX_SIZE: Final = 4
"""types.go ``BindingConditionsMaxSize``."""
BINDING_FAILURE_CONDITIONS_MAX_SIZE: Final = 4
"""types.go ``BindingFailureConditionsMaxSize``."""
ATTRIBUTE_AND_CAPACITY_MAX_KEY_LENGTH: Final = DEVICE_MAX_DOMAIN_LENGTH + 1 + DEVICE_MAX_ID_LENGTH
"""validation.go ``attributeAndCapacityMaxKeyLength``: longer map keys are shortened in the
middle in error field paths (domain + "/" + identifier)."""

# --- claims and classes ---------------------------------------------------------------------

DEVICE_REQUESTS_MAX_SIZE: Final = 32
"""types.go ``DeviceRequestsMaxSize`` (= ``AllocationResultsMaxSize``): requests per claim."""
FIRST_AVAILABLE_DEVICE_REQUEST_MAX_SIZE: Final = 8
"""types.go ``FirstAvailableDeviceRequestMaxSize``: subrequests per request."""
DEVICE_SELECTORS_MAX_SIZE: Final = 32
"""types.go ``DeviceSelectorsMaxSize``: selectors per request or class."""
DEVICE_CONSTRAINTS_MAX_SIZE: Final = 32
"""types.go ``DeviceConstraintsMaxSize``."""
DEVICE_CONFIG_MAX_SIZE: Final = 32
"""types.go ``DeviceConfigMaxSize``: config entries per claim or class."""
DEVICE_TOLERATIONS_MAX_LENGTH: Final = 16
"""types.go ``DeviceTolerationsMaxLength``: tolerations per request."""
OPAQUE_PARAMETERS_MAX_LENGTH: Final = 10 * 1024
"""types.go ``OpaqueParametersMaxLength``: bytes of one opaque config's parameters."""
ALLOCATION_RESULTS_MAX_SIZE: Final = 32
"""types.go ``AllocationResultsMaxSize``: devices one claim can be allocated."""
CEL_SELECTOR_EXPRESSION_MAX_LENGTH: Final = 10 * 1024
"""types.go ``CELSelectorExpressionMaxLength``: bytes of one CEL selector expression."""

# --- names (apimachinery) -------------------------------------------------------------------

DNS1123_LABEL_MAX_LENGTH: Final = 63
"""util/validation ``DNS1123LabelMaxLength``: device, request, counter and counter-set names."""
DNS1123_SUBDOMAIN_MAX_LENGTH: Final = 253
"""util/validation ``DNS1123SubdomainMaxLength``: object names, node names, pool name parts."""
LABEL_KEY_NAME_MAX_LENGTH: Final = 63
"""util/validation ``qualifiedNameMaxLength``: the name part of a label key (taint keys)."""
LABEL_VALUE_MAX_LENGTH: Final = 63
"""util/validation ``LabelValueMaxLength``: taint values."""
