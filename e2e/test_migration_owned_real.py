"""Pods that controllers own migrate between real nodes with their progress and their owner's books intact
(issue 32 part 1): a Job's pod (NonIndexed and Indexed), a Deployment's pod and a StatefulSet's pod.

Same cluster, product and flow as e2e/test_migration_real.py (``-m deployed``: kind in CI, the agent DaemonSet on
the real workers; the consolidation flow's ``move_pod`` run in this process as the autoscaler runs it). Each
workload is a busybox counter (``tick N`` a second) whose pod template names the batch node (``nodeName``: the
test is about the move, not the scheduler); the move goes to the service node. What each test checks is what
the owner's controller would get wrong if the hand-over (extender/core/owners.py) were wrong:

- **Job**: ``backoffLimit: 0``, so one failure charged for the move fails the Job; the Job ends Complete with
  ``succeeded`` = completions and no ``failed``; the only pods it ever had are the ones it made plus our
  destination (no replacement from scratch); the restored counter goes on from the checkpoint to its end.
- **Deployment** (``maxUnavailable: 0``): sampled every 0.1 s during the move, the ReplicaSet never has fewer
  than ``replicas`` Ready pods and never more than one over; afterwards exactly ``replicas`` again, one of them
  the restored pod on the other node, and no pod the ReplicaSet made from scratch.
- **StatefulSet**: the pod keeps its name (``web-0``) on the other node, runs the checkpoint image, its count
  goes on from the checkpoint, never two pods of that name at once, the set Ready again; the downtime (source
  stopped -> restored container running) is measured.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pytest

from e2e.test_deployed import BUSYBOX, Product, _ready, namespace, product  # noqa: F401  (fixtures)
from e2e.test_migration_real import _group_nodes, _history, _logs, flow  # noqa: F401  (fixture)
from e2e.ticks import logged_ticks
from extender.consolidation.flow import ConsolidationFlow
from extender.consolidation.policy import MoveVerdict
from extender.core import owners
from lab.kube_sync import KubeError

pytestmark = [pytest.mark.live, pytest.mark.deployed]


def _template(node: str, ticks: int | None, labels: dict[str, str], grace: int = 0) -> dict[str, Any]:
    """A counter pod template on ``node``: ``ticks`` then exit 0 (a Job's work), or forever (None)."""
    loop = f"[ $i -lt {ticks} ]" if ticks is not None else "true"
    return {
        "metadata": {
            "labels": labels,
            "annotations": {
                "qos.kube-qos-extender.io/class": "gold",
                "qos.kube-qos-extender.io/kind": "batch",
                "qos.kube-qos-extender.io/migratable": "true",  # opted in (the agents refuse other pods)
            },
        },
        "spec": {
            "nodeName": node,
            "terminationGracePeriodSeconds": grace,
            "containers": [
                {
                    "name": "c",
                    "image": BUSYBOX,
                    "imagePullPolicy": "Never",
                    "command": ["sh", "-c", f"i=0; while {loop}; do echo tick $i; i=$((i+1)); sleep 1; done"],
                    "resources": {"requests": {"cpu": "50m", "memory": "16Mi"}},
                }
            ],
        },
    }


class Sampler:
    """Polls ``sample`` every 0.1 s in a thread: what a controller's count looked like all through a move."""

    def __init__(self, sample: Callable[[], Any]) -> None:
        self.values: list[Any] = []
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._sample = sample
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.values.append(self._sample())
            except Exception as exc:  # reported by stop(), never swallowed
                self.errors.append(f"{type(exc).__name__}: {exc}")
            self._stop.wait(0.1)

    def stop(self) -> list[Any]:
        self._stop.set()
        self.thread.join(10)
        assert not self.errors, self.errors[:5]
        return self.values


def _move(flow: ConsolidationFlow, pod: dict[str, Any], source: str, dest: str) -> dict[str, Any]:  # noqa: F811
    loop: asyncio.AbstractEventLoop = flow.loop  # type: ignore[attr-defined]
    mid = f"owned-move-{uuid.uuid4().hex[:8]}"
    result = loop.run_until_complete(flow.move_pod(mid, pod, source, dest))
    assert result["verdict"] is MoveVerdict.COMMIT, json.dumps(
        {k: v for k, v in result.items() if k != "verdict"}, indent=1, default=str
    )
    return result


def _resumed(p: Product, ns: str, pod: str, committed: float, at_least: int = 3) -> list[int]:
    """The ticks the restored process printed (after the agents committed): waits for ``at_least``."""

    def restored() -> list[int] | None:
        after = [n for t, n in _logs(p, ns, pod) if t > committed]
        return after if len(after) >= at_least else None

    ticks: list[int] = p.kube.wait(restored, f"{at_least} ticks from the restored {pod}", timeout=60, interval=0.5)
    return ticks


def _get(p: Product, path: str) -> dict[str, Any]:
    """The object, or {} while it does not exist (yet)."""
    try:
        obj: dict[str, Any] = p.kube.get(path)
    except KubeError as exc:
        if exc.status != 404:
            raise
        return {}
    return obj


def _owned(pods: list[dict[str, Any]], uid: str) -> list[dict[str, Any]]:
    return [p for p in pods if (owners.controller_ref(p) or {}).get("uid") == uid]


def _wait_ticks(p: Product, ns: str, pod: str, n: int) -> None:
    p.kube.wait(lambda: len(_logs(p, ns, pod)) >= n or None, f"{n} ticks from {pod}", timeout=120, interval=0.5)


@pytest.mark.parametrize("mode", ["NonIndexed", "Indexed"])
def test_migrating_a_job_pod_keeps_its_progress_and_the_job_counts_it_once(
    product: Product,  # noqa: F811
    namespace: str,  # noqa: F811
    flow: ConsolidationFlow,  # noqa: F811
    mode: str,
) -> None:
    kube = product.kube
    batch, service = _group_nodes(product)
    completions = 1 if mode == "NonIndexed" else 2
    ticks = 40
    job: dict[str, Any] = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "count"},
        "spec": {
            "completions": completions,
            "parallelism": completions,
            "completionMode": mode,
            "backoffLimit": 0,  # one failure charged for the move fails the Job
            "template": _template(batch, ticks, {"app": "count"}),
        },
    }
    job["spec"]["template"]["spec"]["restartPolicy"] = "Never"
    made = kube.create(f"/apis/batch/v1/namespaces/{namespace}/jobs", job)
    juid = made["metadata"]["uid"]
    seen: dict[str, str] = {}  # every pod the Job ever had: uid -> name

    def sample() -> int:
        pods = _owned(kube.pods(namespace), juid)
        seen.update({p["metadata"]["uid"]: p["metadata"]["name"] for p in pods})
        return len(pods)

    sampler = Sampler(sample)
    pods = kube.wait(lambda: (ps if len(ps := [p for p in _owned(kube.pods(namespace), juid) if _ready(p)])
                              == completions else None), "the Job's pods Running", timeout=120)  # fmt: skip
    src = sorted(pods, key=lambda p: p["metadata"]["name"])[0]
    name = src["metadata"]["name"]
    assert owners.JOB_TRACKING_FINALIZER in src["metadata"]["finalizers"]
    _wait_ticks(product, namespace, name, 8)

    result = _move(flow, kube.get(f"/api/v1/namespaces/{namespace}/pods/{name}"), batch, service)
    dname = result["destination_pod"].split("/")[1]
    assert result["owner"] == "Job" and result["job_replacements"] == [], result
    dest = kube.get(f"/api/v1/namespaces/{namespace}/pods/{dname}")
    assert dest["spec"]["nodeName"] == service
    assert (owners.controller_ref(dest) or {}).get("uid") == juid, "the Job owns the restored pod"
    assert owners.JOB_TRACKING_FINALIZER in dest["metadata"]["finalizers"], "its end is counted by the Job"
    assert dest["metadata"]["labels"] == src["metadata"]["labels"]
    if mode == "Indexed":
        key = "batch.kubernetes.io/job-completion-index"
        assert dest["metadata"]["annotations"][key] == src["metadata"]["annotations"][key]

    resumed = _resumed(product, namespace, dname, _history(result["record"], "committed"))
    assert resumed[0] >= 8 and resumed == list(range(resumed[0], resumed[0] + len(resumed))), resumed

    def finished() -> dict[str, Any] | None:
        j = kube.get(f"/apis/batch/v1/namespaces/{namespace}/jobs/count")
        done = {c["type"] for c in j["status"].get("conditions") or [] if c.get("status") == "True"}
        return j if done & {"Complete", "Failed"} else None

    status = kube.wait(finished, "the Job finished", timeout=ticks + 60, interval=1.0)["status"]
    sampler.stop()
    conditions = {c["type"] for c in status.get("conditions") or [] if c.get("status") == "True"}
    assert "Complete" in conditions and "Failed" not in conditions, status
    assert status.get("succeeded") == completions and not status.get("failed"), status
    if mode == "Indexed":
        assert status.get("completedIndexes") == "0,1", status
    # the pods it ever had: the ones it made and our destination; nothing started from scratch
    assert set(seen.values()) == {p["metadata"]["name"] for p in pods} | {dname}, seen
    # the restored pod ran to the end from where the checkpoint was: its last tick is the Job's last
    assert _logs(product, namespace, dname)[-1][1] == ticks - 1
    print("\njob move:", json.dumps({"mode": mode, "seconds": result["seconds"], "first_restored_tick": resumed[0]}))


