"""Consolidation (issue #8): empty sustained under-utilised batch nodes by migrating their pods through the
node agents, then delete the nodes through the autoscaler's provider. ``policy`` holds every decision (pure),
``flow`` applies them; plugged into the autoscaler as its ``ConsolidationHandoff`` (README.md)."""
