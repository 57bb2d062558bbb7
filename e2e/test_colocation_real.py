"""A batch pod runs on a real node's predicted slack and is moved when the service's usage grows (issue 16,
deliverable 4, second part), on the product cluster of e2e/test_deployed.py (real kubelet nodes, the image,
config/local applied: the in-cluster qos-scheduler with its extender sidecar, the QoS controller and its
admission webhook).

1. A busybox service ``svc`` (500m / 1 GiB requested) runs on the real service node and uses almost nothing.
   Prometheus scrapes the real kubelets' ``/metrics/resource`` (hack/local-up.sh's job ``kubelet-resource``,
   targets written by hack/real-nodes.sh): its working set is read back through ``extender.kube.usage``.
2. The slack controller (run here, against the cluster and that Prometheus, with short intervals: 20 s
   observation, 30 s rate window; the fixture model of e2e/kwok_usage.py) classifies the node's services and
   publishes ``batch-cpu``/``batch-memory`` on the node.
3. A bronze batch pod requesting half of the published batch memory is created for ``qos-scheduler``: the
   in-cluster webhook gates and marks it, the controller releases it, kube-scheduler calls the in-cluster
   extender, whose filter passes the *service* node under ``node_groups.enforce`` on the published prediction
   and which binds it (its filter and bind counters rise, scraped by Prometheus); the pod really runs there.
4. ``svc`` then fills a memory-backed emptyDir (``kubectl exec ... dd``, the steering knob) beyond its request
   by more than everything published: the real slack falls below what the batch pod holds, and the slack
   controller **evicts** it (Eviction API, QoS order) with a ``BatchSlackReclaimed`` Event on the pod; the node
   then publishes no more than the prediction allows. Moved = evicted here; migration through the agent is not
   wired into the slack controller (see the issue note).

Runs with ``-m deployed`` (phase 2 of hack/run-live-tests.sh); fails, never skips, without that cluster.
"""

from __future__ import annotations

import asyncio
import subprocess
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from kubernetes_asyncio import client as k8s
from prometheus_client import CollectorRegistry

from e2e.kwok_usage import controller_settings, fixture_model
from e2e.test_deployed import BUSYBOX, Product, _requests, namespace, product  # noqa: F401  (fixtures)
from extender.colocation.controller import EVICTION_REASON, SlackController, SlackMetrics
from extender.core.model import memory_bytes
from extender.core.slack import BATCH_CPU, BATCH_MEMORY, Amount
from extender.kube.client import new_api_client
from extender.kube.usage import PrometheusUsage
from extender.settings.extender import KubernetesConfig

pytestmark = [pytest.mark.live, pytest.mark.deployed]

GROUP = "qos.kube-qos-extender.io/node-group"
MI = 2**20
# svc's request, large next to the product's own pods on the node (agent, autoscaler: a few hundred MiB and
# millicores whose usage moves), so that what svc lends dominates what the node publishes. They are services too
# (no kind annotation), so their CPU above their requests (an agent restarted by the identity tests just before)
# lowers the node's real slack: svc's CPU is large and the tenant's small, so only svc's growth can evict it.
SVC_MEMORY = 1024 * MI
SVC_CPU = 1000
TENANT_CPU = 10


def _service_node(p: Product) -> str:
    nodes = [n for n in p.real_nodes if p.kube.get(f"/api/v1/nodes/{n}")["metadata"]["labels"].get(GROUP) == "service"]
    assert nodes, "no real service node"
    return nodes[0]


def _svc(node: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "svc",
            "annotations": {"qos.kube-qos-extender.io/kind": "service", "qos.kube-qos-extender.io/class": "gold"},
        },
        "spec": {
            "nodeName": node,
            "terminationGracePeriodSeconds": 0,
            "containers": [
                {
                    "name": "app",
                    "image": BUSYBOX,
                    "imagePullPolicy": "Never",
                    # idle until the test fills /fill (memory-backed: charged to this container's cgroup)
                    "command": ["sh", "-c", "while true; do sleep 5; done"],
                    "resources": {
                        "requests": {"cpu": f"{SVC_CPU}m", "memory": f"{SVC_MEMORY}"},
                        "limits": {"memory": "4Gi"},
                    },
                    "volumeMounts": [{"name": "fill", "mountPath": "/fill"}],
                }
            ],
            "volumes": [{"name": "fill", "emptyDir": {"medium": "Memory", "sizeLimit": "4Gi"}}],
        },
    }


