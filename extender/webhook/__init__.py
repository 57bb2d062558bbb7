"""The kube-scheduler extender webhook: verbs, aiohttp app, metrics."""
