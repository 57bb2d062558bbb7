"""Node sources for the autoscaler sidecar: kwok (local stand-in for a cloud) and cluster-autoscaler (gRPC)."""
