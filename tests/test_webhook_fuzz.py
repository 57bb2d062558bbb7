"""Hypothesis fuzz of all four verbs over HTTP, and of the snapshot's watch-event input.

Bodies are real kube-scheduler requests (tests/golden/) with random parts replaced, removed or retyped, plus
free-form JSON. Whatever arrives, the answer is 200 with a well-formed protocol body or 4xx with a JSON
Error: never a 500, never a crash, never a node or victim that was not in the request.
"""

from __future__ import annotations

import asyncio
import copy
import os
from collections.abc import Iterator
from typing import Any

import orjson
import pytest
from aiohttp.test_utils import TestClient, TestServer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from extender.kube.snapshot import RequestPods, Snapshot
from extender.settings.extender import ExtenderConfig
from extender.webhook.app import INTERNAL_ERROR_PREFIX, make_app
from extender.webhook.metrics import Metrics
from tests.golden.replay import FULL_LOG, NODECACHE_LOG, load_log, node_objects
from tests.test_webhook_app import NOW, ScriptedBinder, synced_snapshot

CONFIG = ExtenderConfig()
GOLDEN: dict[str, list[dict[str, Any]]] = {}
for _path in (FULL_LOG, NODECACHE_LOG):
    for _e in load_log(_path):
        GOLDEN.setdefault(_e["verb"], []).append(_e["request"])

KEYS = [
    "Pod", "Nodes", "NodeNames", "items", "metadata", "name", "namespace", "uid", "spec", "containers",
    "resources", "requests", "cpu", "memory", "pods", "priority", "annotations", "labels", "nodeName",
    "NodeNameToVictims", "NodeNameToMetaVictims", "Pods", "UID", "NumPDBViolations", "PodName", "PodNamespace",
    "PodUID", "Node", "initContainers", "overhead", "status", "allocatable", "restartPolicy",
    "qos.kube-qos-extender.io/class", "qos.kube-qos-extender.io/kind", "qos.kube-qos-extender.io/runtime-seconds",
]  # fmt: skip

scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12)
    | st.sampled_from(["node-1", "node-9", "100m", "1Gi", "-1", "1e400", "batch", "gold", "true", "Always", ""])
)
json_values = st.recursive(
    scalars,
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(st.sampled_from(KEYS) | st.text(max_size=8), children, max_size=5)
    ),
    max_leaves=16,
)


