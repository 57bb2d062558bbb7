"""Demand handed to cluster-autoscaler as ProvisioningRequests: the loop's side (buys as requests, never removes
nodes, a planned node is done when its pods are bound, CA's failures are planned again) and the request shapes
(one request per group x flavour, one node-shaped pod per planned node, no routing marker). The e2e test with the
real cluster-autoscaler is e2e/test_cluster_autoscaler.py."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from extender.autoscaler.loop import PROVISIONED_BY_LABEL, AutoscalerLoop, ProvisionRequest
from extender.autoscaler.providers.provisioning_request import (
    PLAN_ANNOTATION,
    _adopted,
    chunk_requests,
    pod_template,
    provisioning_request,
)
from extender.autoscaler.settings import (
    CaExpanderSettings,
    NodeReserve,
    ProvisioningRequestSettings,
    parse_autoscaler_config,
)
from extender.autoscaler.view import AutoscalerSnapshot
from extender.core import autoscale
from extender.core.model import NodeGroup, Resources
from extender.settings import SettingsError
from tests.test_autoscaler_loop import CATALOGUE, CONFIG, LARGE, SMALL, counter, loop, node, pod, settings, snap

GI = 2**30
CERT = __file__  # CaExpanderSettings checks that its certificate files exist; these tests never serve TLS


def gpod(name: str, cpu: str = "1", memory: str = "1Gi", **kw: Any) -> dict[str, Any]:
    """A pod the QoS controller holds at its gate (not Unschedulable: kube-scheduler never saw it)."""
    p = pod(name, cpu, memory, unschedulable=False, **kw)
    p["spec"]["schedulingGates"] = [{"name": CONFIG.controller.gate_name}]
    return p


def ca_loop(**kw: Any) -> AutoscalerLoop:
    base: dict[str, Any] = {
        "provider": "cluster-autoscaler",
        "dry_run": True,
        "expander": CaExpanderSettings(cert_file=CERT, key_file=CERT),
    }
    return AutoscalerLoop(settings(**{**base, **kw}), CONFIG.node_groups, name_suffix=counter())


def test_under_cluster_autoscaler_the_loop_buys_as_requests_with_each_nodes_demand() -> None:
    pods = [gpod(f"svc-{i}", "1500m", "1Gi") for i in range(5)]
    s = snap([], pods)
    lp = ca_loop()
    d = lp.step(s, now=100.0)
    want = autoscale.plan_pods(
        [s.pods[f"default/svc-{i}"].pod for i in range(5)], list(CATALOGUE), autoscale.ScoreWeights()
    )
    assert sorted(r.flavour.name for r in d.provision) == sorted(f.name for f, _ in want.nodes)
    for r in d.provision:  # the planned node's pods, summed: what its ProvisioningRequest pod asks
        assert r.requests == Resources.total(s.pods[k].pod.requests for k in r.pods)
        assert r.requests.cpu_milli == 1500 * len(r.pods)
    # a second scan buys nothing more: the pods are covered until they bind
    assert lp.step(s, now=101.0).provision == []


def test_without_provisioning_requests_the_ca_loop_stays_a_dry_run() -> None:
    s = snap([], [gpod("svc-0", "1500m", "1Gi")])
    lp = ca_loop(
        expander=CaExpanderSettings(
            cert_file=CERT, key_file=CERT, provisioning_requests=ProvisioningRequestSettings(enabled=False)
        )
    )
    d = lp.step(s, now=100.0)
    assert d.provision == [] and d.plans and d.plans[0].flavour_counts


def test_the_ca_loop_never_deletes_or_retires_nodes() -> None:
    s = snap([node("empty", SMALL, "service", created="2026-01-01T00:00:00Z")], [])
    lp = ca_loop(idle_seconds=1.0)
    lp.step(s, now=0.0)
    d = lp.step(s, now=10_000.0)
    assert d.delete == [] and d.retire == []


def test_a_planned_node_is_fulfilled_when_its_pods_bound_or_went_never_by_node_name() -> None:
    pods = [gpod("a", "1500m", "1Gi"), gpod("b", "1500m", "1Gi")]
    s = snap([], pods)
    lp = ca_loop()
    d = lp.step(s, now=100.0)
    names = {r.name for r in d.provision}
    # CA's node joins under a name of its own: nothing is fulfilled while the pods wait
    s.apply_node("ADDED", node("ca-node-xyz12", SMALL, "service"))
    assert lp.step(s, now=101.0).fulfilled == []
    s.apply_pod("MODIFIED", pod("a", "1500m", "1Gi", node="ca-node-xyz12", unschedulable=False))
    s.apply_pod("DELETED", gpod("b", "1500m", "1Gi"))
    d2 = lp.step(s, now=130.0)
    assert set(d2.fulfilled) == names
    assert lp.lag_samples[-1] == pytest.approx(30.0)
    assert lp.ledger.entries == ()


def test_demand_ca_failed_is_planned_again_and_adopted_demand_is_not_bought_twice() -> None:
    s = snap([], [gpod("a", "1500m", "1Gi")])
    lp = ca_loop()
    first = lp.step(s, now=100.0).provision
    assert len(first) == 1
    lp.forget_demand([first[0].name])
    again = lp.step(s, now=101.0).provision
    assert len(again) == 1 and again[0].pods == ("default/a",)
    # a restarted sidecar reads its open requests back: the pod stays covered
    fresh = ca_loop()
    fresh.adopt_demand(NodeGroup.SERVICE, again[0].flavour.name, again[0].name, 101.0, ("default/a",))
    assert fresh.step(s, now=102.0).provision == []


def test_cloud_provider_ledger_adoption_keeps_our_requests_and_counts_no_room_twice() -> None:
    s = snap([], [gpod("a", "1500m", "1Gi")])
    lp = ca_loop()
    lp.step(s, now=100.0)
    # CA's own ledger holds, with no pods, the node it boots for our request: not counted a second time
    booting = autoscale.Provisioning("qos-ca-service-s-large-1", LARGE, 100.0, ())
    lp.adopt_ledger(autoscale.ProvisioningLedger((booting,)), {booting.node_name: NodeGroup.SERVICE}, [("n", 3.0)])
    assert [e.pods for e in lp.ledger.entries] == [("default/a",)]
    d = lp.step(s, now=101.0)
    assert d.provision == [] and ("n", 3.0) in d.arrived  # the lag CA's nodes took is still learned
    # a second gated pod is planned: no phantom room on CA's booting node covers it
    s.apply_pod("ADDED", gpod("b", "1500m", "1Gi"), now=100.0)
    assert [r.pods for r in lp.step(s, now=106.0).provision] == [("default/b",)]


def test_only_gated_pods_are_handed_over_unschedulable_ones_are_cas_own() -> None:
    s = snap([], [pod("seen-by-ca", "1500m", "1Gi"), gpod("held", "1500m", "1Gi")])
    assert [k for r in ca_loop().step(s, now=100.0).provision for k in r.pods] == ["default/held"]
    # the lab's kwok provider buys for both (nobody else would)
    assert sorted(k for r in loop().step(s, now=100.0).provision for k in r.pods) == [
        "default/held",
        "default/seen-by-ca",
    ]


def test_no_request_before_our_open_ones_were_listed() -> None:
    s = snap([], [gpod("a", "1500m", "1Gi")])
    lp = ca_loop()
    lp.demand_ready = False  # a restarted sidecar whose LIST of its requests failed so far
    d = lp.step(s, now=100.0)
    assert d.provision == [] and d.plans
    lp.demand_ready = True
    assert len(lp.step(s, now=101.0).provision) == 1


def test_a_request_that_never_reached_ca_does_not_count_against_the_pod() -> None:
    s = snap([], [gpod("a", "1500m", "1Gi")])
    lp = ca_loop(max_attempts_per_pod=1)
    first = lp.step(s, now=100.0).provision
    lp.forget_demand([first[0].name], refund=True)  # the create was refused (CRD missing, RBAC, API down)
    again = lp.step(s, now=101.0)
    assert [r.pods for r in again.provision] == [("default/a",)] and again.gave_up == 0
    lp.forget_demand([again.provision[0].name])  # CA failed it: that one counts
    assert lp.step(s, now=102.0).gave_up == 1


def test_dry_run_under_cluster_autoscaler_hands_nothing_over() -> None:
    from extender.processes.sidecar import ca_mode_settings

    base = settings(provider="cluster-autoscaler", expander=CaExpanderSettings(cert_file=CERT, key_file=CERT))
    live = ca_mode_settings(base)
    assert live.dry_run and live.expander.provreq is not None
    quiet = ca_mode_settings(base.model_copy(update={"dry_run": True}))
    assert quiet.dry_run and quiet.expander.provreq is None
    s = snap([], [gpod("a", "1500m", "1Gi")])
    lp = AutoscalerLoop(quiet, CONFIG.node_groups, name_suffix=counter())
    d = lp.step(s, now=100.0)
    assert d.provision == [] and d.plans and d.plans[0].flavour_counts


def _req(name: str, flavour: Any, group: NodeGroup, pods: tuple[str, ...], cpu: int) -> ProvisionRequest:
    labels = {"qos.kube-qos-extender.io/node-group": group.value, "node.kubernetes.io/instance-type": flavour.name}
    return ProvisionRequest(
        name, flavour, group, {**labels, PROVISIONED_BY_LABEL: "qos-autoscaler"}, pods, Resources(cpu, GI, len(pods))
    )


def test_one_request_per_group_and_flavour_at_most_32_pod_sets() -> None:
    reqs = [_req(f"n{i}", SMALL, NodeGroup.SERVICE, (f"ns/p{i}",), 1000) for i in range(40)]
    reqs += [_req("m", LARGE, NodeGroup.SERVICE, ("ns/q",), 1000), _req("b", SMALL, NodeGroup.BATCH, ("ns/r",), 1)]
    chunks = chunk_requests(reqs)
    assert [len(c) for c in chunks] == [32, 8, 1, 1]
    for c in chunks:
        assert len({(r.group, r.flavour.name) for r in c}) == 1
    assert [r.name for c in chunks for r in c] == [r.name for r in reqs]  # the plan's order is kept


def test_the_template_pins_group_and_flavour_asks_the_sum_and_carries_no_marker() -> None:
    r = _req("n0", LARGE, NodeGroup.BATCH, ("ns/a", "ns/b"), 3500)
    t = pod_template("pt", "kube-qos-system", r)
    spec = t["template"]["spec"]
    assert spec["nodeSelector"] == {
        "qos.kube-qos-extender.io/node-group": "batch",
        "node.kubernetes.io/instance-type": LARGE.name,
    }  # provisioned-by is our mark on nodes we make: a cloud's node group does not carry it
    (c,) = spec["containers"]
    assert c["resources"]["requests"] == {"cpu": "3500m", "memory": str(GI)}
    assert spec["tolerations"] == [{"operator": "Exists"}]
    body = provisioning_request(
        "pr", "kube-qos-system", [r], ["pt"], 12.5, "best-effort-atomic-scale-up.autoscaling.x-k8s.io"
    )
    assert body["spec"]["podSets"] == [{"podTemplateRef": {"name": "pt"}, "count": 1}]
    plan = orjson.loads(body["metadata"]["annotations"][PLAN_ANNOTATION])
    assert plan["nodes"] == [{"name": "n0", "pods": ["ns/a", "ns/b"]}] and plan["requested_at"] == 12.5
    tracked = _adopted("pr", body["metadata"], ["pt"])
    assert tracked is not None and tracked.nodes == {"n0": ("ns/a", "ns/b")} and tracked.group is NodeGroup.BATCH
    assert _adopted("pr", {"annotations": {PLAN_ANNOTATION: "{not json"}}, []) is None
    assert _adopted("pr", {"annotations": {PLAN_ANNOTATION: '{"group": "gpu"}'}}, []) is None


def test_provisioning_request_options_are_validated() -> None:
    def parse(extra: dict[str, Any]) -> Any:
        doc = {
            "autoscaler": {"provider": "kwok", "cluster_autoscaler": {"provisioning_requests": extra}},
            "flavours": [{"name": "s.small", "cpu": "2", "memory": "4Gi", "price_per_hour": 0.1}],
        }
        return parse_autoscaler_config(doc, CONFIG).expander.provreq

    assert parse({}) == ProvisioningRequestSettings()
    assert parse({"enabled": False}) is None
    assert parse({"namespace": "ops", "delivered_grace_seconds": 60}).delivered_grace_seconds == 60
    for bad, word in (
        ({"enabled": "false"}, "enabled"),
        ({"namespace": "Not_A_Namespace"}, "namespace"),
        ({"class_name": "check-capacity.autoscaling.x-k8s.io"}, "class_name"),
        ({"delivered_grace_seconds": 0}, "delivered_grace_seconds"),
        ({"surprise": 1}, "surprise"),
    ):
        with pytest.raises(SettingsError, match=word):
            parse(bad)


def test_gated_pods_are_handed_to_ca_after_the_shorter_gated_demand_seconds() -> None:
    """Under CA a gated pod that fits no node is demand after provisioning_requests.gated_demand_seconds (5 s),
    not the kwok mode's 15 s: while qos demand is hidden, CA's purchases for other pods are taken by it."""
    held = gpod("held", "1", "8Gi")
    s = AutoscalerSnapshot(CONFIG)
    s.replace_nodes([], "1", now=100.0)
    s.apply_pod("ADDED", held, now=100.0)
    assert ca_loop().step(s, now=104.0).provision == []
    assert [k for r in ca_loop().step(s, now=105.0).provision for k in r.pods] == ["default/held"]
    slow = CaExpanderSettings(
        cert_file=CERT, key_file=CERT, provisioning_requests=ProvisioningRequestSettings(gated_demand_seconds=30.0)
    )
    assert ca_loop(expander=slow).step(s, now=120.0).provision == []
    assert loop().step(s, now=105.0).provision == []  # the kwok mode keeps the simulator's 15 s


def test_planned_nodes_keep_room_for_daemonsets_and_the_reserve() -> None:
    """A node packed to the flavour's full capacity never fits CA's template (its system pods): under CA the
    plan leaves the configured reserve plus the most DaemonSet pods any node of ours carries."""
    pods = [gpod(f"p{i}", "1", "1Gi") for i in range(2)]  # 2 x 1 cpu: one s.small (2 cpu) without headroom
    s = snap([], pods)
    assert [len(r.pods) for r in loop().step(s, now=100.0).provision] == [2]
    d = ca_loop().step(s, now=100.0)  # 100m reserve: 1900m left on an s.small
    assert all(r.requests.cpu_milli <= r.flavour.capacity.cpu_milli for r in d.provision)
    assert all(
        r.requests.cpu_milli <= SMALL.capacity.cpu_milli - 100 for r in d.provision if r.flavour.name == SMALL.name
    )
    none = CaExpanderSettings(
        cert_file=CERT,
        key_file=CERT,
        provisioning_requests=ProvisioningRequestSettings(node_reserve=NodeReserve(cpu=0, memory=0)),
    )
    assert [len(r.pods) for r in ca_loop(expander=none).step(s, now=100.0).provision] == [2]
    # a DaemonSet pod of 300m on a node of ours is room every planned node keeps too
    ds = pod("agent-x", "300m", "64Mi", node="n1", unschedulable=False)
    ds["metadata"]["ownerReferences"] = [{"kind": "DaemonSet", "name": "agent", "uid": "d1", "controller": True}]
    s2 = snap([node("n1", SMALL, "batch")], [*pods, ds])
    d2 = ca_loop(expander=none).step(s2, now=100.0)
    assert all(r.requests.cpu_milli <= r.flavour.capacity.cpu_milli - 300 for r in d2.provision)
    assert sum(len(r.pods) for r in d2.provision) == 2


async def test_without_the_provisioning_request_api_nothing_is_requested_and_the_log_says_why(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The default install on a cluster without cluster-autoscaler (no ProvisioningRequest CRD: the API answers 404):
    the sidecar keeps running, requests nothing (never listed), and logs why with the fix -- once per reason and
    again every LIST_FAILED_LOG_SECONDS, not at every scan -- and that it recovered once the CRD is there."""
    from extender.autoscaler.providers import provisioning_request as pr
    from extender.kube.client import ApiError

    now = [1000.0]
    answers: list[Any] = [ApiError(404, "Not Found", "404 page not found\n")]

    class Custom:
        async def list_namespaced_custom_object(self, *args: Any, **kw: Any) -> Any:
            answer = answers[0]
            if isinstance(answer, Exception):
                raise answer

            class Response:
                status = 200

                async def read(self) -> bytes:
                    return orjson.dumps(answer)

                def release(self) -> None:
                    pass

            return Response()

    provider = pr.ProvisioningRequestProvider(object(), "kube-qos-system", clock=lambda: now[0])
    provider._custom = Custom()
    caplog.set_level("INFO", logger=pr.log.name)

    def said(text: str) -> list[str]:
        return [str(getattr(r, "error", r.getMessage())) for r in caplog.records if text in r.getMessage()]

    for _ in range(5):  # five scans, 30 s apart
        assert await provider.sync() == [] and not provider.listed
        now[0] += 30
    (why,) = said("not listed")
    assert "cluster-autoscaler >= 1.35" in why and "autoscaler.mode=off" in why and "provisioningrequests" in why
    now[0] += pr.LIST_FAILED_LOG_SECONDS
    await provider.sync()
    assert len(said("not listed")) == 2  # still failing: said again after a while
    answers[0] = {"items": []}
    assert await provider.sync() == [] and provider.listed
    assert said("listed again")
