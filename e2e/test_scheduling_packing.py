"""Placement through the real kube-scheduler + our extender: services by BFD, batch pods by time-bin BFD,
and a burst of 200 pods that never over-commits a node."""

from __future__ import annotations

import time
from collections import defaultdict

import pytest

from e2e.conftest import Run, counter
from extender.core.model import cpu_millicores

pytestmark = [pytest.mark.live]


def _settle(run: Run, *names: str) -> None:
    """Pre-placed pods (spec.nodeName) must be Running and in the extender's snapshot before we schedule."""
    run.kube.wait(
        lambda: all(run.pods()[n]["status"].get("phase") == "Running" for n in names),
        f"{names} Running",
        timeout=30,
    )
    time.sleep(0.5)  # the extender's pod watch delivers the Running pods (typically < 50 ms)


def test_services_land_by_best_fit_decreasing(run: Run) -> None:
    a, b, c = run.node("svc-a", "service"), run.node("svc-b", "service"), run.node("svc-c", "service")
    run.wait_nodes_ready()
    run.create(
        run.pod("fill-a", "3", "6Gi", qos=False, node_name=a), run.pod("fill-c", "2", "4Gi", qos=False, node_name=c)
    )
    _settle(run, "fill-a", "fill-c")
    # BFD: the feasible node left with the least memory (then cpu). LeastAllocated would pick svc-b each time.
    expected = [("s1", a), ("s2", c), ("s3", c)]
    for name, node in expected:
        run.create(run.pod(name, "1", "1Gi", kind="service"))
        assert run.wait_bound(name)[name] == node, (name, run.pods()[name]["spec"].get("nodeName"))
    # The default scheduler on the same nodes spreads (LeastAllocated): the contrast the profile is about.
    run.create(run.pod("plain", "100m", "128Mi", qos=False))
    assert run.wait_bound("plain")["plain"] == b


def test_batch_pods_land_by_time_bin_bfd(run: Run) -> None:
    long_ = run.node("bt-long", "batch")
    short = run.node("bt-short", "batch")
    run.node("bt-empty", "batch")
    run.wait_nodes_ready()
    run.create(
        run.pod("run-3600", "1", "1Gi", qos=False, kind="batch", runtime=3600, node_name=long_),
        # bt-short is the tighter node: plain BFD would choose it for everything.
        run.pod("run-600", "2", "4Gi", qos=False, kind="batch", runtime=600, node_name=short),
    )
    _settle(run, "run-3600", "run-600")
    # scaling cycle 300 s: bins long = 11-12, short = 1-2, empty = 0.
    cases = [
        ("b3000", 3000, long_),  # bin 10: no own bin, greater bins ascending -> bt-long (bin 11/12)
        ("b450", 450, short),  # bin 1: own bin or the next greater -> bt-short (bin 1/2), not bt-long
        ("b7200", 7200, long_),  # bin 24: no greater bin, lesser bins descending -> bt-long
    ]
    for name, runtime, node in cases:
        run.create(run.pod(name, "500m", "512Mi", kind="batch", runtime=runtime))
        assert run.wait_bound(name)[name] == node, (name, run.pods()[name]["spec"].get("nodeName"))


def test_burst_of_200_pods_never_overcommits(run: Run) -> None:
    nodes = [run.node(f"burst-{i}", "service") for i in range(4)]  # 4 x 4 CPU
    run.wait_nodes_ready()
    before = run.cluster.metrics()
    pods = [run.pod(f"p{i:03d}", "100m", "64Mi", kind="service") for i in range(200)]
    t0 = time.monotonic()
    run.create(*pods)

    def settled() -> dict[str, list[str]] | None:
        # Pending = unschedulable (kube-scheduler tried) or still behind the QoS controller's ordering gate (the
        # controller releases only what fits). A gated pod also reads PodScheduled=False (SchedulingGated), so
        # settle on "160 bound and the rest pending", then check that nothing more binds.
        bound: dict[str, list[str]] = defaultdict(list)
        pending = 0
        for p in run.pods().values():
            if p["spec"].get("nodeName"):
                bound[p["spec"]["nodeName"]].append(p["metadata"]["name"])
            elif p["spec"].get("schedulingGates") or any(
                c["type"] == "PodScheduled" and c["status"] == "False" for c in p["status"].get("conditions", [])
            ):
                pending += 1
        n = sum(map(len, bound.values()))
        return bound if n >= 160 and n + pending == 200 and len(bound) == 4 else None

    bound = run.kube.wait(settled, "the burst to settle", timeout=180, interval=1.0)
    elapsed = time.monotonic() - t0
    # Exactly what fits: 4 nodes x 4000m / 100m = 160 pods; 40 stay pending.
    total = sum(map(len, bound.values()))
    time.sleep(2)
    again = sum(1 for p in run.pods().values() if p["spec"].get("nodeName"))
    assert total == again == 160, (total, again, {n: len(v) for n, v in bound.items()})
    pods_now = run.pods()
    for node in nodes:
        cpu = sum(
            cpu_millicores(pods_now[n]["spec"]["containers"][0]["resources"]["requests"]["cpu"]) for n in bound[node]
        )
        assert cpu <= 4000, (node, cpu)
    after = run.cluster.metrics()
    binds = counter(after, "qos_extender_requests_total", verb="bind") - counter(
        before, "qos_extender_requests_total", verb="bind"
    )
    assert binds >= 160
    assert counter(after, "qos_extender_bind_failures_total") == counter(before, "qos_extender_bind_failures_total")
    print(f"burst: 160 of 200 pods bound in {elapsed:.1f} s ({160 / elapsed:.0f} pods/s), {binds:.0f} binds")
