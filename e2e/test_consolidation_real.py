"""Consolidation empties an under-used REAL batch node by migration, not eviction, and removes it (issue 13, 2).

The cluster and the deployed product are e2e/test_deployed.py's, with two real batch nodes
(``hack/local-up.sh real:service:m1.medium=1 real:batch:m1.large=2``; hack/run-live-tests.sh phase 2). Here the
autoscaler loop and the consolidation flow run in this process against that cluster, as the autoscaler sidecar
runs them (``start_autoscaler(handoff=ConsolidationFlow)``), with the deployed agents on the real nodes:

* the *source* batch node holds a busybox counter (50m, kind batch), two pods of a Job (issue 32: handed over to
  the Job on the destination, ``core.owners``) and the agent DaemonSet's pod; the other
  batch node holds a filler pod that keeps it above the under-utilisation threshold, so it is the destination
  and never a candidate itself;
* first the counter is annotated ``cluster-autoscaler.kubernetes.io/safe-to-evict: "false"``: the flow skips the
  node without cordoning it, with an Event naming the annotation, and the counter keeps running untouched;
* the annotation removed, the flow cordons the node, migrates the counter through the agents (kubelet checkpoint
  on the source, verified transfer, checkpoint image imported into the destination's containerd, pod created
  from it, source deleted once it runs), deletes the checkpoint image, and removes the node.

How a real node is "removed" here: the flow deletes it through its provider, which for these nodes is
``RealMachineProvider`` below, the local stand-in for a cloud: it deletes the Node object and stops the machine
(``hack/real-nodes.sh remove``: kubelet, containerd, kube-proxy, containers, network namespace, files), as a
cloud stops an instance the autoscaler deleted. The product's own sidecar uses the kwok provider, which only
deletes Node objects; real nodes are not its to remove (they are not provisioned-by it).

Checked: the counter's count goes on at the destination from the checkpoint (no reset, gap or repeat), exactly
one copy runs, the Job's two pods are the restored ones (tracked by the Job, 2 active, none failed under
``backoffLimit: 0``, none started from scratch), the source node is gone from the API and from the machine
(``real-nodes.sh list``, its containerd socket), the checkpoint image is gone from the destination's
containerd, Events say what happened.

Runs with ``-m deployed``; fails, never skips, without the cluster.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest

from e2e.test_deployed import ROOT, Product, _ready, namespace, product  # noqa: F401  (fixtures)
from e2e.test_migration_real import GROUP, _cid, _counter, _history, _logs, _running_tasks
from e2e.ticks import LogFollower
from extender.autoscaler.loop import ProvisionRequest
from extender.autoscaler.settings import (
    AutoscalerSettings,
    MetricsSettings,
)
from extender.consolidation import policy
from extender.consolidation.flow import ConsolidationFlow
from extender.consolidation.settings import AgentEndpoint, ConsolidationSettings
from extender.core import owners
from extender.core.model import Flavour, Resources
from extender.processes.sidecar import RunningAutoscaler, start_autoscaler
from extender.settings.extender import ExtenderConfig, KubernetesConfig

pytestmark = [pytest.mark.live, pytest.mark.deployed]

SAFE_TO_EVICT = "cluster-autoscaler.kubernetes.io/safe-to-evict"
GI = 2**30


class RealMachineProvider:
    """The local STAND-IN FOR A CLOUD API for the product's machines: ``delete`` deletes the Node object and stops
    the machine (``Product.remove_machine``: kind's node container, or ``hack/real-nodes.sh remove``). It buys
    nothing: nothing in this test is pending."""

    name = "real-nodes"

    def __init__(self, machines_of: Product) -> None:
        self.product = machines_of
        self.deleted: list[str] = []

    async def create(self, request: ProvisionRequest) -> None:
        raise RuntimeError(f"this stand-in does not buy machines (asked for {request.name})")

    async def cancel(self, node_name: str) -> None:
        return None

    async def delete(self, node_name: str) -> None:
        await asyncio.to_thread(self.product.remove_machine, node_name)
        self.deleted.append(node_name)

    async def close(self) -> None:
        return None


class Background:
    """An event loop in a thread running the autoscaler and the flow, while the test polls the cluster."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro: Any, timeout: float = 120) -> Any:
        fut: Future[Any] = asyncio.run_coroutine_threadsafe(coro, self.loop)
        return fut.result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


def _filler(name: str, node: str, cpu_milli: int) -> dict[str, Any]:
    pod = _counter(name, node)
    c = pod["spec"]["containers"][0]
    c["command"] = ["sh", "-c", "while true; do sleep 1; done"]
    c["resources"] = {"requests": {"cpu": f"{cpu_milli}m", "memory": "16Mi"}}
    return pod


def _milli(q: str) -> int:
    return int(q[:-1]) if q.endswith("m") else int(float(q) * 1000)


def _non_daemon_pods(p: Product, node: str) -> list[dict[str, Any]]:
    pods = p.kube.get("/api/v1/pods", fieldSelector=f"spec.nodeName={node}")["items"]
    return [
        x for x in pods
        if not any(r.get("kind") == "DaemonSet" for r in x["metadata"].get("ownerReferences") or [])
        and x.get("status", {}).get("phase") not in ("Succeeded", "Failed")
    ]  # fmt: skip


def _events(p: Product, ns: str, name: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = p.kube.get(f"/api/v1/namespaces/{ns}/events")["items"]
    return [e for e in items if e["involvedObject"]["name"] == name]


@pytest.fixture
def background() -> Iterator[Background]:
    bg = Background()
    try:
        yield bg
    finally:
        bg.close()


def test_underused_real_batch_node_holding_job_pods_is_emptied_by_migration_and_removed(
    product: Product,  # noqa: F811
    namespace: str,  # noqa: F811
    background: Background,
) -> None:
    kube, env = product.kube, product.env
    groups = {n: kube.get(f"/api/v1/nodes/{n}")["metadata"]["labels"].get(GROUP) for n in product.real_nodes}
    batch_nodes = sorted(n for n, g in groups.items() if g == "batch")
    assert len(batch_nodes) >= 2, f"needs two real batch nodes (real:batch:m1.large=2), got {groups}"
    # the source: a batch node none of the product's own pods landed on (they are not ours to move)
    busy = {n: [x["metadata"]["name"] for x in _non_daemon_pods(product, n)] for n in batch_nodes}
    free = [n for n in batch_nodes if not busy[n]]
    assert free, f"every real batch node holds product pods: {busy}"
    source = free[0]
    dest = next(n for n in batch_nodes if n != source)

    # the destination above the threshold (0.5 of cpu) with a filler; the counter on the source, pinned first
    alloc = _milli(kube.get(f"/api/v1/nodes/{dest}")["status"]["allocatable"]["cpu"])
    used = sum(_milli(c.get("resources", {}).get("requests", {}).get("cpu", "0"))
               for x in kube.get("/api/v1/pods", fieldSelector=f"spec.nodeName={dest}")["items"]
               for c in x["spec"]["containers"])  # fmt: skip
    filler_cpu = max(int(0.55 * alloc) - used, 10)
    assert used + filler_cpu + 50 <= alloc, f"{dest}: {alloc}m allocatable, {used}m requested"
    kube.create_pod(namespace, _filler("filler", dest, filler_cpu))
    pod = _counter("counter", source)
    pod["metadata"]["annotations"][SAFE_TO_EVICT] = "false"
    kube.create_pod(namespace, pod)
    path = f"/api/v1/namespaces/{namespace}/pods/counter"
    src = kube.wait(lambda: x if _ready(x := kube.get(path)) else None, "the counter Running", timeout=120)
    kube.wait(lambda: _ready(kube.get(f"/api/v1/namespaces/{namespace}/pods/filler")) or None, "filler", timeout=120)
    src_cid = _cid(src)
    follower = LogFollower(product.bin_dir, product.env, namespace, "counter")
    # and two pods of a Job (issue 32): handed over to the Job on the destination, nothing counted as failed
    job: dict[str, Any] = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "work"},
        "spec": {"completions": 2, "parallelism": 2, "backoffLimit": 0,
                 "template": {"metadata": {"annotations": dict(_counter("x", source)["metadata"]["annotations"])},
                              "spec": _counter("x", source)["spec"] | {"restartPolicy": "Never"}}},
    }  # fmt: skip
    job_uid = kube.create(f"/apis/batch/v1/namespaces/{namespace}/jobs", job)["metadata"]["uid"]

    def job_pods() -> list[dict[str, Any]]:
        return [x for x in kube.pods(namespace) if (owners.controller_ref(x) or {}).get("uid") == job_uid]

    job_src = kube.wait(lambda: ps if len(ps := [x for x in job_pods() if _ready(x)]) == 2 else None,
                        "the Job's two pods Running", timeout=120)  # fmt: skip

    # ---- the autoscaler (kwok provider: buys nothing here) with the flow as its hand-off, in this process
    missing = [k for k in ("AGENT_CA", "AGENT_CLIENT_CERT", "AGENT_CLIENT_KEY") if not env.get(k)]
    assert not missing, f"hack/deploy-local.sh did not print {missing}"
    config = ExtenderConfig(kubernetes=KubernetesConfig(kubeconfig=env["KUBECONFIG"], watch_timeout_seconds=60))
    settings = AutoscalerSettings(
        scheduler_names=("qos-scheduler",),
        flavours=(Flavour("m1.large", Resources(4000, 8 * GI, 110), 0.2),),
        scan_interval_seconds=0.5,
        burst_debounce_seconds=0.2,
        batch_cycle_seconds=300.0,
        idle_seconds=3600.0,  # empty-node removal is not what is tested: only the flow removes a node here
        underutil_sustain_seconds=2.0,
        batch_queue_quiet_seconds=2.0,
        metrics=MetricsSettings(port=0),
    )
    flow = ConsolidationFlow(
        ConsolidationSettings(
            enabled=True,
            agent=AgentEndpoint(
                cert_file=env["AGENT_CLIENT_CERT"], key_file=env["AGENT_CLIENT_KEY"], ca_file=env["AGENT_CA"]
            ),
            migration_timeout_seconds=180,
            destination_ready_timeout_seconds=90,
            left_alone_seconds=3.0,  # the skipped node is looked at again soon after the annotation goes
            provisioned_only=False,  # real nodes are not bought by the autoscaler; this test owns them
        )
    )
    machines = RealMachineProvider(product)

    async def start() -> RunningAutoscaler:
        running = await start_autoscaler(config, settings, handoff=flow)
        running.provider = machines  # the flow removes nodes through it
        await flow.start(running)
        return running

    running: RunningAutoscaler = background.run(start())
    try:
        # ---- 1. pinned by safe-to-evict=false: skipped, never cordoned, an Event names the annotation
        def skipped() -> list[dict[str, Any]] | None:
            evs = [e for e in _events(product, "default", source) if e["reason"] == "ConsolidationSkipped"]
            return evs or None

        evs = kube.wait(skipped, "a ConsolidationSkipped Event on the pinned node", timeout=90, interval=0.5)
        assert f"{SAFE_TO_EVICT}=false" in evs[0]["message"] and "counter" in evs[0]["message"], evs[0]
        node = kube.get(f"/api/v1/nodes/{source}")
        assert not node["spec"].get("unschedulable"), "a pinned node is not even cordoned"
        assert not [o for o in flow.outcomes if o.node == source and o.moves], flow.outcomes
        assert _cid(kube.get(path)) == src_cid, "the pinned counter is untouched"

        # ---- 2. unpinned: emptied by migration and removed
        kube.request(
            "PATCH",
            path,
            {"metadata": {"annotations": {SAFE_TO_EVICT: None}}},
            content_type="application/merge-patch+json",
        )
        t0 = time.monotonic()

        def removed() -> bool | None:
            return (source in machines.deleted and any(o.node == source and o.removed for o in flow.outcomes)) or None

        try:
            kube.wait(removed, f"{source} emptied and removed", timeout=240, interval=0.5)
        except Exception:
            raise AssertionError(json.dumps([o.__dict__ if hasattr(o, "__dict__") else repr(o)
                                             for o in flow.outcomes], default=str)[-4000:]) from None  # fmt: skip
        seconds = time.monotonic() - t0
        outcome = next(o for o in flow.outcomes if o.node == source and o.removed)
        assert len(outcome.moves) == 3, outcome
        assert all(m["outcome"] == "succeeded" and m["node"] == dest for m in outcome.moves), outcome.moves
        move = next(m for m in outcome.moves if m["pod"] == f"{namespace}/counter")
        job_moves = [m for m in outcome.moves if m.get("owner") == "Job"]
        assert len(job_moves) == 2 and all(m["job_replacements"] == [] for m in job_moves), job_moves
        assert move["outcome"] == "succeeded" and move["node"] == dest, move
        assert move.get("checkpoint_image") == "kept for the destination pod's container restarts", move
        record = move["record"]
        dest_ns, dest_name = move["destination_pod"].split("/")
    finally:
        background.run(flow.stop())
        background.run(running.stop())
    follower.proc.wait(30)
    follower.stop()

    # the node is gone: from the API, from the machine
    assert source not in [n["metadata"]["name"] for n in kube.nodes()]
    listing = product.machines()
    assert source not in listing and dest in listing, listing
    if product.topology != "kind":
        assert not Path(f"/run/qos-local-nodes/{source}").exists()

    # the counter runs on at the destination from the checkpoint: no reset, gap or repeat after the restore
    moved = kube.get(f"/api/v1/namespaces/{dest_ns}/pods/{dest_name}")
    assert moved["spec"]["nodeName"] == dest and _ready(moved)
    assert moved["metadata"]["annotations"][policy.MIGRATED_FROM_ANNOTATION] == f"{namespace}/counter"
    committed = _history(record, "committed")
    cut, dumped = _history(record, "cutover"), _history(record, "final-dumped")

    def restored_log() -> list[tuple[float, int]] | None:
        ts = _logs(product, dest_ns, dest_name)
        return ts if sum(1 for t, _ in ts if t > committed) >= 3 else None

    dest_log = kube.wait(restored_log, "3 ticks from the destination", timeout=30, interval=0.5)
    after = [n for t, n in dest_log if t > committed]
    before_cut = [n for t, n in follower.ticks if t <= cut]
    by_dump = [n for t, n in follower.ticks if t <= dumped + 0.05]
    assert before_cut and before_cut[-1] + 1 <= after[0] <= by_dump[-1] + 1, (after[:3], follower.ticks[-10:])
    assert after == list(range(after[0], after[0] + len(after))), after

    # exactly one copy: the namespace holds the filler and the moved counter; its task runs on the destination
    job_dests = sorted(m["destination_pod"].split("/")[1] for m in job_moves)
    names = sorted(x["metadata"]["name"] for x in kube.pods(namespace))
    assert names == sorted(["filler", dest_name, *job_dests]), names
    # the Job's books: its two pods are the restored ones on the destination, both active and tracked, nothing
    # failed (backoffLimit 0 would have failed the Job), nothing started from scratch
    mine = job_pods()
    assert sorted(x["metadata"]["name"] for x in mine) == job_dests, [x["metadata"]["name"] for x in mine]
    assert all(x["spec"]["nodeName"] == dest and owners.JOB_TRACKING_FINALIZER in x["metadata"]["finalizers"]
               for x in mine)  # fmt: skip
    assert {x["metadata"]["uid"] for x in job_src}.isdisjoint({x["metadata"]["uid"] for x in mine})
    job_status = kube.wait(lambda: st if (st := kube.get(f"/apis/batch/v1/namespaces/{namespace}/jobs/work")["status"])
                           .get("active") == 2 and st.get("ready") == 2 else None, "the Job: 2 active, 2 ready",
                           timeout=30)  # fmt: skip
    assert not job_status.get("failed") and not job_status.get("succeeded"), job_status
    assert _cid(moved) in _running_tasks(product, dest)
    # the checkpoint image stays in the destination's containerd while the pod exists (a restart restores it)
    image = record["restored_workload"]["image"]
    assert image in product.ctr(dest, "images", "ls", "-q").split()
    assert record["archives"].keys() == {"final"}, "one checkpoint per move"

    # a restart of the moved container (its process killed) restores the checkpoint again from that image: the
    # pod runs again (with the image deleted it would be stuck in ErrImageNeverPull, no runnable copy left)
    product.ctr(dest, "tasks", "kill", "--signal", "SIGKILL", _cid(moved))

    def restarted() -> dict[str, Any] | None:
        pod = kube.get(f"/api/v1/namespaces/{dest_ns}/pods/{dest_name}")
        status = (pod["status"].get("containerStatuses") or [{}])[0]
        return pod if status.get("restartCount", 0) >= 1 and _ready(pod) else None

    again = kube.wait(restarted, "the moved container restarted from its checkpoint image", timeout=90, interval=1.0)
    assert _cid(again) != _cid(moved) and _cid(again) in _running_tasks(product, dest)

    reasons = {e["reason"] for e in _events(product, "default", source)}
    assert {"ConsolidationSkipped", "ConsolidationStarted", "ConsolidatedNodeRemoved"} <= reasons, reasons
    product.timings.update({"consolidation_unpinned_to_removed_seconds": round(seconds, 3),
                            "consolidation_move_seconds": float(move["seconds"])})  # fmt: skip
    print(
        "\nconsolidation on real nodes:",
        json.dumps(
            {
                "source": source,
                "destination": dest,
                "unpinned_to_removed_seconds": round(seconds, 3),
                "move_seconds": move["seconds"],
                "archive_bytes": record["meta"]["archive_bytes"],
                "first_restored_tick": after[0],
                "last_tick_before_cutover": before_cut[-1],
            }
        ),
    )
