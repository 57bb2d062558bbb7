"""Cluster shells: Kubernetes object conversion, list+watch snapshot, binder, events."""