def _tenant(demand_memory: int) -> dict[str, Any]:
    want = {BATCH_CPU: str(TENANT_CPU), BATCH_MEMORY: str(demand_memory)}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "tenant",
            "annotations": {"qos.kube-qos-extender.io/kind": "batch", "qos.kube-qos-extender.io/class": "bronze"},
        },
        "spec": {
            "schedulerName": "qos-scheduler",
            "terminationGracePeriodSeconds": 0,
            "containers": [
                {
                    "name": "c",
                    "image": BUSYBOX,
                    "imagePullPolicy": "Never",
                    "command": ["sh", "-c", "while true; do sleep 5; done"],
                    "resources": {"requests": want, "limits": want},
                }
            ],
        },
    }


def _running(p: Product, ns: str, name: str) -> bool:
    pods = [x for x in p.kube.pods(ns) if x["metadata"]["name"] == name]
    if not pods:
        return False
    return pods[0]["status"].get("phase") == "Running" and not pods[0]["metadata"].get("deletionTimestamp")


async def test_batch_pod_on_a_real_nodes_slack_is_evicted_when_the_service_grows(
    product: Product,  # noqa: F811
    namespace: str,  # noqa: F811
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    p, ns, kube = product, namespace, product.kube
    node = _service_node(p)
    kube.create_pod(ns, _svc(node))
    kube.wait(lambda: _running(p, ns, "svc"), "svc Running on the real service node", timeout=120, interval=1.0)

    # B: the real kubelet's resource metrics reach Prometheus, per container, labelled with the node
    def scraped() -> list[dict[str, Any]] | None:
        return p.prom(f'container_memory_working_set_bytes{{namespace="{ns}",pod="svc",container="app"}}') or None

    (row,) = kube.wait(scraped, "svc's working set scraped from the real kubelet", timeout=90, interval=2.0)
    assert row["metric"].get("job") == "kubelet-resource" and row["metric"].get("node") == node, row["metric"]
    assert 0 < float(row["value"][1]) < SVC_MEMORY / 4, row  # an idle busybox: a few hundred KiB

    settings = controller_settings(tmp_path / "model.json", f"{GROUP}=service")
    registry = CollectorRegistry()
    api = await new_api_client(KubernetesConfig(kubeconfig=p.env["KUBECONFIG"]))
    before = {v: _requests(p, v) for v in ("filter", "bind")}
    try:
        async with aiohttp.ClientSession() as session:
            reader = PrometheusUsage(p.prometheus_url, session, rate_window="30s")
            ctl = SlackController(
                settings, k8s.CoreV1Api(api), reader, model=fixture_model(), metrics=SlackMetrics(registry)
            )
            assert await ctl.start() == "given"
            # svc ("a quarter" class) lends 3/4 of its request once observed for 20 s; the product's pods on the
            # node add or take a little (their usage right after the deploy is above what they settle at)
            deadline = time.monotonic() + 180
            published = Amount(0, 0)
            while time.monotonic() < deadline:
                published = (await ctl.step())[node]
                if published.memory_bytes >= SVC_MEMORY // 2 and published.cpu_milli >= SVC_CPU // 4:
                    break
                await asyncio.sleep(3)
            else:
                pytest.fail(f"svc's slack was never published: {published}")
            # the product's pods on the node (some restarted by the identity tests just before) are classified only
            # once observed for 20 s; until then they lend nothing and nothing of them is checked, so the first
            # amount can stand above the real slack (CI, stop 40: 597 MB published, 211 MB really idle a minute
            # later). Past one more observation window every service there is classified, and a miss of theirs
            # already cut the published amount to the real slack (lendable_after_miss): the tenant takes half the
            # least of what was published meanwhile.
            settle = time.monotonic() + 30
            least = published
            while time.monotonic() < settle:
                await asyncio.sleep(3)
                published = (await ctl.step())[node]
                least = Amount(
                    min(least.cpu_milli, published.cpu_milli), min(least.memory_bytes, published.memory_bytes)
                )
            assert least.memory_bytes > 0, (least, published)
            p.timings["colocation_published_batch_memory_bytes"] = published.memory_bytes
            p.timings["colocation_published_batch_cpu_millicores"] = published.cpu_milli
            alloc = kube.get(f"/api/v1/nodes/{node}")["status"]["allocatable"]
            assert memory_bytes(alloc[BATCH_MEMORY]) == published.memory_bytes, alloc

            demand = least.memory_bytes // 2
            kube.create_pod(ns, _tenant(demand))
            kube.wait(lambda: _running(p, ns, "tenant"), "tenant bound by qos-scheduler and Running", timeout=150)
            tenant = kube.get(f"/api/v1/namespaces/{ns}/pods/tenant")
            assert tenant["spec"]["nodeName"] == node, tenant["spec"].get("nodeName")
            assert "schedulingGates" not in tenant["spec"] or not tenant["spec"]["schedulingGates"]
            # the in-cluster extender filtered (a service node, node_groups.enforce on) and bound it, as Prometheus
            # saw by scraping the extender pod. (Prioritize is not called: one node is feasible, and kube-scheduler
            # scores only when several are; LRP on the prediction is tests/test_colocate_verbs.py's.)
            kube.wait(
                lambda: all(_requests(p, v) > before[v] for v in ("filter", "bind")) or None,
                "Prometheus to see the in-cluster extender's filter and bind",
                timeout=60,
                interval=2.0,
            )
            await ctl.step()
            # it fits in the real slack until svc grows; if not, say what the controller measured (the warning's
            # decision: real slack, victims) -- seen once in CI, not reproduced
            decisions = [getattr(r, "decision", None) for r in caplog.records if hasattr(r, "decision")]
            assert ctl.evicted == [], (ctl.evicted, decisions, published)

            # svc grows past its request by more than everything published: the real slack is below the demand
            fill = (SVC_MEMORY + published.memory_bytes) // MI + 64
            subprocess.run(
                [str(p.bin_dir / "kubectl"), "exec", "-n", ns, "svc", "--", "dd", "if=/dev/zero", "of=/fill/f",
                 "bs=1048576", f"count={fill}"],
                env=p.env, check=True, capture_output=True, timeout=120,
            )  # fmt: skip
            grown = time.monotonic()
            deadline = grown + 120
            while time.monotonic() < deadline and not ctl.evicted:
                amounts = await ctl.step()
                await asyncio.sleep(2)
            p.timings["colocation_growth_to_eviction_seconds"] = time.monotonic() - grown
    finally:
        await api.close()
        # the node lends nothing once this test's slack controller is gone (the later tests share the node)
        gone = {BATCH_CPU: None, BATCH_MEMORY: None}
        kube.request(
            "PATCH",
            f"/api/v1/nodes/{node}/status",
            {"status": {"capacity": gone, "allocatable": gone}},
            content_type="application/merge-patch+json",
        )
    assert ctl.evicted == [f"{ns}/tenant"], ctl.evicted
    kube.wait(lambda: not _running(p, ns, "tenant"), "tenant gone", timeout=60)
    assert _running(p, ns, "svc")
    assert registry.get_sample_value("qos_extender_slack_evictions_total", {"result": "evicted"}) == 1
    events = [
        e.get("message", "")
        for e in kube.events(ns)
        if e.get("reason") == EVICTION_REASON and e.get("involvedObject", {}).get("name") == "tenant"
    ]
    assert len(events) == 1 and f"{ns}/svc" in events[0], events
    # what the node lends afterwards is below what it lent (svc is now above its request)
    assert amounts[node].memory_bytes < published.memory_bytes, (amounts, published)
