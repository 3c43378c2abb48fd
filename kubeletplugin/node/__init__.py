"""The node daemon itself: configuration, wiring, supervision, probes."""
