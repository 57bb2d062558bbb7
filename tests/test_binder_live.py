"""The binder against a real kube-apiserver: a burst of binds reaches it ``bind.max_in_flight`` at a time (issue 34).

kube-scheduler calls /bind for every pod it scheduled without waiting for the others, so a 2,000-pod burst has
hundreds of binds in flight. aiohttp speaks HTTP/1.1, one request per connection: a cap on the binder's pool
(it was 128) made the rest wait in the extender, first come first served, for a connection to come free (1,681
of 2,000 binds, p50 1.4 s, in bench/e2e_throughput.py). Uncapped, a 10,000-pod burst on 5,000 nodes then held
thousands of POSTs (and TLS connections) at once and none was answered within its budget, so the binder holds
``bind.max_in_flight`` slots of its own, whose wait it can tell from a POST in doubt. Here more binds than the
cap are started together through the client ``serve`` builds (``binder_client``): none may wait for a
connection of the pool, exactly the cap is in flight before any answer comes back, each slot keeps its
connection, and every pod ends bound to the requested node. Ordering and counts only, never wall-clock limits
(timings are bench/e2e_throughput.py's).

Needs KUBECONFIG (hack/local-up.sh; phase 1 of hack/run-live-tests.sh). The pods use a schedulerName no
scheduler serves, on a plain Node object of this test's own; both are deleted afterwards.
"""

from __future__ import annotations

import asyncio
import copy
import uuid
from types import SimpleNamespace
from typing import Any

import aiohttp
import pytest
from kubernetes_asyncio import client as k8s

from extender.kube.binder import KubeBinder
from extender.kube.binding import BindArgs
from extender.kube.client import ApiError, RawCore, binder_client, new_api_client, read_json
from extender.settings.extender import BindConfig, KubernetesConfig
from tests.live import require_kubeconfig

pytestmark = [pytest.mark.live]

BURST = 160  # more than the old pool cap of 128
SCHEDULER = "qos-live-nobody"  # no scheduler serves it: the pods stay pending until our Binding


class _Flight:
    """What the binder's pool did with each request, from aiohttp's tracing hooks."""

    def __init__(self) -> None:
        self.queued = 0  # requests that waited for a connection (the pool was at its cap)
        self.created = 0
        self.in_flight = 0
        self.most_in_flight = 0
        self.started_before_first_answer = 0
        self.answered = 0

    def trace(self) -> aiohttp.TraceConfig:
        tc = aiohttp.TraceConfig()

        async def start(_s: Any, _ctx: SimpleNamespace, _p: Any) -> None:
            self.in_flight += 1
            self.most_in_flight = max(self.most_in_flight, self.in_flight)
            if not self.answered:
                self.started_before_first_answer += 1

        async def end(_s: Any, _ctx: SimpleNamespace, _p: Any) -> None:
            self.in_flight -= 1
            self.answered += 1

        async def queued(_s: Any, _ctx: SimpleNamespace, _p: Any) -> None:
            self.queued += 1

        async def created(_s: Any, _ctx: SimpleNamespace, _p: Any) -> None:
            self.created += 1

        tc.on_request_start.append(start)
        tc.on_request_end.append(end)
        tc.on_request_exception.append(end)
        tc.on_connection_queued_start.append(queued)
        tc.on_connection_create_start.append(created)
        tc.freeze()
        return tc


async def _create(core: Any, call: str, *args: Any) -> Any:
    return await read_json(await getattr(core, call)(*args, _preload_content=False))


async def _delete(core: Any, namespace: str, *nodes: str) -> None:
    """The test's namespace and nodes, whichever exist."""
    for call, name in (("delete_namespace", namespace), *(("delete_node", n) for n in nodes)):
        try:
            await read_json(await getattr(core, call)(name, _preload_content=False))
        except ApiError as exc:
            if exc.status != 404:
                raise


async def test_a_burst_of_binds_never_waits_for_a_connection() -> None:
    kubeconfig = require_kubeconfig()
    api = await new_api_client(KubernetesConfig(kubeconfig=kubeconfig))
    core = k8s.CoreV1Api(api)
    run = f"qos-bind-burst-{uuid.uuid4().hex[:6]}"
    node = f"{run}-node"
    binder_api = binder_client(api)
    flight = _Flight()
    binder_api.rest_client.pool_manager.trace_configs.append(flight.trace())
    try:
        await _create(core, "create_namespace", {"metadata": {"name": run}})
        await _create(core, "create_node", {"metadata": {"name": node}, "spec": {}})
        sem = asyncio.Semaphore(16)  # creating the pods is not what is measured

        async def make(i: int) -> BindArgs:
            body = {
                "metadata": {"name": f"p{i:04d}"},
                "spec": {
                    "schedulerName": SCHEDULER,
                    "terminationGracePeriodSeconds": 0,
                    "containers": [{"name": "c", "image": "registry.invalid/pause:3.9"}],
                },
            }
            async with sem:
                made = await _create(core, "create_namespaced_pod", run, body)
            return BindArgs(run, made["metadata"]["name"], made["metadata"]["uid"], node)

        pods = await asyncio.gather(*(make(i) for i in range(BURST)))
        cap = 100  # bind.max_in_flight, below the burst and below the old pool cap's 128
        config = BindConfig(timeout_seconds=60.0, backoff_initial_seconds=0.05, max_in_flight=cap)
        binder = KubeBinder(binder_api, config)
        await asyncio.gather(*(binder.bind(args) for args in pods))

        assert flight.queued == 0, f"{flight.queued} of {BURST} binds waited for a connection of the binder's pool"
        # the binder's own cap, and only it, holds binds back: exactly that many were on their way at once
        assert flight.started_before_first_answer == cap
        assert flight.most_in_flight == cap
        assert flight.created == cap  # one connection per slot, reused by the binds that waited
        listed = await read_json(await core.list_namespaced_pod(run, _preload_content=False))
        bound = {p["metadata"]["name"]: p["spec"].get("nodeName") for p in listed["items"]}
        assert bound == {args.name: node for args in pods}
    finally:
        await binder_api.close()
        await _delete(core, run, node)
        await api.close()


