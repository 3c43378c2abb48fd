"""The ComputeDomain controller (``gpudra controller``): cluster-level work for multi-node
NVLink domains.

One concern per module: ``resources`` (the API resources it calls), ``claims`` and ``pods``
(what an allocated channel claim and a daemon pod say), ``objects`` (the objects a domain
owns), ``plan`` (pure: what should exist and what status a domain has), ``informer`` (LIST +
WATCH caches), ``status`` (writes that never lose a concurrent update), ``reconcile`` (the
side effects of a plan), ``leader`` (Lease-based leader election) and ``app`` (the wiring).
"""