def test_migrating_a_deployment_pod_never_drops_below_its_replicas(
    product: Product,  # noqa: F811
    namespace: str,  # noqa: F811
    flow: ConsolidationFlow,  # noqa: F811
) -> None:
    """maxUnavailable 0 and minReadySeconds 3: a Deployment counts a pod *available* once Ready for 3 s, and the
    available count must never drop below the replicas while one of them moves (the hand-over waits until the
    destination is available before the source goes); Ready pods likewise, and no pod made from scratch."""
    kube = product.kube
    batch, service = _group_nodes(product)
    replicas, min_ready = 2, 3
    deploy = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "count"},
        "spec": {
            "replicas": replicas,
            "minReadySeconds": min_ready,
            "selector": {"matchLabels": {"app": "count"}},
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}},
            "template": _template(batch, None, {"app": "count"}),
        },
    }
    kube.create(f"/apis/apps/v1/namespaces/{namespace}/deployments", deploy)

    def rs_ready() -> dict[str, Any] | None:
        sets = kube.get(f"/apis/apps/v1/namespaces/{namespace}/replicasets")["items"]
        return sets[0] if sets and sets[0].get("status", {}).get("availableReplicas") == replicas else None

    rs = kube.wait(rs_ready, "the ReplicaSet Ready", timeout=120)
    rs_uid = rs["metadata"]["uid"]
    originals = {p["metadata"]["uid"]: p for p in _owned(kube.pods(namespace), rs_uid)}
    assert len(originals) == replicas
    seen: set[str] = set()

    def sample() -> tuple[int, int]:
        """(Ready, available) pods of the ReplicaSet, by the ReplicaSet's own rule for available."""
        pods = [p for p in _owned(kube.pods(namespace), rs_uid) if not p["metadata"].get("deletionTimestamp")]
        seen.update(p["metadata"]["uid"] for p in pods)
        now = datetime.now(UTC)
        return sum(1 for p in pods if _ready(p)), sum(1 for p in pods if owners.available_in(p, min_ready, now) == 0)

    src = sorted(originals.values(), key=lambda p: p["metadata"]["name"])[0]
    name = src["metadata"]["name"]
    _wait_ticks(product, namespace, name, 8)
    sampler = Sampler(sample)
    result = _move(flow, kube.get(f"/api/v1/namespaces/{namespace}/pods/{name}"), batch, service)
    dname = result["destination_pod"].split("/")[1]

    def settled() -> list[dict[str, Any]] | None:
        pods = [p for p in _owned(kube.pods(namespace), rs_uid) if not p["metadata"].get("deletionTimestamp")]
        return pods if len(pods) == replicas and all(_ready(p) for p in pods) else None

    pods = kube.wait(settled, f"{replicas} Ready pods again", timeout=60, interval=0.5)
    time.sleep(2)  # the ReplicaSet's next syncs: no surplus cut, no replacement made
    samples = sampler.stop()
    counts, available = [r for r, _ in samples], [a for _, a in samples]
    assert counts and min(counts) >= replicas, f"Ready pods of the ReplicaSet during the move: {counts}"
    assert max(counts) <= replicas + 1, f"more than one over during the move: {counts}"
    assert min(available) >= replicas, f"available pods (minReadySeconds {min_ready}) during the move: {available}"
    names = {p["metadata"]["name"] for p in settled() or []}
    assert dname in names and name not in names, names
    assert {p["metadata"]["name"] for p in pods} == names
    dest = kube.get(f"/api/v1/namespaces/{namespace}/pods/{dname}")
    assert dest["spec"]["nodeName"] == service and dest["metadata"]["labels"] == src["metadata"]["labels"]
    assert seen <= set(originals) | {dest["metadata"]["uid"]}, "the ReplicaSet made a pod from scratch"
    status = kube.get(f"/apis/apps/v1/namespaces/{namespace}/replicasets/{rs['metadata']['name']}")["status"]
    assert status.get("replicas") == replicas and status.get("readyReplicas") == replicas, status
    resumed = _resumed(product, namespace, dname, _history(result["record"], "committed"))
    assert resumed[0] >= 8 and resumed == list(range(resumed[0], resumed[0] + len(resumed))), resumed
    print("\ndeployment move:", json.dumps({"seconds": result["seconds"], "min_ready": min(counts),
                                            "max_ready": max(counts), "min_available": min(available),
                                            "samples": len(counts)}))  # fmt: skip


