"""The one Kubernetes layer: raw-JSON API calls, typed API errors, back-off and log-once."""
