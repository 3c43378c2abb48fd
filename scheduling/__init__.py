"""The offline scheduler model: Kubernetes DRA CEL, a reference allocator, ``explain`` and
``validate``. Tools for users, never in the node daemon's hot path."""
