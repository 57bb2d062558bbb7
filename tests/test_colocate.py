"""Admission of opted-in batch pods onto the slack (issue 16): extender.webhook.colocate rewrites cpu/memory
requests into batch-cpu/batch-memory, leaves every other pod unchanged with a warning saying why, and
composes with the admission webhook's gate and marker; a malformed annotation is a pod problem (Event)."""

from __future__ import annotations

import base64
import copy
from typing import Any

import orjson
from hypothesis import given
from hypothesis import strategies as st

from extender.colocation.controller import BATCH_CPU, BATCH_MEMORY
from extender.core.model import DEFAULT_CLASSES
from extender.kube.convert import COLOCATE_KEY, pod_settings
from extender.settings.extender import ColocateConfig, ControllerConfig, ExtenderConfig, PodDefaults, SlackConfig
from extender.webhook.admission import review
from extender.webhook.colocate import colocate

GI = 2**30
ON = ColocateConfig(enabled=True, classes=("bronze",))
CFG = ExtenderConfig(
    controller=ControllerConfig(enabled=True),
    slack=SlackConfig(enabled=True, colocate=ColocateConfig(enabled=True, classes=("bronze",))),
)


def pod(
    value: str | None = "true",
    cls: str = "bronze",
    kind: str = "batch",
    resources: dict[str, Any] | None = None,
    scheduler: str = "qos-scheduler",
) -> dict[str, Any]:
    ann = {"qos.kube-qos-extender.io/class": cls, "qos.kube-qos-extender.io/kind": kind}
    if value is not None:
        ann[COLOCATE_KEY] = value
    res = {"requests": {"cpu": "500m", "memory": "1Gi"}} if resources is None else resources
    return {
        "metadata": {"name": "p", "namespace": "ns", "annotations": ann},
        "spec": {"schedulerName": scheduler, "containers": [{"name": "c", "image": "x", "resources": res}]},
    }


def apply(doc: dict[str, Any], ops: list[dict[str, Any]]) -> dict[str, Any]:
    """RFC 6902 add/replace (all the webhook emits), applied in order."""
    out = copy.deepcopy(doc)
    for op in ops:
        assert op["op"] in ("add", "replace")
        *parents, last = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].split("/")[1:]]
        target: Any = out
        for p in parents:
            target = target[int(p)] if isinstance(target, list) else target[p]
        if isinstance(target, list):
            target.insert(len(target) if last == "-" else int(last), op["value"])
        else:
            assert op["op"] == "add" or last in target
            target[last] = op["value"]
    return out


def answer(p: dict[str, Any], config: ExtenderConfig = CFG) -> dict[str, Any]:
    body = {"request": {"uid": "u", "kind": {"kind": "Pod"}, "operation": "CREATE", "object": p}}
    response: dict[str, Any] = review(body, config)["response"]
    return response


def patched(p: dict[str, Any], config: ExtenderConfig = CFG) -> dict[str, Any]:
    r = answer(p, config)
    return apply(p, orjson.loads(base64.b64decode(r["patch"]))) if "patch" in r else p


def test_an_opted_in_bronze_batch_pod_requests_the_slack_instead() -> None:
    got = colocate(pod(), ON, CFG)
    assert got.warnings == ()
    res = got.pod["spec"]["containers"][0]["resources"]
    assert res == {
        "requests": {BATCH_CPU: "500", BATCH_MEMORY: str(GI)},
        "limits": {BATCH_CPU: "500", BATCH_MEMORY: str(GI)},  # extended resources: requests == limits
    }
    assert apply(pod(), list(got.ops)) == got.pod


def test_limits_go_too_and_a_missing_request_falls_back_to_the_limit() -> None:
    p = pod(resources={"requests": {"cpu": "1", "ephemeral-storage": "1Gi"}, "limits": {"cpu": "2", "memory": "2Gi"}})
    res = colocate(p, ON, CFG).pod["spec"]["containers"][0]["resources"]
    assert res["requests"] == {"ephemeral-storage": "1Gi", BATCH_CPU: "1000", BATCH_MEMORY: str(2 * GI)}
    assert res["limits"] == {BATCH_CPU: "1000", BATCH_MEMORY: str(2 * GI)}  # no cpu/memory limit left


