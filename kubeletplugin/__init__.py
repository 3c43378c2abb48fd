"""The kubelet's face and the node daemon: registration, DRA services, health stream, claim
fetching and decoding, prepare orchestration; the daemon's wiring (``daemon``), settings
(``node_config``), root-task supervision (``supervisor``) and probes.

May import ``gpudra.api``, ``gpudra.driver``, ``gpudra.kube`` and ``gpudra.controller``.
"""
