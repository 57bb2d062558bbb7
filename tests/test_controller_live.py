"""The QoS controller against a real kube-apiserver + kube-scheduler + kwok (hack/local-up.sh): a gated pod is
released pinned to a host with an Event and a persisted account; a pod no node can hold is released after
``max_gate_seconds`` with a Warning Event and counted; a restart rebuilds the account instead of resetting it;
a second replica stands by while the first holds the Lease and takes over, with the same account, when it dies.

Pods are created already gated (what the admission webhook would do), so this test does not depend on the
webhook's URL; e2e/test_qos_controller.py covers the webhook path. FAILS without KUBECONFIG.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from kubernetes_asyncio import client as k8s

from extender.controller.accounting import ACCOUNT_ANNOTATION
from extender.controller.patches import INSTANCE_ANNOTATION
from extender.kube.client import ApiError, new_api_client, read_json
from extender.processes.webhook import Running, start
from extender.settings.extender import (
    ControllerConfig,
    ExtenderConfig,
    KubernetesConfig,
    LeaderElectionConfig,
    ServerConfig,
)
from tests.live import require_kubeconfig

pytestmark = [pytest.mark.live]

GATE = "qos.kube-qos-extender.io/ordering"


async def _eventually(check: Callable[[], Awaitable[Any]], what: str, timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = await check()
        if got:
            return got
        await asyncio.sleep(0.2)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def _config(kubeconfig: str, run: str, identity: str, requeue_pinned_seconds: float = 60.0) -> ExtenderConfig:
    """A controller instance of its own (``run``), so local-up's default controller never competes for these
    pods; leader election on with a short lease, so the standby takeover fits in the test."""
    base = ExtenderConfig()
    election = LeaderElectionConfig(
        lease_namespace="kube-system",
        identity=identity,
        lease_duration_seconds=4,
        renew_deadline_seconds=3.0,
        retry_period_seconds=1.0,
    )
    return base.model_copy(
        update=dict(
            server=ServerConfig(host="127.0.0.1", port=0),
            kubernetes=KubernetesConfig(kubeconfig=kubeconfig),
            controller=ControllerConfig(
                enabled=True,
                watchdog_seconds=0.5,
                max_gate_seconds=3.0,
                requeue_pinned_seconds=requeue_pinned_seconds,
                instance=run,
                leader_election=election,
            ),
        )
    )


def _pod(name: str, run: str, cpu: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "annotations": {"qos.kube-qos-extender.io/class": "silver", INSTANCE_ANNOTATION: run},
        },
        "spec": {
            "schedulerName": "qos-scheduler",
            "schedulingGates": [{"name": GATE}],
            "terminationGracePeriodSeconds": 0,
            "nodeSelector": {"ctl-live": run},
            "containers": [
                {"name": "c", "image": "registry.invalid/pause:3.10", "resources": {"requests": {"cpu": cpu}}}
            ],
        },
    }


async def test_release_pin_timeout_and_rebuild() -> None:
    kubeconfig = require_kubeconfig()
    run = f"ctl-{uuid.uuid4().hex[:6]}"
    api = await new_api_client(KubernetesConfig(kubeconfig=kubeconfig))
    core = k8s.CoreV1Api(api)
    running: Running | None = None
    try:
        await read_json(await core.create_node(_kwok_node(run, run, "2"), _preload_content=False))
        namespace = {"metadata": {"name": run, "labels": {INSTANCE_ANNOTATION: run}}}  # skipped by local-up's webhook
        await read_json(await core.create_namespace(namespace, _preload_content=False))
        running = await start(_config(kubeconfig, run, "a"))
        await read_json(await core.create_namespaced_pod(run, _pod("fits", run, "500m"), _preload_content=False))
        await read_json(await core.create_namespaced_pod(run, _pod("huge", run, "64"), _preload_content=False))

        async def get(name: str) -> dict[str, Any]:
            body: dict[str, Any] = await read_json(await core.read_namespaced_pod(name, run, _preload_content=False))
            return body

        async def released_and_running() -> dict[str, Any] | None:
            p = await get("fits")
            ok = not p["spec"].get("schedulingGates") and p["status"].get("phase") == "Running"
            return p if ok else None

        fits = await _eventually(released_and_running, "the fitting pod to be released and Running")
        terms = fits["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        assert terms["nodeSelectorTerms"][0]["matchFields"][0]["values"] == [run]  # pinned to the chosen host
        assert fits["spec"]["nodeName"] == run

        async def huge_released() -> bool:
            return not (await get("huge"))["spec"].get("schedulingGates")

        await _eventually(huge_released, "the gate of the unplaceable pod to time out", timeout=20)

        async def events() -> set[str]:
            page = await read_json(await core.list_namespaced_event(run, _preload_content=False))
            return {e["reason"] for e in page["items"]}

        await _eventually(
            lambda: _has(events, {"QoSReleased", "QoSGateTimeout"}), "QoSReleased and QoSGateTimeout Events"
        )
        assert running.controller is not None
        assert running.controller.metrics.gate_timeouts._value.get() == 1

        async def account() -> Any:
            assert running is not None and running.controller is not None
            acc = running.controller.accounts.get(f"{run}/fits")
            return acc if acc is not None and acc.state.value == "running" else None

        acc = await _eventually(account, "the bare pod's account to be running")
        assert acc.class_name == "silver"
        # never preempted, one start: its own timestamps rebuild it (derivable_from_pod), so nothing was written
        await asyncio.sleep(2.5)  # > persist_min_interval_seconds: a write would have happened by now
        assert ACCOUNT_ANNOTATION not in ((await get("fits"))["metadata"].get("annotations") or {})

        # restart: the same identity takes its Lease back at once; the new process rebuilds the account from the
        # pod's timestamps (creation, Ready) and e keeps growing from where it was, within their 1 s granularity
        await running.stop()
        await asyncio.sleep(1.0)
        running = await start(_config(kubeconfig, run, "a"))
        ctl = await _eventually(lambda: _controller(running), "the restarted replica to lead again", timeout=3.0)
        await _eventually(lambda: _passes(ctl), "the restarted controller's first pass")
        rebuilt = ctl.accounts[f"{run}/fits"]
        e, p = rebuilt.ep(time.time())
        assert e >= acc.ep(time.time())[0] - 1.5 and p == pytest.approx(acc.p, abs=1.5)

        # a second replica stands by (no controller, leader gauge 0) while "a" renews the Lease ...
        standby = await start(_config(kubeconfig, run, "b"))
        await asyncio.sleep(6.0)  # longer than the lease: "a" keeps renewing it
        assert standby.controller is None and running.controller is not None
        assert _leader_gauge(standby) == 0 and _leader_gauge(running) == 1
        # ... and takes over when "a" dies without releasing it, rebuilding the same account
        await running.stop()
        running = standby
        ctl = await _eventually(lambda: _controller(standby), "the standby to take over the Lease", timeout=15.0)
        await _eventually(lambda: _passes(ctl), "the new leader's first pass")
        took_over = ctl.accounts[f"{run}/fits"]
        assert took_over.ep(time.time())[0] >= e - 0.5 and took_over.state.value == "running"
        assert _leader_gauge(standby) == 1
    finally:
        await _clean_up(api, running, run, (run,))


def _kwok_node(name: str, run: str, cpu: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {"kwok.x-k8s.io/node": "fake"},
            "labels": {"type": "kwok", "ctl-live": run},
        },
        "status": {
            "allocatable": {"cpu": cpu, "memory": "4Gi", "pods": "110"},
            "capacity": {"cpu": cpu, "memory": "4Gi", "pods": "110"},
        },
    }


async def test_a_pod_pinned_to_a_host_that_filled_up_is_requeued() -> None:
    """The race of issue 27: the controller pinned a released pod to host A, and a pod of another scheduler
    took A's room before kube-scheduler bound ours. Its affinity is immutable, so it would wait for ever; the
    controller re-creates it (bare pod: same name, annotations and spec, gated again, unpinned, without its
    former ProvisioningRequest booking) and releases it to host B, which has room."""
    kubeconfig = require_kubeconfig()
    run = f"ctl-{uuid.uuid4().hex[:6]}"
    api = await new_api_client(KubernetesConfig(kubeconfig=kubeconfig))
    core = k8s.CoreV1Api(api)
    full, free = f"{run}-a", f"{run}-b"
    running: Running | None = None
    try:
        for name in (full, free):
            await read_json(await core.create_node(_kwok_node(name, run, "2"), _preload_content=False))
        namespace = {"metadata": {"name": run, "labels": {INSTANCE_ANNOTATION: run}}}  # skipped by local-up's webhook
        await read_json(await core.create_namespace(namespace, _preload_content=False))
        squatter = {
            "metadata": {"name": "squatter"},
            "spec": {
                "nodeName": full,  # another scheduler's pod, bound first
                "terminationGracePeriodSeconds": 0,
                "containers": [
                    {"name": "c", "image": "registry.invalid/pause:3.10", "resources": {"requests": {"cpu": "1500m"}}}
                ],
            },
        }
        await read_json(await core.create_namespaced_pod(run, squatter, _preload_content=False))
        stuck = _pod("stuck", run, "1")
        stuck["spec"]["schedulingGates"] = []  # released ...
        stuck["spec"]["affinity"] = {  # ... pinned to A, as release_patch leaves it
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [full]}]}
                    ]
                }
            }
        }
        stuck["metadata"]["annotations"]["autoscaling.x-k8s.io/consume-provisioning-request"] = "gone-request"
        stuck["metadata"]["labels"] = {"app": run}
        made = await read_json(await core.create_namespaced_pod(run, stuck, _preload_content=False))

        async def get(name: str) -> dict[str, Any]:
            body: dict[str, Any] = await read_json(await core.read_namespaced_pod(name, run, _preload_content=False))
            return body

        async def unschedulable() -> bool:
            conds = (await get("stuck"))["status"].get("conditions") or []
            return any(c["type"] == "PodScheduled" and c.get("reason") == "Unschedulable" for c in conds)

        await _eventually(unschedulable, "kube-scheduler to find the pinned pod Unschedulable")
        running = await start(_config(kubeconfig, run, "a", requeue_pinned_seconds=2.0))

        async def bound_elsewhere() -> dict[str, Any] | None:
            with contextlib.suppress(ApiError):
                p = await get("stuck")
                return p if p["spec"].get("nodeName") == free else None
            return None

        got = await _eventually(bound_elsewhere, "the stuck pod re-queued and bound on the host with room", 45)
        assert got["metadata"]["uid"] != made["metadata"]["uid"]  # a new pod under the same name
        assert got["metadata"]["labels"] == {"app": run}
        annotations = got["metadata"]["annotations"]
        assert annotations["qos.kube-qos-extender.io/class"] == "silver"
        assert "autoscaling.x-k8s.io/consume-provisioning-request" not in annotations
        terms = got["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        assert terms["nodeSelectorTerms"] == [  # released again by the controller, pinned to B this time
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [free]}]}
        ]

        async def events() -> set[str]:
            page = await read_json(await core.list_namespaced_event(run, _preload_content=False))
            return {e["reason"] for e in page["items"]}

        await _eventually(lambda: _has(events, {"QoSRequeued", "QoSReleased"}), "QoSRequeued and QoSReleased Events")
        assert running.controller is not None
        assert running.controller.metrics.requeued.labels("recreated")._value.get() == 1
        assert (await get("squatter"))["spec"]["nodeName"] == full  # nothing else moved
    finally:
        await _clean_up(api, running, run, (full, free))


async def _clean_up(api: Any, running: Running | None, run: str, nodes: tuple[str, ...]) -> None:
    """Stop the extender, then remove its Lease, the run's namespace and its nodes (each step tolerating a 404)."""
    core = k8s.CoreV1Api(api)
    if running is not None:
        await running.stop()
    with contextlib.suppress(ApiError):
        coordination = k8s.CoordinationV1Api(api)
        await read_json(
            await coordination.delete_namespaced_lease(
                f"kube-qos-extender-{run}", "kube-system", _preload_content=False
            )
        )
    with contextlib.suppress(ApiError):
        await read_json(await core.delete_namespace(run, _preload_content=False))
    for name in nodes:
        with contextlib.suppress(ApiError):
            await read_json(await core.delete_node(name, _preload_content=False))
    await api.close()


async def _has(fn: Callable[[], Awaitable[set[str]]], wanted: set[str]) -> bool:
    return wanted <= await fn()


async def _passes(ctl: Any) -> bool:
    return bool(ctl.passes > 0)


async def _controller(running: Running) -> Any:
    return running.controller


def _leader_gauge(running: Running) -> float:
    value = running.metrics.registry.get_sample_value("qos_extender_controller_leader")
    assert value is not None
    return value
