"""Our scheduling gate's silent paths made visible (issue 31): pods that bypassed admission are counted once (metric
+ Warning Event + a mark on the pod) and accounted; which pods `qos-extender ungate` releases.

The decisions are core.gates'; the controller's shell is driven against a small real HTTP server standing in for
the API server's pod PATCH (the controller, its snapshot and its kubernetes client are the real ones).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiohttp import web
from aiohttp.test_utils import TestServer
from kubernetes_asyncio import client as k8s
from prometheus_client import CollectorRegistry, generate_latest

from extender.cli import main
from extender.controller.accounting import ACCOUNT_ANNOTATION
from extender.controller.loop import QosController
from extender.controller.metrics import ControllerMetrics
from extender.controller.patches import INSTANCE_ANNOTATION
from extender.controller.state import TrackingSnapshot, pod_info
from extender.core.gates import BYPASS_ANNOTATION, GateView, bypassed_admission, ungate_plan
from extender.processes.ungate import ungate
from extender.settings.extender import ExtenderConfig

CONFIG = ExtenderConfig()
CONFIG = CONFIG.model_copy(update=dict(controller=CONFIG.controller.model_copy(update=dict(persistence="memory"))))
GATE = CONFIG.controller.gate_name


# ------------------------------------------------------------------------------------------ core


def view(key: str, *, gated: bool = False, instance: str | None = None, marked: bool = False, **kw: bool) -> GateView:
    return GateView(key, gated, instance, marked, **kw)


def test_bypassed_admission_is_an_ungated_unannotated_pod_not_counted_yet() -> None:
    pods = [
        view("ns/bypassed"),
        view("ns/also-bypassed-and-running"),
        view("ns/admitted", instance="default"),  # our webhook annotated it (released since: no gate)
        view("ns/gated", gated=True),  # gated: some webhook of ours admitted it
        view("ns/counted", marked=True),  # counted by an earlier pass or term
        view("ns/deleting", deleting=True),  # nobody can mark it: left out rather than counted by every term
        view("ns/finished", terminal=True),  # it did bypass: counted
    ]
    assert bypassed_admission(pods) == ["ns/also-bypassed-and-running", "ns/bypassed", "ns/finished"]
    assert bypassed_admission([]) == []


def test_ungate_plan_is_every_live_pod_with_our_gate_whatever_its_instance() -> None:
    pods = [
        view("a/gated", gated=True, instance="default"),
        view("b/other-instance", gated=True, instance="canary"),
        view("c/unannotated", gated=True),
        view("d/released", instance="default"),
        view("e/finished", gated=True, terminal=True),
        view("f/deleting", gated=True, deleting=True),
    ]
    assert ungate_plan(pods) == ["a/gated", "b/other-instance", "c/unannotated"]


def test_a_key_without_namespace_is_refused() -> None:
    with pytest.raises(ValueError, match="namespace/name"):
        GateView("no-namespace", False, None, False)


def test_pod_info_reads_our_bypass_mark() -> None:
    pod = qos_pod("p")
    assert not pod_info(pod, GATE, ACCOUNT_ANNOTATION).bypass_marked
    pod["metadata"]["annotations"] = {BYPASS_ANNOTATION: "default"}
    assert pod_info(pod, GATE, ACCOUNT_ANNOTATION).bypass_marked


# ----------------------------------------------------------------------------- the controller's shell


def node(name: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": {}}, "spec": {},
            "status": {"allocatable": {"cpu": "4", "memory": "8Gi", "pods": "110"}}}  # fmt: skip


def qos_pod(name: str, *, gated: bool = False, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "schedulerName": CONFIG.controller.scheduler_name,
        "containers": [{"name": "c", "resources": {"requests": {"cpu": "1", "memory": "1Gi"}}}],
    }
    if gated:
        spec["schedulingGates"] = [{"name": GATE}]
    else:
        spec["nodeName"] = "n1"
    meta: dict[str, Any] = {"name": name, "namespace": "ns", "uid": f"uid-{name}",
                            "creationTimestamp": "2026-01-01T00:00:00Z"}  # fmt: skip
    if annotations:
        meta["annotations"] = annotations
    return {"metadata": meta, "spec": spec, "status": {"phase": "Pending" if gated else "Running"}}


@dataclass
class FakeApiServer:
    """Pod PATCHes: recorded with their JSON body and answered with ``status``; namespaces: an empty list."""

    status: int = 200
    patches: list[tuple[str, dict[str, Any]]] = field(default_factory=list)

    async def patch(self, request: web.Request) -> web.Response:
        self.patches.append((request.match_info["name"], await request.json()))
        if self.status != 200:
            return web.json_response({"kind": "Status", "code": self.status}, status=self.status)
        return web.json_response(qos_pod(request.match_info["name"]))

    async def namespaces(self, _request: web.Request) -> web.Response:
        return web.json_response({"kind": "NamespaceList", "items": [], "metadata": {}})


@dataclass
class Events:
    emitted: list[tuple[str, str, str, str]] = field(default_factory=list)

    def emit(self, pod_key: str, uid: str, reason: str, message: str, type_: str = "Normal") -> None:
        self.emitted.append((pod_key, uid, reason, type_))


@pytest.fixture
async def api() -> AsyncIterator[tuple[FakeApiServer, Any]]:
    fake = FakeApiServer()
    app = web.Application()
    app.router.add_patch("/api/v1/namespaces/{namespace}/pods/{name}", fake.patch)
    app.router.add_get("/api/v1/namespaces", fake.namespaces)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    client = k8s.ApiClient(configuration=k8s.Configuration(host=f"http://127.0.0.1:{server.port}"))
    yield fake, client
    await client.close()
    await server.close()


def _controller(client: Any, pods: list[dict[str, Any]]) -> tuple[QosController, ControllerMetrics, Events]:
    snap = TrackingSnapshot(CONFIG, ACCOUNT_ANNOTATION)
    snap.replace_nodes([node("n1")], "1", now=0.0)
    snap.replace_pods(pods, "1", now=0.0)
    metrics = ControllerMetrics(CollectorRegistry())
    events = Events()
    ctl = QosController(client, snap, CONFIG, metrics, events=events, clock=lambda: 1.8e9)  # type: ignore[arg-type]
    ctl.namespaces_listed_at = 1.8e9  # namespaces listed after the pods were created: their route is known
    return ctl, metrics, events


def _count(metrics: ControllerMetrics) -> float:
    value: float = metrics.admission_bypassed._value.get()
    return value


async def _settle(ctl: QosController) -> None:
    while ctl._bypass_tasks:
        await asyncio.gather(*ctl._bypass_tasks, return_exceptions=True)


async def test_a_pod_that_bypassed_admission_is_counted_once_marked_and_accounted(
    api: tuple[FakeApiServer, Any],
) -> None:
    fake, client = api
    admitted = qos_pod("admitted", annotations={INSTANCE_ANNOTATION: "default"})  # released by us earlier
    ctl, metrics, events = _controller(client, [qos_pod("bypassed"), admitted])
    await ctl.reconcile()
    await _settle(ctl)
    assert [name for name, _ in fake.patches] == ["bypassed"]
    (_, body) = fake.patches[0]
    # only this incarnation (uid), marked with the instance that counted it
    assert body == {"metadata": {"uid": "uid-bypassed", "annotations": {BYPASS_ANNOTATION: "default"}}}
    assert _count(metrics) == 1
    assert events.emitted == [("ns/bypassed", "uid-bypassed", "QoSAdmissionBypassed", "Warning")]
    assert "ns/bypassed" in ctl.accounts  # taken into the accounts like every pod of this instance
    # the next pass, before the watch shows the mark: not counted again
    await ctl.reconcile()
    await _settle(ctl)
    assert len(fake.patches) == 1 and _count(metrics) == 1
    # a new term (restart, leader change) sees the mark: never counted again
    marked = qos_pod("bypassed", annotations={BYPASS_ANNOTATION: "default"})
    ctl2, metrics2, events2 = _controller(client, [marked, admitted])
    await ctl2.reconcile()
    await _settle(ctl2)
    assert len(fake.patches) == 1 and _count(metrics2) == 0 and events2.emitted == []
    assert "ns/bypassed" in ctl2.accounts


async def test_a_refused_mark_is_not_counted_and_is_tried_again(api: tuple[FakeApiServer, Any]) -> None:
    fake, client = api
    fake.status = 503
    ctl, metrics, events = _controller(client, [qos_pod("bypassed")])
    await ctl.reconcile()
    await _settle(ctl)
    assert len(fake.patches) == 1 and _count(metrics) == 0 and events.emitted == []
    fake.status = 200
    await ctl.reconcile()
    await _settle(ctl)
    assert len(fake.patches) == 2 and _count(metrics) == 1


async def test_a_pod_found_innocent_is_judged_again_once_the_watch_shows_it_changed(
    api: tuple[FakeApiServer, Any],
) -> None:
    """A pass judges only pod versions it has not judged (the watch makes a new PodInfo per change): judging
    every pod every pass was ~30 % of a pass at 10,000 pods (issue 34). A gated pod is innocent; once its gate
    is gone without our webhook's annotation, that new version did bypass, and is counted."""
    fake, client = api
    ctl, metrics, events = _controller(client, [qos_pod("later", gated=True)])
    await ctl.reconcile()
    await _settle(ctl)
    assert _count(metrics) == 0 and "ns/later" in ctl._bypass_checked
    ungated = qos_pod("later")
    ungated["metadata"]["resourceVersion"] = "2"
    ctl.snapshot.apply_pod("MODIFIED", ungated)
    await ctl.reconcile()
    await _settle(ctl)
    marks = [name for name, body in fake.patches if BYPASS_ANNOTATION in str(body)]
    assert marks == ["later"] and _count(metrics) == 1
    assert events.emitted == [("ns/later", "uid-later", "QoSAdmissionBypassed", "Warning")]
    # and a version judged innocent that did not change is left alone by the next pass
    before = dict(ctl._bypass_checked)
    await ctl.reconcile()
    assert all(ctl._bypass_checked[k] is v for k, v in before.items())