def test_migrating_a_statefulset_pod_keeps_its_name_and_its_progress(
    product: Product,  # noqa: F811
    namespace: str,  # noqa: F811
    flow: ConsolidationFlow,  # noqa: F811
) -> None:
    kube = product.kube
    batch, service = _group_nodes(product)
    sts = {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": "web"},
        "spec": {
            "replicas": 1,
            "serviceName": "web",
            "selector": {"matchLabels": {"app": "web"}},
            "template": _template(batch, None, {"app": "web"}, grace=1),
        },
    }
    made = kube.create(f"/apis/apps/v1/namespaces/{namespace}/statefulsets", sts)
    sts_uid = made["metadata"]["uid"]
    path = f"/api/v1/namespaces/{namespace}/pods/web-0"
    src = kube.wait(lambda: pod if _ready(pod := _get(product, path)) else None, "web-0 Running", timeout=120)
    _wait_ticks(product, namespace, "web-0", 8)
    incarnations: dict[str, list[str]] = {}  # uid -> [node, image] of every web-0 seen
    at_once: list[int] = []

    def sample() -> None:
        pods = [p for p in kube.pods(namespace) if p["metadata"]["name"] == "web-0"]
        at_once.append(len(pods))
        for p in pods:
            incarnations[p["metadata"]["uid"]] = [p["spec"].get("nodeName") or "", p["spec"]["containers"][0]["image"]]

    sampler = Sampler(sample)
    result = _move(flow, src, batch, service)
    assert result["destination_pod"] == f"{namespace}/web-0" and result["owner"] == "StatefulSet"
    dest = kube.wait(lambda: pod if _ready(pod := _get(product, path)) else None, "web-0 Ready again", timeout=60)
    sampler.stop()
    assert dest["metadata"]["uid"] != src["metadata"]["uid"] and dest["spec"]["nodeName"] == service
    image = result["record"]["restored_workload"]["image"]
    assert dest["spec"]["containers"][0]["image"] == image
    assert (owners.controller_ref(dest) or {}).get("uid") == sts_uid
    assert dest["metadata"]["labels"] == src["metadata"]["labels"], "identity and revision labels kept"
    assert max(at_once) == 1, "never two pods named web-0"
    assert result["statefulset_trial_seconds"] > 0, "the destination proved it can restore before the source stopped"
    # every web-0 there ever was: the source, and ours from the checkpoint image; one the StatefulSet made from
    # its template in the race for the name would have been taken back before it ran (counted in the result)
    scratch = [u for u, (_, img) in incarnations.items() if img == BUSYBOX and u != src["metadata"]["uid"]]
    assert len(scratch) == result["statefulset_recreates_taken_back"], (incarnations, result)
    resumed = _resumed(product, namespace, "web-0", _history(result["record"], "committed"))
    assert resumed[0] >= 8 and resumed == list(range(resumed[0], resumed[0] + len(resumed))), resumed
    status = kube.get(f"/apis/apps/v1/namespaces/{namespace}/statefulsets/web")["status"]
    assert status.get("readyReplicas") == 1 and status.get("replicas") == 1, status
    time.sleep(3)  # the StatefulSet's next syncs leave the restored pod alone (revision and identity match)
    assert kube.get(path)["metadata"]["uid"] == dest["metadata"]["uid"]
    print("\nstatefulset move:", json.dumps({"seconds": result["seconds"],
                                             "stop_seconds": result["statefulset_stop_seconds"],
                                             "trial_seconds": result["statefulset_trial_seconds"],
                                             "taken_back": result["statefulset_recreates_taken_back"]}))  # fmt: skip


