"""Batch on the idle capacity ("slack", paper 004) of long-running services: the second controller of
`qos-extender serve`, beside the QoS one (extender.controller). It characterises the running services from their
usage in Prometheus, predicts what each will leave idle, publishes each node's sum as the batch-cpu /
batch-memory extended resources, and evicts the co-located batch pods a wrong prediction no longer fits. Its
settings are the extender file's `slack` section (extender.settings.sections.SlackConfig); its pure decisions
are in extender.core.slack and extender.core.characterise."""