async def test_a_gated_pod_or_another_instances_pod_is_not_counted(api: tuple[FakeApiServer, Any]) -> None:
    fake, client = api
    other = qos_pod("other", annotations={INSTANCE_ANNOTATION: "canary"})
    ctl, metrics, _ = _controller(client, [qos_pod("gated", gated=True), other])
    ctl.namespaces_listed_at = 1.8e9
    await ctl.reconcile()
    await _settle(ctl)
    assert all(name != "other" for name, _ in fake.patches)
    assert not [b for _, b in fake.patches if BYPASS_ANNOTATION in str(b)]
    assert _count(metrics) == 0


# ----------------------------------------------------------------------------------------------- alerts


def test_the_alerts_read_series_the_controller_exports() -> None:
    """QosAdmissionBypassed and QosControllerNoLeader (config/base/prometheusrule.yaml, also the chart's) name
    only series the controller's registry really exposes: a renamed metric would leave an alert that never
    fires."""
    rules = yaml.safe_load((Path(__file__).parent.parent / "config/base/prometheusrule.yaml").read_text())
    alerts = {r["alert"]: r for g in rules["spec"]["groups"] for r in g["rules"] if "alert" in r}
    registry = CollectorRegistry()
    metrics = ControllerMetrics(registry)
    metrics.admission_bypassed.inc()
    exposed = {line.split("{")[0].split(" ")[0] for line in generate_latest(registry).decode().splitlines()}
    for name in ("QosAdmissionBypassed", "QosControllerNoLeader"):
        used = set(re.findall(r"qos_extender_controller_[a-z_]+", alerts[name]["expr"]))
        assert used and used <= exposed, (name, used - exposed)