def _paths(obj: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    yield prefix
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _paths(v, (*prefix, k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _paths(v, (*prefix, i))


def _mutate(body: Any, data: st.DataObject) -> Any:
    for _ in range(data.draw(st.integers(1, 3), label="mutations")):
        paths = [p for p in _paths(body) if p]
        if not paths:
            return data.draw(json_values, label="whole body")
        path = data.draw(st.sampled_from(paths), label="path")
        parent = body
        for step in path[:-1]:
            parent = parent[step]
        last = path[-1]
        action = data.draw(st.sampled_from(["replace", "delete", "null", "duplicate"]), label="action")
        if action == "delete":
            del parent[last]
        elif action == "null":
            parent[last] = None
        elif action == "duplicate" and isinstance(parent, list):
            parent.append(copy.deepcopy(parent[last]))
        else:
            parent[last] = data.draw(json_values, label="value")
    return body


class Harness:
    """One app on 127.0.0.1, driven from synchronous hypothesis tests through a private event loop."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.snapshot = synced_snapshot()
        pod_a = copy.deepcopy(GOLDEN["filter"][0]["Pod"])
        pod_a["spec"]["nodeName"] = "node-1"
        self.snapshot.apply_pod("MODIFIED", pod_a, now=NOW)
        self.metrics = Metrics()
        # kube-scheduler's listener (loopback): on the main one without a client CA /bind is refused outright
        app = make_app(CONFIG, self.snapshot, ScriptedBinder(fail="refused by the scripted binder"),
                       metrics=self.metrics, clock=lambda: NOW, verbs_only=True)  # fmt: skip
        self.client: TestClient[Any, Any] = TestClient(TestServer(app, host="127.0.0.1"), loop=self.loop)
        self.loop.run_until_complete(self.client.start_server())

    def post(self, verb: str, body: bytes) -> tuple[int, Any]:
        # Request Pods are parsed once per UID + resourceVersion (an API server guarantee: one version, one
        # content); fuzzed bodies change content under the same version, so each example starts uncached.
        self.snapshot.request_pods = RequestPods()

        async def go() -> tuple[int, Any]:
            resp = await self.client.post(f"/{verb}", data=body)
            return resp.status, orjson.loads(await resp.read())

        return self.loop.run_until_complete(go())

    def close(self) -> None:
        self.loop.run_until_complete(self.client.close())
        self.loop.close()


@pytest.fixture(scope="module")
def harness() -> Iterator[Harness]:
    h = Harness()
    yield h
    h.close()


def _input_nodes(body: Any) -> set[str]:
    names: set[str] = set()
    if isinstance(body, dict):
        nn = body.get("NodeNames")
        if isinstance(nn, list):
            names |= {n for n in nn if isinstance(n, str)}
        nodes = body.get("Nodes")
        if isinstance(nodes, dict) and isinstance(nodes.get("items"), list):
            for item in nodes["items"]:
                if isinstance(item, dict) and isinstance(item.get("metadata"), dict):
                    names.add(str(item["metadata"].get("name")))
    return names


def _input_uids(body: Any) -> set[str]:
    uids: set[str] = set()
    for key in ("NodeNameToMetaVictims", "NodeNameToVictims"):
        victims = body.get(key) if isinstance(body, dict) else None
        if not isinstance(victims, dict):
            continue
        for v in victims.values():
            for p in v.get("Pods") or [] if isinstance(v, dict) else []:
                if isinstance(p, dict):
                    uids.add(str(p.get("UID")))
                    if isinstance(p.get("metadata"), dict):
                        uids.add(str(p["metadata"].get("uid")))
    return uids


def check(verb: str, body: Any, status: int, answer: Any) -> None:
    assert status in (200, 400), (status, answer)
    if status == 400:
        assert verb in ("prioritize", "preempt"), (verb, answer)  # filter and bind answer errors in-band
        assert isinstance(answer, dict) and isinstance(answer["Error"], str) and answer["Error"]
        return
    if verb in ("filter", "bind") and answer["Error"]:
        assert isinstance(answer["Error"], str)
        # a crash is answered in-band too (200, Error set): the app's catch-all text must never appear
        assert not answer["Error"].startswith(INTERNAL_ERROR_PREFIX), (verb, answer)
        if verb == "filter":
            assert answer["Nodes"] is None and answer["NodeNames"] is None
        return
    if verb == "filter":
        assert set(answer) == {"Nodes", "NodeNames", "FailedNodes", "FailedAndUnresolvableNodes", "Error"}
        passed = answer["NodeNames"] if answer["NodeNames"] is not None else [
            n["metadata"]["name"] for n in answer["Nodes"]["items"]
        ]  # fmt: skip
        given_nodes = _input_nodes(body)
        assert set(passed) <= given_nodes
        assert set(answer["FailedNodes"]) | set(answer["FailedAndUnresolvableNodes"]) <= given_nodes
        assert not set(passed) & set(answer["FailedNodes"])
    elif verb == "prioritize":
        assert isinstance(answer, list)
        assert all(0 < h["Score"] <= 10 and h["Host"] in _input_nodes(body) for h in answer)
    elif verb == "preempt":
        out = answer["NodeNameToMetaVictims"]
        assert set(out) <= set(body.get("NodeNameToMetaVictims") or body.get("NodeNameToVictims") or {})
        assert all(v["Pods"] for v in out.values())  # kube-scheduler rejects empty victim lists
        assert {p["UID"] for v in out.values() for p in v["Pods"]} <= _input_uids(body)
    else:
        assert set(answer) == {"Error"} and isinstance(answer["Error"], str)


# FUZZ_EXAMPLES=2500 for a longer run (done before each commit touching the verbs).
FUZZ = settings(
    max_examples=int(os.environ.get("FUZZ_EXAMPLES", "150")),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)


@pytest.mark.parametrize("verb", ["filter", "prioritize", "preempt", "bind"])
@FUZZ
@given(data=st.data())
def test_fuzz_mutated_golden_bodies(harness: Harness, verb: str, data: st.DataObject) -> None:
    body = copy.deepcopy(data.draw(st.sampled_from(GOLDEN[verb]), label="golden"))
    body = _mutate(body, data)
    status, answer = harness.post(verb, orjson.dumps(body))
    check(verb, body, status, answer)


@pytest.mark.parametrize("verb", ["filter", "prioritize", "preempt", "bind"])
@FUZZ
@given(body=json_values)
def test_fuzz_free_form_json(harness: Harness, verb: str, body: Any) -> None:
    status, answer = harness.post(verb, orjson.dumps(body))
    check(verb, body, status, answer)


POD_A_UID = GOLDEN["filter"][0]["Pod"]["metadata"]["uid"]


@FUZZ
@given(
    body=st.fixed_dictionaries(
        {
            "PodName": st.sampled_from(["pod-a", "low-1", ""]) | st.text(max_size=8),
            "PodNamespace": st.sampled_from(["default", "kube-system"]) | st.text(max_size=8),
            "PodUID": st.sampled_from([POD_A_UID, ""]) | st.uuids().map(str),
            "Node": st.sampled_from(["node-1", "node-3", "node-9"]) | st.text(max_size=8),
        }
    )
)
def test_fuzz_bind_field_values(harness: Harness, body: dict[str, str]) -> None:
    status, answer = harness.post("bind", orjson.dumps(body))
    check("bind", body, status, answer)
    if status == 200 and answer["Error"] == "":
        # The one success without the binder: pod-a is bound to node-1 in the snapshot (the Binding exists, a
        # retried bind is answered as done). Anything else means the binder was skipped (it refuses every bind).
        pod_a_again = (body["PodNamespace"], body["PodName"], body["Node"]) == ("default", "pod-a", "node-1")
        if not (pod_a_again and body["PodUID"] in (POD_A_UID, "")):
            raise AssertionError("the scripted binder refuses every bind: success would mean it was skipped")


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(raw=st.binary(max_size=64))
def test_fuzz_raw_bytes(harness: Harness, raw: bytes) -> None:
    for verb in ("filter", "bind"):
        status, answer = harness.post(verb, raw)
        assert status in (200, 400)
        assert isinstance(answer, (dict, list))


@pytest.mark.parametrize("verb", ["filter", "bind"])
def test_check_catches_a_crash_answered_in_band(verb: str) -> None:
    """filter and bind answer a crash 200 with Error set, like any refusal: check() must still see it."""
    message = f"{INTERNAL_ERROR_PREFIX}{verb}; see the extender's log"
    filter_body = {"Nodes": None, "NodeNames": None, "FailedNodes": {}, "FailedAndUnresolvableNodes": {}}
    answer = {**(filter_body if verb == "filter" else {}), "Error": message}
    body = GOLDEN[verb][0]
    with pytest.raises(AssertionError):
        check(verb, body, 200, answer)
    check(verb, body, 200, {**answer, "Error": "bad request: something"})  # a refusal still passes


def test_fuzz_made_no_internal_errors(harness: Harness) -> None:
    text = harness.metrics.exposition().decode()
    assert 'outcome="internal"' not in text


@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_fuzz_watch_events_never_crash_the_snapshot(data: st.DataObject) -> None:
    snap = Snapshot(CONFIG)
    snap.replace_nodes(node_objects(), "1")
    snap.replace_pods([], "1")
    for _ in range(3):
        kind = data.draw(st.sampled_from(["pod", "node"]))
        if kind == "pod":
            obj = _mutate(copy.deepcopy(data.draw(st.sampled_from(GOLDEN["filter"]))["Pod"]), data)
        else:
            obj = _mutate(copy.deepcopy(data.draw(st.sampled_from(node_objects()))), data)
        event = data.draw(st.sampled_from(["ADDED", "MODIFIED", "DELETED"]))
        if kind == "pod":
            snap.apply_pod(event, obj)
        else:
            snap.apply_node(event, obj)
        if data.draw(st.booleans(), label="bind something"):
            pending = [e.pod for e in snap.pods.values() if e.pod.node_name is None]
            if pending and snap.nodes:
                snap.record_bind(pending[0], data.draw(st.sampled_from(sorted(snap.nodes))), now=0.0)
        if data.draw(st.booleans(), label="expire"):
            snap.ledger.expire(now=1e9)
        # The cached node views always show exactly the pods the indexes hold.
        for name in snap.nodes:
            view = snap.node_view(name)
            assert view is not None
            assert sorted(p.key for p in view.pods) == sorted(p.key for p in snap.pods_on(name))
    # Incremental totals stay equal to a recount from scratch.
    for name in snap.nodes:
        requested, count = snap.requested_on(name)
        pods = snap.pods_on(name)
        assert count == len(pods)
        total = pods[0].requests if pods else None
        for p in pods[1:]:
            assert total is not None
            total = total + p.requests
        assert (total.cpu_milli if total else 0) == requested.cpu_milli


def test_exabyte_quantities_saturate_the_node_table_instead_of_crashing_the_watch() -> None:
    """Found by the fuzz test above: a node (or pod) declaring ``1E`` cpu overflowed the int64 columns and the
    watch handler raised. The columns saturate at COLUMN_MAX; the per-node path keeps the exact integers."""
    from extender.kube.snapshot import COLUMN_MAX

    snap = Snapshot(CONFIG)
    nodes = node_objects()
    snap.replace_nodes(nodes, "1")
    snap.replace_pods([], "1")
    huge = copy.deepcopy(nodes[0])
    huge["status"]["allocatable"].update({"cpu": "1E", "memory": "9E", "pods": "9E"})
    snap.apply_node("MODIFIED", huge)
    name = huge["metadata"]["name"]
    table = snap.fresh_table()
    i = table.row[name]
    assert (table.alloc_cpu[i], table.alloc_mem[i], table.alloc_pods[i]) == (COLUMN_MAX, COLUMN_MAX, COLUMN_MAX)
    assert snap.nodes[name].node.allocatable.cpu_milli == 10**21
    pod = copy.deepcopy(GOLDEN["filter"][0]["Pod"])
    pod["spec"]["nodeName"] = name
    for c in pod["spec"]["containers"]:
        c.setdefault("resources", {})["requests"] = {"cpu": "2E", "memory": "9E"}
    snap.apply_pod("ADDED", pod)
    table = snap.fresh_table()
    assert (table.used_cpu[i], table.used_mem[i]) == (COLUMN_MAX, COLUMN_MAX)