def test_every_other_pod_is_left_as_it_is_with_the_reason() -> None:
    cases = {
        "absent": (pod(None), None),
        "false": (pod("false"), None),
        "malformed": (pod("yes please"), 'expected "true" or "false"'),
        "gold": (pod(cls="gold"), "class gold may not co-locate"),
        "service": (pod(kind="service"), "only batch pods"),
        "no request": (pod(resources={}), "no cpu or memory request"),
    }
    for name, (p, why) in cases.items():
        got = colocate(p, ON, CFG)
        assert got.pod is p and got.ops == (), name
        assert (why is None) == (got.warnings == ()), name
        if why is not None:
            assert why in got.warnings[0] and COLOCATE_KEY in got.warnings[0], name
    off = colocate(pod(), ColocateConfig(), CFG)
    assert off.ops == () and "co-location is off" in off.warnings[0]


def test_a_bad_quantity_is_left_alone() -> None:
    got = colocate(pod(resources={"requests": {"cpu": "lots"}}), ON, CFG)
    assert got.ops == () and "not co-located" in got.warnings[0]


def test_a_malformed_value_is_a_pod_problem_reported_as_an_event() -> None:
    problems = pod_settings(pod("maybe"), PodDefaults(), DEFAULT_CLASSES).problems
    assert [p.key for p in problems] == [COLOCATE_KEY] and "not co-located" in problems[0].message
    assert pod_settings(pod("TRUE"), PodDefaults(), DEFAULT_CLASSES).problems == ()


def test_the_webhook_moves_the_pod_then_gates_and_marks_it() -> None:
    for resources in ({"requests": {"cpu": "500m", "memory": "1Gi"}}, {"limits": {"cpu": "500m", "memory": "1Gi"}}):
        out = patched(pod(resources=resources))
        res = out["spec"]["containers"][0]["resources"]
        marker = "qos.kube-qos-extender.io/managed"
        want = {BATCH_CPU: "500", BATCH_MEMORY: str(GI), marker: "1"}
        assert res == {"requests": want, "limits": want}, resources
        assert out["spec"]["schedulingGates"] == [{"name": "qos.kube-qos-extender.io/ordering"}]
    # a default-scheduler pod is not gated nor marked, but moved all the same
    out = patched(pod(scheduler="default-scheduler"))
    assert out["spec"]["containers"][0]["resources"]["requests"] == {BATCH_CPU: "500", BATCH_MEMORY: str(GI)}
    assert "schedulingGates" not in out["spec"]


def test_the_webhook_warns_and_changes_nothing_of_the_resources_otherwise() -> None:
    r = answer(pod("ja"))
    assert r["allowed"] is True and 'expected "true" or "false"' in r["warnings"][0]
    res = patched(pod("ja"))["spec"]["containers"][0]["resources"]
    assert res["requests"] == {"cpu": "500m", "memory": "1Gi", "qos.kube-qos-extender.io/managed": "1"}
    assert "patch" not in answer(pod("ja", scheduler="default-scheduler"))
    off = CFG.model_copy(update=dict(slack=SlackConfig()))  # the shipped default: co-location off
    assert "co-location is off" in answer(pod(), off)["warnings"][0]
    assert "warnings" not in answer(pod(None))


@given(
    st.dictionaries(
        st.sampled_from(["cpu", "memory", "nvidia.com/gpu"]),
        st.sampled_from(["1", "250m", "1Gi", "3", "0"]),
        max_size=3,
    ),
    st.dictionaries(st.sampled_from(["cpu", "memory"]), st.sampled_from(["2", "2Gi", "500m"]), max_size=2),
)
def test_no_cpu_or_memory_survives_and_batch_requests_equal_limits(req: dict[str, str], lim: dict[str, str]) -> None:
    got = colocate(pod(resources={"requests": req, "limits": lim}), ON, CFG)
    if not ({"cpu", "memory"} & (req.keys() | lim.keys())):
        assert got.ops == ()
        return
    res = got.pod["spec"]["containers"][0]["resources"]
    assert not {"cpu", "memory"} & (res["requests"].keys() | res["limits"].keys())
    for name in (BATCH_CPU, BATCH_MEMORY):
        assert res["requests"].get(name) == res["limits"].get(name)
