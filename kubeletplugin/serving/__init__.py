"""The kubelet's gRPC face: the sockets, registration, the DRA and health services."""
