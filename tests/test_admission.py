"""POST /admission/mutate: AdmissionReview v1 in, JSONPatch out; bad bodies get 400, never 500."""

from __future__ import annotations

import base64
from typing import Any

import orjson
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from hypothesis import given, settings
from hypothesis import strategies as st

from extender.settings.extender import ControllerConfig, ExtenderConfig
from extender.webhook.admission import ADMISSION_PATH, add_admission_route, review

GATE = "qos.kube-qos-extender.io/ordering"
ON = ExtenderConfig(controller=ControllerConfig(enabled=True))


def admission(pod: dict[str, Any], operation: str = "CREATE") -> dict[str, Any]:
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "u-1",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "operation": operation,
            "object": pod,
        },
    }


def qos_pod(scheduler: str = "qos-scheduler") -> dict[str, Any]:
    return {
        "metadata": {"name": "p"},
        "spec": {"schedulerName": scheduler, "containers": [{"name": "c", "image": "x"}]},
    }


def patch_of(answer: dict[str, Any]) -> list[dict[str, Any]]:
    resp = answer["response"]
    assert resp["allowed"] is True and resp["uid"] == "u-1"
    if "patch" not in resp:
        return []
    assert resp["patchType"] == "JSONPatch"
    ops: list[dict[str, Any]] = orjson.loads(base64.b64decode(resp["patch"]))
    return ops


MARKER = "qos.kube-qos-extender.io/managed"
INSTANCE = {"op": "add", "path": "/metadata/annotations", "value": {"qos.kube-qos-extender.io/controller": "default"}}
MARKED = {
    "op": "add",
    "path": "/spec/containers/0/resources",
    "value": {"requests": {MARKER: "1"}, "limits": {MARKER: "1"}},
}


def test_qos_pod_gets_gate_instance_and_marker() -> None:
    assert ON.scheduling.marker_resource == MARKER
    ops = patch_of(review(admission(qos_pod()), ON))
    assert ops == [{"op": "add", "path": "/spec/schedulingGates", "value": [{"name": GATE}]}, INSTANCE, MARKED]


def test_other_pods_and_updates_pass_unchanged() -> None:
    assert patch_of(review(admission(qos_pod("default-scheduler")), ON)) == []
    assert patch_of(review(admission(qos_pod(), "UPDATE"), ON)) == []


def test_disabled_controller_still_routes_but_never_gates() -> None:
    assert patch_of(review(admission(qos_pod()), ExtenderConfig())) == [MARKED]
    off = ExtenderConfig(scheduling=ExtenderConfig().scheduling.model_copy(update=dict(marker_resource=None)))
    assert patch_of(review(admission(qos_pod()), off)) == []


def test_no_marker_when_configured_off() -> None:
    cfg = ON.model_copy(update=dict(scheduling=ON.scheduling.model_copy(update=dict(marker_resource=None))))
    ops = patch_of(review(admission(qos_pod()), cfg))
    assert ops == [{"op": "add", "path": "/spec/schedulingGates", "value": [{"name": GATE}]}, INSTANCE]


def test_instance_annotation_is_set_or_replaced() -> None:
    cfg = ON.model_copy(update=dict(controller=ON.controller.model_copy(update=dict(instance="canary"))))
    pod = qos_pod()
    pod["metadata"]["annotations"] = {"a": "b", "qos.kube-qos-extender.io/controller": "default"}
    ops = patch_of(review(admission(pod), cfg))
    assert {
        "op": "add",
        "path": "/metadata/annotations/qos.kube-qos-extender.io~1controller",
        "value": "canary",
    } in ops


async def _client() -> TestClient[web.Request, web.Application]:
    app = web.Application()
    add_admission_route(app, ON)
    client = TestClient(TestServer(app))
    await client.start_server()
    return client


async def test_route_answers_reviews_and_rejects_garbage() -> None:
    client = await _client()
    try:
        r = await client.post(ADMISSION_PATH, data=orjson.dumps(admission(qos_pod())))
        assert r.status == 200
        assert patch_of(await r.json())
        for bad in (b"", b"not json", b"[]", b'{"request": {}}', b'{"request": {"uid": 3}}'):
            r = await client.post(ADMISSION_PATH, data=bad)
            assert r.status == 400, bad
            assert "Error" in await r.json()
    finally:
        await client.close()


@settings(max_examples=200, deadline=None)
@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(max_size=5),
        lambda kids: (
            st.lists(kids, max_size=3)
            | st.dictionaries(
                st.sampled_from(
                    ["spec", "schedulerName", "containers", "resources", "schedulingGates", "name", "requests"]
                ),
                kids,
                max_size=4,
            )
        ),
        max_leaves=15,
    )
)
def test_fuzzed_pods_never_crash(pod: Any) -> None:
    body = admission(pod if isinstance(pod, dict) else {"spec": pod})
    try:
        answer = review(body, ON)
    except ValueError:
        return
    assert answer["response"]["allowed"] is True
