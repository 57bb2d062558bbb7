"""Preemption through the extender: kube-scheduler proposes victims by priority, the extender keeps only
those the QoS rules allow (paper 002 §3.3.1 + the run quantum), and the preemption happens where allowed."""

from __future__ import annotations

import time

import pytest

from e2e.conftest import Run, counter

pytestmark = [pytest.mark.live]


def test_high_priority_pod_preempts_only_victims_the_qos_rules_allow(run: Run) -> None:
    a = run.node("pre-a", "service", "m1.medium")  # 2 CPU each
    b = run.node("pre-b", "service", "m1.medium")
    run.wait_nodes_ready()
    # pre-a: the LOWEST priority (qos-bronze, 100) but class gold: kube-scheduler's favourite victims, yet
    #   a gold pod may not preempt gold peers (run quantum, no importance relaxation, hysteresis).
    # pre-b: higher priority (qos-silver, 500) but class bronze: a gold preemptor may take them.
    victims_a = [
        run.pod(f"gold-{i}", "1", "1Gi", qos=False, cls="gold", priority_class="qos-bronze", node_name=a)
        for i in range(2)
    ]
    victims_b = [
        run.pod(f"bronze-{i}", "1", "1Gi", qos=False, cls="bronze", priority_class="qos-silver", node_name=b)
        for i in range(2)
    ]
    run.create(*victims_a, *victims_b)
    run.kube.wait(lambda: all(p["status"].get("phase") == "Running" for p in run.pods().values()), "victims Running")
    time.sleep(0.5)
    before = run.cluster.metrics()

    run.create(run.pod("urgent", "1", "1Gi", cls="gold", priority_class="qos-gold"))
    node = run.wait_bound("urgent", timeout=60)["urgent"]

    pods = run.pods()
    assert node == b, f"preempted on {node}: expected {b} (the QoS-allowed victims)"
    assert {"gold-0", "gold-1"} <= set(pods), "gold pods on pre-a must survive"
    survivors_b = {n for n in pods if n.startswith("bronze-") and not pods[n]["metadata"].get("deletionTimestamp")}
    assert len(survivors_b) == 1, f"exactly one bronze victim is needed, survivors: {survivors_b}"
    after = run.cluster.metrics()
    kept = counter(after, "qos_extender_preemption_victims_total", outcome="kept") - counter(
        before, "qos_extender_preemption_victims_total", outcome="kept"
    )
    dropped = counter(after, "qos_extender_preemption_victims_total", outcome="dropped") - counter(
        before, "qos_extender_preemption_victims_total", outcome="dropped"
    )
    assert kept >= 1 and dropped >= 1, (kept, dropped)
