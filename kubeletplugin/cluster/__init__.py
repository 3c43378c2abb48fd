"""What the node daemon writes to the cluster: claim status and Events."""
