"""The Kubernetes layer's own metric: every API call, by verb, resource and outcome."""

from __future__ import annotations

from prometheus_client import Counter

API_CALLS = Counter(
    "gpudra_api_calls", "Kubernetes API calls, by verb, resource and outcome",
    ["verb", "resource", "outcome"])
