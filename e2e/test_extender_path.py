"""Which pods reach the extender: qos-scheduler pods (with the routing marker) are filtered, scored and bound
by it — visible in its /metrics and, scraped, in Prometheus; default-scheduler pods never touch it."""

from __future__ import annotations

import pytest

from e2e.conftest import MARKER, Cluster, Run, counter, eventually

pytestmark = [pytest.mark.live]

VERBS = ("filter", "prioritize", "bind")


def _verb_counts(cluster: Cluster) -> dict[str, float]:
    m = cluster.metrics()
    return {v: counter(m, "qos_extender_requests_total", verb=v) for v in (*VERBS, "preempt")}


def test_qos_pod_is_filtered_scored_and_bound_by_the_extender(unordered_run: Run) -> None:
    # Not gated (see unordered_run): a pod the controller released would be pinned to one host, and kube-scheduler
    # skips prioritize for a single feasible node.
    run = unordered_run
    run.node("svc-a", "service")
    run.node("svc-b", "service")
    run.wait_nodes_ready()
    before = _verb_counts(run.cluster)
    run.create(run.pod("qos-1", cls="silver"))
    node = run.wait_bound("qos-1")["qos-1"]
    assert node in run.nodes
    after = _verb_counts(run.cluster)
    for verb in VERBS:  # two feasible nodes: prioritize is called too (it is skipped for a single node)
        assert after[verb] >= before[verb] + 1, (verb, before, after)
    bind_events = [
        e for e in run.kube.events(run.ns) if e["involvedObject"].get("name") == "qos-1" and e["reason"] == "Scheduled"
    ]
    assert bind_events and "qos-scheduler" in (
        bind_events[0].get("reportingComponent") or bind_events[0].get("source", {}).get("component", "")
    ), bind_events


def test_admission_gates_and_marks_and_the_controller_releases(run: Run) -> None:
    """The real API server calls the admission webhook without a client certificate: the pod comes out gated,
    annotated for the default controller instance and carrying the routing marker (the test did not add it);
    the controller releases it pinned to a host with a QoSReleased Event, and kube-scheduler binds it there
    through the extender."""
    run.node("svc-a", "service")
    run.node("svc-b", "service")
    run.wait_nodes_ready()
    before = _verb_counts(run.cluster)
    run.create(run.pod("gated-1", cls="gold", marker=False))
    node = run.wait_bound("gated-1")["gated-1"]
    pod = run.pods()["gated-1"]
    assert pod["metadata"]["annotations"]["qos.kube-qos-extender.io/controller"] == "default"
    assert pod["spec"]["containers"][0]["resources"]["requests"][MARKER] == "1"
    assert not pod["spec"].get("schedulingGates")
    terms = pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert terms["nodeSelectorTerms"][0]["matchFields"][0]["values"] == [node]  # pinned where it was bound
    released = eventually(
        lambda: [
            e
            for e in run.kube.events(run.ns)
            if e["involvedObject"].get("name") == "gated-1" and e["reason"] == "QoSReleased"
        ],
        "the controller's QoSReleased Event",
    )
    assert "Q=" in released[0]["message"]
    after = _verb_counts(run.cluster)
    assert after["filter"] >= before["filter"] + 1 and after["bind"] >= before["bind"] + 1, (before, after)


def test_default_scheduler_pod_never_reaches_the_extender(run: Run) -> None:
    run.node("svc-a", "service")
    run.wait_nodes_ready()
    before = _verb_counts(run.cluster)
    run.create(run.pod("plain-1", qos=False))
    assert run.wait_bound("plain-1")["plain-1"] in run.nodes
    # A qos pod afterwards proves the extender was up and counting all along.
    run.create(run.pod("qos-after"))
    run.wait_bound("qos-after")
    after = _verb_counts(run.cluster)
    assert after["filter"] == before["filter"] + 1, (before, after)
    assert after["bind"] == before["bind"] + 1, (before, after)


def test_prometheus_scrapes_the_extender_verbs(run: Run) -> None:
    run.node("svc-a", "service")
    run.wait_nodes_ready()
    run.create(run.pod("qos-prom"))
    run.wait_bound("qos-prom")
    local = counter(run.cluster.metrics(), "qos_extender_requests_total", verb="bind", outcome="ok")

    def scraped() -> float:
        result = run.cluster.prom('sum(qos_extender_requests_total{job="kube-qos-extender",verb="bind",outcome="ok"})')
        return float(result[0]["value"][1]) if result else 0.0

    # Scrape interval 5 s: Prometheus catches up with what the extender counted.
    eventually(lambda: scraped() >= local, f"Prometheus to show >= {local} binds", timeout=30)
    up = run.cluster.prom('up{job="kube-qos-extender"}')
    assert up and up[0]["value"][1] == "1", up
    latency = run.cluster.prom(
        "histogram_quantile(0.99, sum by (le, verb) (rate(qos_extender_request_duration_seconds_bucket[5m])))"
    )
    assert {r["metric"].get("verb") for r in latency} >= {"filter", "bind"}, latency