# --------------------------------------------------------------------------------------- qos-extender ungate


@dataclass
class FakeCluster:
    """Pods (listed two per page), the webhook configuration, and PATCH applying JSON patches' test / remove ops
    as the API server does (a failed test: 422). ``admit_during_delete``: a pod the webhook gates just as it is
    being deleted (it appears in the second list)."""

    pods: dict[str, dict[str, Any]]
    webhook: bool = True
    admit_during_delete: dict[str, Any] | None = None
    change_once: set[str] = field(default_factory=set)  # pods changed between list and PATCH (422 once)
    patches: list[str] = field(default_factory=list)
    lists: int = 0

    async def list_pods(self, request: web.Request) -> web.Response:
        keys = sorted(self.pods)
        start = int(request.query.get("continue") or 0)
        if start == 0:
            self.lists += 1
            if self.lists == 2 and self.admit_during_delete is not None:
                pod = self.admit_during_delete
                self.pods[f"{pod['metadata']['namespace']}/{pod['metadata']['name']}"] = pod
                keys = sorted(self.pods)
        page = keys[start : start + 2]
        more = str(start + 2) if start + 2 < len(keys) else None
        return web.json_response({"items": [self.pods[k] for k in page], "metadata": {"continue": more}})

    async def patch(self, request: web.Request) -> web.Response:
        key = f"{request.match_info['namespace']}/{request.match_info['name']}"
        self.patches.append(key)
        if key not in self.pods:
            return web.json_response({"kind": "Status", "code": 404}, status=404)
        if key in self.change_once:
            self.change_once.discard(key)
            return web.json_response({"kind": "Status", "code": 422}, status=422)
        pod = self.pods[key]
        for op in await request.json():
            parts = op["path"].strip("/").split("/")
            target: Any = pod
            for p in parts[:-1]:
                target = target[int(p)] if isinstance(target, list) else target[p]
            last = int(parts[-1]) if isinstance(target, list) else parts[-1]
            if op["op"] == "test" and target[last] != op["value"]:
                return web.json_response({"kind": "Status", "code": 422}, status=422)
            if op["op"] == "remove":
                del target[last]
        return web.json_response(pod)

    async def delete_webhook(self, request: web.Request) -> web.Response:
        if not self.webhook or request.match_info["name"] != "qos-extender-ordering":
            return web.json_response({"kind": "Status", "code": 404}, status=404)
        self.webhook = False
        return web.json_response({"kind": "Status", "status": "Success"})