def test_migrating_a_pod_with_two_containers_and_an_init_container(
    product: Product,  # noqa: F811
    namespace: str,  # noqa: F811
    flow: ConsolidationFlow,  # noqa: F811
) -> None:
    """Issue 32 part 2: each container checkpointed and restored from its own image (agent migrations <id> and
    <id>-1), each counting on from its own checkpoint; the finished init container is not run again (the
    destination has none: its marker line is printed once, by the source)."""
    kube = product.kube
    batch, service = _group_nodes(product)
    pod = _template(batch, None, {"app": "two"})
    pod["metadata"]["name"] = "two"
    second = dict(pod["spec"]["containers"][0]) | {"name": "d"}
    second["command"] = ["sh", "-c", "i=1000; while true; do echo tick $i; i=$((i+1)); sleep 1; done"]
    pod["spec"]["containers"].append(second)
    pod["spec"]["initContainers"] = [dict(pod["spec"]["containers"][0]) | {"name": "init", "command": ["true"]}]
    kube.create_pod(namespace, pod)
    path = f"/api/v1/namespaces/{namespace}/pods/two"
    src = kube.wait(lambda: x if _ready(x := _get(product, path)) else None, "two Running", timeout=120)

    def ticks(name: str, container: str) -> list[tuple[float, int]]:
        return logged_ticks(product.bin_dir, product.env, namespace, name, container)

    kube.wait(lambda: len(ticks("two", "d")) >= 8 or None, "8 ticks from d", timeout=60, interval=0.5)
    result = _move(flow, src, batch, service)
    dname = result["destination_pod"].split("/")[1]
    images = result["images"]
    assert set(images) == {"c", "d"} and images["c"] != images["d"], images
    dest = kube.get(f"/api/v1/namespaces/{namespace}/pods/{dname}")
    assert dest["spec"]["nodeName"] == service and "initContainers" not in dest["spec"]
    assert {c["name"]: c["image"] for c in dest["spec"]["containers"]} == images
    records = {"c": result["record"], "d": result["container_records"]["d"]}
    for container, start in (("c", 0), ("d", 1000)):
        committed = _history(records[container], "committed")

        def restored(c: str = container, committed: float = committed) -> list[int] | None:
            after = [n for t, n in ticks(dname, c) if t > committed]
            return after if len(after) >= 3 else None

        after = kube.wait(restored, f"3 ticks from the restored {container}", timeout=60, interval=0.5)
        assert after[0] >= start + 8 and after == list(range(after[0], after[0] + len(after))), (container, after)
    names = [p["metadata"]["name"] for p in kube.pods(namespace)]
    assert names == [dname], names
    print("\ntwo-container move:", json.dumps({"seconds": result["seconds"], "images": len(images)}))
