"""Process wiring: how each long-running `qos-extender` process is assembled from the feature packages.

The feature packages (webhook + controller, autoscaler, agent, consolidation) each expose a start function and
know nothing of each other's processes; the few places where one process combines several of them live here,
above them all in the import layers (pyproject.toml ``[tool.importlinter]``):

- ``serve`` (command) and ``webhook`` (assembly: list+watch snapshot, binder, events, the HTTP app, the QoS
  controller under leader election), plus the idle-capacity controller when ``slack.enabled``;
- ``autoscaler`` (command) and ``sidecar`` (assembly: provider, loop, CA's gRPC expander, metrics) and, with
  ``--consolidation-config`` (``enabled: true``), the consolidation flow as its hand-off (``consolidation``
  depends on the autoscaler, never the reverse);
- ``agent``: the node agent (nothing else runs in its process).

Every process is assembled here and nowhere else (issue 28): the feature packages hold parts, not processes.

One module per process (``serve``, ``autoscaler``, ``agent``): what a process may run is the import closure of
its module (tests/test_manifests.py grants the autoscaler's RBAC from it). Imports of the heavy parts stay
inside the functions, so ``qos-extender simulate`` does not load aiohttp or kubernetes-asyncio.
"""