def gated(name: str, namespace: str = "ns", *, phase: str = "Pending", deleting: bool = False) -> dict[str, Any]:
    pod = qos_pod(name, gated=True)
    pod["metadata"]["namespace"] = namespace
    pod["spec"]["schedulingGates"] = [{"name": "example.com/other"}, {"name": GATE}]  # ours second: index 1
    pod["status"]["phase"] = phase
    if deleting:
        pod["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:01Z"
    return pod


@pytest.fixture
async def cluster() -> AsyncIterator[tuple[FakeCluster, Any]]:
    fake = FakeCluster(pods={})
    app = web.Application()
    app.router.add_get("/api/v1/pods", fake.list_pods)
    app.router.add_patch("/api/v1/namespaces/{namespace}/pods/{name}", fake.patch)
    path = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/{name}"
    app.router.add_delete(path, fake.delete_webhook)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    client = k8s.ApiClient(configuration=k8s.Configuration(host=f"http://127.0.0.1:{server.port}"))
    yield fake, client
    await client.close()
    await server.close()


async def test_ungate_deletes_the_webhook_then_releases_every_gated_pod(cluster: tuple[FakeCluster, Any]) -> None:
    fake, client = cluster
    released_before = qos_pod("running")  # no gate: untouched
    released_before["metadata"]["namespace"] = "ns"
    fake.pods = {
        "a/one": gated("one", "a"),
        "b/two": gated("two", "b"),
        "b/three": gated("three", "b"),
        "c/done": gated("done", "c", phase="Succeeded"),  # terminal: the API server refuses spec changes
        "c/going": gated("going", "c", deleting=True),
        "ns/running": released_before,
    }
    fake.change_once = {"b/two"}  # changed between the list and the PATCH: released by the next round
    fake.admit_during_delete = gated("late", "d")  # gated while the webhook was being deleted
    result = await ungate(client, GATE, rounds=5)
    assert result.webhook_deleted and not fake.webhook
    assert sorted(result.released) == ["a/one", "b/three", "b/two", "d/late"]
    assert result.left == []
    for key in ("a/one", "b/two", "b/three", "d/late"):
        assert fake.pods[key]["spec"]["schedulingGates"] == [{"name": "example.com/other"}]  # only ours removed
    assert fake.pods["c/done"]["spec"]["schedulingGates"][1] == {"name": GATE}
    assert "ns/running" not in fake.patches and "c/going" not in fake.patches
    # run again (the hook retried, or by hand): nothing to do, the missing webhook is fine
    again = await ungate(client, GATE)
    assert again.released == [] and again.left == [] and not again.webhook_deleted


async def test_ungate_reports_pods_it_could_not_release(cluster: tuple[FakeCluster, Any]) -> None:
    fake, client = cluster
    fake.pods = {"a/stuck": gated("stuck", "a")}
    fake.change_once = {"a/stuck"}
    result = await ungate(client, GATE, rounds=1, webhook=None)
    assert result.released == [] and result.left == ["a/stuck"]
    assert fake.webhook  # webhook=None: kept


async def test_ungate_dry_run_changes_nothing(cluster: tuple[FakeCluster, Any]) -> None:
    fake, client = cluster
    fake.pods = {"a/one": gated("one", "a")}
    result = await ungate(client, GATE, dry_run=True)
    assert result.released == ["a/one"] and fake.patches == [] and fake.webhook


def test_ungate_command_refuses_bad_arguments(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["ungate", "--rounds", "0"]) == 2
    assert "--rounds must be at least 1" in capsys.readouterr().err
