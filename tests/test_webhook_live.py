"""`qos-extender serve` against a real kube-apiserver: live snapshot, every verb, real Bindings and Events.

Needs KUBECONFIG pointing at a reachable API server (hack/local-up.sh prints KUBECONFIG=...). Without it the
tests FAIL, on purpose: CI must bring the cluster up, a skipped "live" test proves nothing.
Marked ``live``: select with ``-m live`` (register the marker in pyproject's pytest markers).

Test pods use a schedulerName no scheduler serves, so only our bind verb binds them; test nodes are plain
Node objects (no kwok annotation) in a unique name prefix, deleted afterwards.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import socket
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import orjson
import pytest
from kubernetes_asyncio import client as k8s

from extender.kube.client import ApiError, new_api_client, read_json
from extender.kube.events import EVENT_REASON
from extender.kube.snapshot import Snapshot
from extender.kube.watch import node_reflector
from extender.processes.webhook import Running, start
from extender.settings.extender import BindConfig, ExtenderConfig, KubernetesConfig, ServerConfig
from tests.live import require_kubeconfig

pytestmark = [pytest.mark.live]

SCHEDULER = "qos-live-nobody"
LIVE_COMPONENT = "qos-extender-live-test"  # no scheduler serves it: pods stay pending until our bind
RUN = ""  # set per test by the live_env fixture: fresh namespace and node names each time
NS = ""
NODES: list[str] = []


def _new_run() -> None:
    global RUN, NS, NODES
    RUN = NS = f"qos-live-{uuid.uuid4().hex[:6]}"
    NODES[:] = [f"{RUN}-svc-1", f"{RUN}-svc-2", f"{RUN}-batch-1"]


async def _eventually(check: Callable[[], Awaitable[bool]], what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if await check():
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def _node(name: str, group: str, cpu: str = "4", memory: str = "8Gi") -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"qos.kube-qos-extender.io/node-group": group, "qos-live": RUN}},
        "spec": {},
        "status": {
            "capacity": {"cpu": cpu, "memory": memory, "pods": "110"},
            "allocatable": {"cpu": cpu, "memory": memory, "pods": "110"},
            "conditions": [{"type": "Ready", "status": "True", "reason": "LiveTest", "message": "plain node"}],
        },
    }


def _pod(name: str, cpu: str, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NS, "annotations": annotations or {}},
        "spec": {
            "schedulerName": SCHEDULER,
            "terminationGracePeriodSeconds": 0,
            "containers": [
                {
                    "name": "c",
                    "image": "registry.invalid/pause:3.9",
                    "resources": {"requests": {"cpu": cpu, "memory": "256Mi"}},
                }
            ],
        },
    }


@dataclasses.dataclass
class Live:
    running: Running
    api: Any
    core: Any
    http: aiohttp.ClientSession

    async def post(self, verb: str, body: Any) -> tuple[int, Any]:
        # kube-scheduler's listener in the sidecar topology (server.loopback_verbs_port): the main one has no
        # client CA here, so it refuses /bind (fail closed; tests/test_webhook_authz.py)
        url = f"http://127.0.0.1:{self.running.loopback_port}/{verb}"
        async with self.http.post(url, data=orjson.dumps(body)) as resp:
            return resp.status, orjson.loads(await resp.read())

    async def create_pod(self, name: str, cpu: str, annotations: dict[str, str] | None = None) -> dict[str, Any]:
        resp = await self.core.create_namespaced_pod(NS, _pod(name, cpu, annotations), _preload_content=False)
        pod: dict[str, Any] = await read_json(resp)
        await _eventually(
            lambda: asyncio.sleep(0, result=f"{NS}/{name}" in self.running.snapshot.pods), f"pod {name} in snapshot"
        )
        return pod

    async def read_pod(self, name: str) -> dict[str, Any]:
        pod: dict[str, Any] = await read_json(await self.core.read_namespaced_pod(name, NS, _preload_content=False))
        return pod


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@pytest.fixture
async def live_env() -> AsyncIterator[Live]:
    kubeconfig = require_kubeconfig()
    _new_run()
    config = ExtenderConfig().model_copy(
        update=dict(
            server=ServerConfig(port=0, loopback_verbs_port=_free_port()),
            # the test pods' scheduler (nobody else's): the bind verb binds only pods of these names
            bind=BindConfig(scheduler_names=(SCHEDULER,)),
            # Own event component: hack/local-up.sh's extender (QOS_WITH_EXTENDER=1) watches the same pods and
            # reports the same malformed annotations; the event test must find this extender's Event.
            kubernetes=KubernetesConfig(
                kubeconfig=kubeconfig, watch_timeout_seconds=30, event_component=LIVE_COMPONENT
            ),
        )
    )
    try:
        api = await new_api_client(config.kubernetes)
    except Exception as exc:  # the loader raises anything from TypeError to ConfigException
        pytest.fail(f"KUBECONFIG={kubeconfig} is not a usable kubeconfig: {exc!r}", pytrace=False)
    core = k8s.CoreV1Api(api)
    try:
        await read_json(await core.list_namespace(limit=1, _preload_content=False, _request_timeout=5))
    except (ApiError, aiohttp.ClientError, OSError, TimeoutError) as exc:
        await api.close()
        pytest.fail(f"KUBECONFIG={kubeconfig} does not reach an API server: {exc}", pytrace=False)
    await read_json(
        await core.create_namespace({"metadata": {"name": NS}}, _preload_content=False)  # type: ignore[arg-type]
    )
    for name in NODES:
        group = "batch" if "batch" in name else "service"
        await read_json(await core.create_node(_node(name, group), _preload_content=False))
    running = await start(config)
    http = aiohttp.ClientSession()
    try:
        yield Live(running, api, core, http)
    finally:
        await http.close()
        await running.stop()
        for name in NODES:
            with contextlib.suppress(ApiError):
                await read_json(await core.delete_node(name, _preload_content=False))
        with contextlib.suppress(ApiError):
            await read_json(await core.delete_namespace(NS, _preload_content=False))
        await api.close()


async def test_live_server_answers_every_verb(live_env: Live) -> None:
    env = live_env
    snap = env.running.snapshot
    async with env.http.get(f"{env.running.url}/healthz") as resp:
        assert resp.status == 200

    async def ready() -> bool:
        async with env.http.get(f"{env.running.url}/readyz") as resp:
            return resp.status == 200 and all(n in snap.nodes for n in NODES)

    await _eventually(ready, "readyz and the test nodes in the snapshot")

    p1 = await env.create_pod("p1", "3")
    p2 = await env.create_pod("p2", "3", {"qos.kube-qos-extender.io/class": "gold"})

    # filter, nodeCacheCapable: true
    status, res = await env.post("filter", {"Pod": p1, "Nodes": None, "NodeNames": NODES})
    assert status == 200, res
    assert res["NodeNames"] == NODES[:2]
    assert "node group" in res["FailedAndUnresolvableNodes"][NODES[2]]
    # filter, nodeCacheCapable: false, with the Node objects as the API serves them
    items = [await read_json(await env.core.read_node(n, _preload_content=False)) for n in NODES]
    status, res = await env.post("filter", {"Pod": p1, "Nodes": {"metadata": {}, "items": items}, "NodeNames": None})
    assert status == 200 and [n["metadata"]["name"] for n in res["Nodes"]["items"]] == NODES[:2]

    status, res = await env.post("prioritize", {"Pod": p1, "Nodes": None, "NodeNames": NODES[:2]})
    assert status == 200 and [h["Host"] for h in res] == NODES[:2]

    # bind: a real Binding, idempotent, conflicts explained
    bind = {"PodName": "p1", "PodNamespace": NS, "PodUID": p1["metadata"]["uid"], "Node": NODES[0]}
    status, res = await env.post("bind", bind)
    assert (status, res) == (200, {"Error": ""})
    assert (await env.read_pod("p1"))["spec"]["nodeName"] == NODES[0]
    # Right after the bind, p2 (3 CPU) no longer fits on NODES[0]: ledger first, then the watch.
    status, res = await env.post("filter", {"Pod": p2, "Nodes": None, "NodeNames": NODES[:2]})
    assert res["NodeNames"] == [NODES[1]] and "insufficient cpu" in res["FailedNodes"][NODES[0]]
    status, res = await env.post("bind", bind)
    assert (status, res) == (200, {"Error": ""}), "a repeated bind to the same node is success"
    status, res = await env.post("bind", bind | {"Node": NODES[1]})
    assert status == 200 and f"already bound to node {NODES[0]!r}" in res["Error"]
    status, res = await env.post("bind", bind | {"PodName": "p2", "PodUID": str(uuid.uuid4())})
    assert status == 200 and "uid" in res["Error"]
    status, res = await env.post("bind", bind | {"PodName": "nope", "PodUID": str(uuid.uuid4())})
    assert status == 200 and "not found" in res["Error"]

    def confirmed() -> Awaitable[bool]:
        entry = snap.pods[f"{NS}/p1"]
        return asyncio.sleep(0, result=entry.pod.node_name == NODES[0] and f"{NS}/p1" not in snap.ledger)

    await _eventually(confirmed, "the watch to show p1 bound (ledger confirmed)")

    # preempt: gold p2 may preempt bronze p1 (below the margins, more important class) ...
    victims = {NODES[0]: {"Pods": [{"UID": p1["metadata"]["uid"]}], "NumPDBViolations": 0}}
    status, res = await env.post("preempt", {"Pod": p2, "NodeNameToVictims": None, "NodeNameToMetaVictims": victims})
    assert status == 200 and res["NodeNameToMetaVictims"] == victims
    # ... the same in nodeCacheCapable: false form, with the full victim pod ...
    p1_now = await env.read_pod("p1")
    full = {NODES[0]: {"Pods": [p1_now], "NumPDBViolations": 0}}
    status, res = await env.post("preempt", {"Pod": p2, "NodeNameToVictims": full, "NodeNameToMetaVictims": None})
    assert status == 200 and res["NodeNameToMetaVictims"] == victims
    # ... but a bronze preemptor may not take a gold victim's place: p1 annotated gold is protected.
    p3 = await env.create_pod("p3", "3", {"qos.kube-qos-extender.io/class": "bronze"})
    p1_now["metadata"].setdefault("annotations", {})["qos.kube-qos-extender.io/class"] = "gold"
    await read_json(await env.core.replace_namespaced_pod("p1", NS, p1_now, _preload_content=False))
    await _eventually(
        lambda: asyncio.sleep(0, result=snap.pods[f"{NS}/p1"].pod.class_name == "gold"), "p1 gold in snapshot"
    )
    status, res = await env.post("preempt", {"Pod": p3, "NodeNameToVictims": None, "NodeNameToMetaVictims": victims})
    assert status == 200 and res == {"NodeNameToMetaVictims": {}}

    # Deleting p1 frees NODES[0] for p2 through the watch.
    await read_json(await env.core.delete_namespaced_pod("p1", NS, grace_period_seconds=0, _preload_content=False))

    async def freed() -> bool:
        _, r = await env.post("filter", {"Pod": p2, "Nodes": None, "NodeNames": NODES[:2]})
        return bool(r["NodeNames"] == NODES[:2])

    await _eventually(freed, "p1's deletion to free its node")

    async with env.http.get(f"{env.running.url}/metrics") as resp:
        text = await resp.text()
    assert 'qos_extender_requests_total{outcome="ok",verb="bind"} 2.0' in text
    assert "qos_extender_snapshot_ready 1.0" in text


async def test_live_malformed_annotations_get_an_event(live_env: Live) -> None:
    env = live_env
    await _eventually(lambda: asyncio.sleep(0, result=env.running.snapshot.ready), "snapshot ready")
    pod = await env.create_pod("bad-annotations", "100m", {"qos.kube-qos-extender.io/class": "platinum"})
    assert env.running.snapshot.pods[f"{NS}/bad-annotations"].pod.class_name == "bronze"  # the default
    status, res = await env.post("filter", {"Pod": pod, "Nodes": None, "NodeNames": NODES[:1]})
    assert status == 200 and res["NodeNames"] == NODES[:1]

    async def has_event() -> bool:
        events = await read_json(await env.core.list_namespaced_event(NS, _preload_content=False))
        return any(
            e.get("reason") == EVENT_REASON
            and e.get("reportingComponent") == LIVE_COMPONENT
            and e["involvedObject"]["name"] == "bad-annotations"
            and "platinum" in e.get("message", "")
            for e in events.get("items", [])
        )

    await _eventually(has_event, f"a {EVENT_REASON} Event on the pod")
    # The Event is visible on the API server before the POST's answer reaches the sink (which then counts it):
    # wait for the count, then check it stays at one (once, not per call).
    sink = env.running.events
    assert sink is not None
    await _eventually(lambda: asyncio.sleep(0, result=sink.posted >= 1), "the sink counted the Event")
    status, res = await env.post("filter", {"Pod": pod, "Nodes": None, "NodeNames": NODES[:1]})
    assert status == 200 and sink.posted == 1


async def test_live_watch_resumes_and_relists(live_env: Live) -> None:
    """A watch the server ends (timeout) resumes from the last resourceVersion without relisting; forgetting
    the resourceVersion (what a 410 Gone does) relists, and the relist drops what was deleted meanwhile.

    A genuine 410 cannot be forced deterministically here: the API server's watch cache serves old
    resourceVersions of a young cluster instead of answering Gone.
    """
    env = live_env
    snap = Snapshot(env.running.config)
    restarts: list[str] = []
    config = env.running.config.kubernetes.model_copy(update={"watch_timeout_seconds": 1})
    nodes = node_reflector(env.api, snap, config, on_restart=lambda _, reason: restarts.append(reason))
    task = asyncio.create_task(nodes.run())
    try:
        await asyncio.wait_for(nodes.synced.wait(), 20)
        await _eventually(lambda: asyncio.sleep(0, result=restarts.count("timeout") >= 2), "two watch timeouts")
        extra = f"{RUN}-late"
        NODES.append(extra)  # cleaned up by the fixture
        await read_json(await env.core.create_node(_node(extra, "service"), _preload_content=False))
        await _eventually(lambda: asyncio.sleep(0, result=extra in snap.nodes), "a node created after resuming")
        assert nodes.lists == 1, "resumed from the resourceVersion, not relisted"
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    # Not watching: delete a node, then relist as after a 410.
    await read_json(await env.core.delete_node(extra, _preload_content=False))
    await _eventually(
        lambda: asyncio.sleep(0, result=extra not in env.running.snapshot.nodes), "the main snapshot to drop it"
    )
    assert extra in snap.nodes  # stale: nobody watched
    nodes.resource_version = None
    await nodes.list()
    assert extra not in snap.nodes and nodes.lists == 2
    assert all(n in snap.nodes for n in NODES[:3])