async def test_raw_calls_bind_patch_and_read_as_a_service_account_and_map_refusals() -> None:
    """kube.client.RawCore, which the binder and the controller's release use instead of the generated calls: with a
    service account's bearer token (the credentials every deployed extender has, applied by the ApiClient's
    ``update_params_for_auth``) it binds, applies a JSON patch and reads; each refusal is an ApiError with the
    API server's status and reason (the binder's and the release's error handling depend on them)."""
    kubeconfig = require_kubeconfig()
    api = await new_api_client(KubernetesConfig(kubeconfig=kubeconfig))
    core = k8s.CoreV1Api(api)
    rbac = k8s.RbacAuthorizationV1Api(api)
    run = f"qos-raw-{uuid.uuid4().hex[:6]}"
    node, other = f"{run}-node", f"{run}-other"
    as_sa: Any = None
    try:
        await _create(core, "create_namespace", {"metadata": {"name": run}})
        for name in (node, other):
            await _create(core, "create_node", {"metadata": {"name": name}, "spec": {}})
        await _create(core, "create_namespaced_service_account", run, {"metadata": {"name": "binder"}})
        role: Any = {
            "metadata": {"name": "binder"},
            "rules": [
                {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "patch"]},
                {"apiGroups": [""], "resources": ["pods/binding"], "verbs": ["create"]},
            ],
        }
        await read_json(await rbac.create_namespaced_role(run, role, _preload_content=False))
        rb: Any = {
            "metadata": {"name": "binder"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "binder"},
            "subjects": [{"kind": "ServiceAccount", "name": "binder", "namespace": run}],
        }
        await read_json(await rbac.create_namespaced_role_binding(run, rb, _preload_content=False))
        token = await _create(core, "create_namespaced_service_account_token", "binder", run, {"spec": {}})
        configuration = copy.deepcopy(api.configuration)
        configuration.cert_file = configuration.key_file = None  # the token alone identifies the caller
        configuration.api_key = {"BearerToken": token["status"]["token"]}
        configuration.api_key_prefix = {"BearerToken": "Bearer"}
        as_sa = k8s.ApiClient(configuration=configuration)
        raw = RawCore(as_sa)
        body = {
            "metadata": {"name": "p", "labels": {"a": "b"}},
            "spec": {
                "schedulerName": SCHEDULER,
                "terminationGracePeriodSeconds": 0,
                "schedulingGates": [{"name": "qos.test/gate"}],
                "containers": [{"name": "c", "image": "registry.invalid/pause:3.9"}],
            },
        }
        made = await _create(core, "create_namespaced_pod", run, body)
        uid = made["metadata"]["uid"]

        patched = await raw.patch_namespaced_pod(
            "p", run, [{"op": "remove", "path": "/spec/schedulingGates"}], timeout=10
        )
        assert patched["metadata"]["uid"] == uid and not patched["spec"].get("schedulingGates")
        with pytest.raises(ApiError) as invalid:  # a patch the API server refuses: 422, its reason kept
            await raw.patch_namespaced_pod(
                "p", run, [{"op": "replace", "path": "/spec/nodeName", "value": 1}], timeout=10
            )
        assert invalid.value.status in (400, 422) and invalid.value.message

        binding: Any = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": "p", "namespace": run, "uid": uid},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }
        await raw.create_namespaced_pod_binding("p", run, binding, timeout=10)
        read = await raw.read_namespaced_pod("p", run, timeout=10)
        assert read["spec"]["nodeName"] == node
        again = {**binding, "target": {**binding["target"], "name": other}}
        with pytest.raises(ApiError) as conflict:
            await raw.create_namespaced_pod_binding("p", run, again, timeout=10)
        assert (conflict.value.status, conflict.value.reason) == (409, "Conflict")
        with pytest.raises(ApiError) as missing:
            await raw.read_namespaced_pod("absent", run, timeout=10)
        assert (missing.value.status, missing.value.reason) == (404, "NotFound")
        with pytest.raises(ApiError) as forbidden:  # the role grants this namespace only
            await raw.read_namespaced_pod("p", "default", timeout=10)
        assert (forbidden.value.status, forbidden.value.reason) == (403, "Forbidden")
    finally:
        if as_sa is not None:
            await as_sa.close()
        await _delete(core, run, node, other)
        await api.close()
