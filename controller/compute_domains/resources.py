"""The API resources the ComputeDomain controller calls, and nothing else.

Kept apart from :mod:`gpudra.kube.raw_api`'s constants on purpose: the controller runs
under its own ServiceAccount and Role, and the chart's RBAC test for it records what the
running controller calls (``tests/deploy/test_compute_domain_chart.py``).
"""

from __future__ import annotations

from typing import Final

from gpudra.api import compute_domain as cd
from gpudra.kube.raw_api import Resource

COMPUTE_DOMAINS: Final = Resource(cd.PLURAL, f"/apis/{cd.API_VERSION}", namespaced=True)
CLAIMS: Final = Resource("resourceclaims", "/apis/resource.k8s.io/v1", namespaced=True)
CLAIM_TEMPLATES: Final = Resource("resourceclaimtemplates", "/apis/resource.k8s.io/v1",
                                  namespaced=True)
PODS: Final = Resource("pods", "/api/v1", namespaced=True)
LEASES: Final = Resource("leases", "/apis/coordination.k8s.io/v1", namespaced=True)
DOMAIN_EVENTS: Final = Resource("events", "/apis/events.k8s.io/v1", namespaced=True)
