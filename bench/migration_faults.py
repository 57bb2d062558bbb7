"""Faults injected into checkpoint migrations of REAL pods between two real kubelet nodes (issue 13, deliverable 3).

Every run moves a busybox counter pod (``tick N`` every second) with the consolidation flow's ``move_pod`` (the
kubelet backend through the deployed agents, as e2e/test_migration_real.py) while one fault happens, then checks
that it ended with **exactly one running copy** (one Running counter pod in the API, one running counter task in
the two nodes' containerd) and **no lost progress** (the copy that runs counts on from where the source was:
the source itself without restart or gap, or the destination from the checkpoint, no reset, gap or repeat).

Faults (``--runs-per-fault``, default 4, each; plus ``--baseline`` fault-free moves measured in the same run):

* ``restore-refused``: the destination's runtime cannot restore (the counter's image is on the source node only,
  under a name whose registry refuses connections: containerd fails to find the checkpoint's base image);
* ``dest-killed-mid-transfer``: the destination agent SIGKILLs itself in the middle of the archive upload
  (agent fault hook ``destination.kill.during-transfer``); its container is restarted by the kubelet;
* ``source-killed-after-checkpoint``: the source agent SIGKILLs itself once the checkpoint is on its disk
  (``source.kill.after-checkpoint``); the flow repeats its request with the same id until the restarted agent
  answers the outcome it reconciled from its journal;
* ``archive-corrupted``: one byte of the uploaded archive flipped (``source.transfer.corrupt``; the declared
  sha256 stays): odd runs once (the destination rejects it, the source sends it again), even runs on every
  attempt (the migration is rolled back);
* ``dest-node-deleted``: the destination Node object is deleted while the destination pod is being restored
  from the checkpoint (as soon as it exists); afterwards its kubelet is restarted so that it registers again
  (``hack/real-nodes.sh restart-kubelet``).

Owners (``--owners``, issue 32 part 5): the counter runs as a bare pod (``pod``), or as the one pod of a Job
(``job``: ``backoffLimit: 0``), a Deployment (``deployment``: 1 replica, ``maxUnavailable: 0``) or a StatefulSet
(``statefulset``: 1 replica, grace period 1 s), each fault ``--runs-per-fault`` times per owner. On top of one copy
and no lost progress, each run checks the owner's books (``owner_ok``): the surviving pod is the owner's
(controller reference; a Job's also its tracking finalizer), and the owner counts exactly it (Job: active 1,
nothing failed, no other pod; ReplicaSet/StatefulSet: replicas 1, readyReplicas 1), whether the move committed
or rolled back.

The agents' fault hooks are TEST-ONLY and off in the product; this bench turns them on for its cluster by adding
``--enable-test-fault-injection`` to the agent DaemonSet and removes it at the end.

Needs the product cluster with two real nodes (hack/run-live-tests.sh phase 2's, e.g.
``QOS_WITH_EXTENDER=0 QOS_HOST_QOS_PROFILE=0 QOS_MANIFESTS_DIR=none hack/local-up.sh real:service:m1.medium=1
real:batch:m1.large=1``, its KEY=VALUE lines exported); imports the images and deploys config/local itself
(``--no-deploy`` to skip when hack/deploy-local.sh's AGENT_* lines are exported already).

    .venv/bin/python bench/migration_faults.py [--runs-per-fault 4] [--baseline 2] [--owners pod,job,...]
        [--out bench/results/...]

On kind (``QOS_TOPOLOGY=kind``, hack/kind-up.sh's lines exported, the product deployed by it): ``--no-deploy``.

Writes JSON: per-fault outcome counts (flow outcome / verdict, one-copy and progress checks), migration time,
stop time (last tick of the restored state at the source to the first tick after the restore) and archive size
of each run; times also as ratios to the fault-free baseline's median. Never passes or fails on time.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from e2e.ticks import LogFollower, logged_ticks  # noqa: E402
from extender.agent.client import AgentClient, PeerError  # noqa: E402
from extender.agent.settings import AgentTlsConfig  # noqa: E402
from extender.consolidation import policy  # noqa: E402
from extender.consolidation.flow import ConsolidationFlow  # noqa: E402
from extender.consolidation.settings import AgentEndpoint, ConsolidationSettings  # noqa: E402
from extender.kube.client import new_api_client  # noqa: E402
from extender.settings.extender import ExtenderConfig, KubernetesConfig  # noqa: E402
from lab.kube_sync import Kube, KubeError  # noqa: E402

FAULTS = (
    "restore-refused",
    "dest-killed-mid-transfer",
    "source-killed-after-checkpoint",
    "archive-corrupted",
    "dest-node-deleted",
)
OWNERS = ("pod", "job", "deployment", "statefulset")
GROUP = "qos.kube-qos-extender.io/node-group"
BUSYBOX = "qos-local/busybox:1.35.0"
ONLY_ON_SOURCE = "localhost:1/qos-local/only-on-batch:1"  # a registry that refuses connections: never pulled
AGENT_NS = "kube-qos-agent"
FAULT_FLAG = "--enable-test-fault-injection"


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


@dataclass
class Cluster:
    env: dict[str, str]
    kube: Kube
    bin_dir: Path
    batch: str
    service: str
    urls: dict[str, str] = field(default_factory=dict)
    # "real-nodes" (hack/real-nodes.sh's kubelets on this host) or "kind" (hack/kind-up.sh: nodes are containers)
    topology: str = "real-nodes"

    def run(self, *cmd: str, timeout: float = 120, check: bool = True) -> str:
        out = subprocess.run(list(cmd), env=self.env, capture_output=True, text=True, timeout=timeout, check=False)
        if check and out.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed ({out.returncode}): {out.stderr[-2000:]}")
        return out.stdout

    def ctr(self, node: str, *args: str, check: bool = True) -> str:
        if self.topology == "kind":
            return self.run("docker", "exec", node, "ctr", "-n", "k8s.io", *args, check=check)
        sock = f"/run/qos-local-nodes/{node}/containerd.sock"
        return self.run(str(self.bin_dir / "ctr"), "--address", sock, "-n", "k8s.io", *args, check=check)

    def node_up(self, node: str) -> bool:
        """The node's machine runs (its containerd answers where it should)."""
        if self.topology == "kind":
            return self.run("docker", "inspect", "-f", "{{.State.Running}}", node, check=False).strip() == "true"
        return Path(f"/run/qos-local-nodes/{node}/containerd.sock").exists()

    def restart_kubelet(self, node: str) -> None:
        """The kubelet stopped and started again (it registers its Node again if that was deleted)."""
        if self.topology == "kind":
            self.run("docker", "exec", node, "systemctl", "restart", "kubelet", timeout=120)
        else:
            self.run(str(ROOT / "hack/real-nodes.sh"), "restart-kubelet", node, timeout=300)

    def kubectl(self, *args: str, timeout: float = 300) -> str:
        return self.run(str(self.bin_dir / "kubectl"), *args, timeout=timeout)

    def logs(self, ns: str, pod: str) -> list[tuple[float, int]]:
        try:
            return logged_ticks(self.bin_dir, self.env, ns, pod)
        except RuntimeError:
            return []  # the pod is gone or not started yet: no ticks

    def counter_tasks(self, node: str, ns: str) -> list[str]:
        """Running containerd tasks of this namespace's counter containers on ``node``."""
        if not self.node_up(node):
            return []
        ids = [ln.split()[0] for ln in self.ctr(node, "tasks", "ls").splitlines()[1:] if "RUNNING" in ln]
        out = []
        for cid in ids:
            info = json.loads(self.ctr(node, "containers", "info", cid, check=False) or "{}")
            labels = info.get("Labels") or {}
            if labels.get("io.kubernetes.pod.namespace") == ns and labels.get("io.kubernetes.container.name") == "c":
                out.append(cid)
        return out


def counter_pod(name: str, node: str, image: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            # opted in to migration: placed by nodeName, it is no qos-scheduler pod (extender/core/migration.py)
            "annotations": {
                "qos.kube-qos-extender.io/class": "gold",
                "qos.kube-qos-extender.io/kind": "batch",
                "qos.kube-qos-extender.io/migratable": "true",
            },
        },
        "spec": {
            "nodeName": node,
            "terminationGracePeriodSeconds": 0,
            "containers": [
                {
                    "name": "c",
                    "image": image,
                    "imagePullPolicy": "Never",
                    "command": ["sh", "-c", "i=0; while true; do echo tick $i; i=$((i+1)); sleep 1; done"],
                    "resources": {"requests": {"cpu": "50m", "memory": "16Mi"}},
                }
            ],
        },
    }


def workload(owner: str, node: str, image: str) -> tuple[str, dict[str, Any]]:
    """(API collection path, object) of the counter run by ``owner``, its pod(s) on ``node``."""
    pod = counter_pod("counter", node, image)
    template = {
        "metadata": {"labels": {"app": "counter"}, "annotations": pod["metadata"]["annotations"]},
        "spec": pod["spec"],
    }
    if owner == "job":
        template["spec"] = pod["spec"] | {"restartPolicy": "Never"}
        spec = {"completions": 1, "parallelism": 1, "backoffLimit": 0, "template": template}
        return "/apis/batch/v1/namespaces/{ns}/jobs", {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": "counter"},
            "spec": spec,
        }
    selector = {"matchLabels": {"app": "counter"}}
    if owner == "deployment":
        spec = {
            "replicas": 1,
            "selector": selector,
            "template": template,
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}},
        }
        return "/apis/apps/v1/namespaces/{ns}/deployments", {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "counter"},
            "spec": spec,
        }
    if owner == "statefulset":
        template["spec"] = pod["spec"] | {"terminationGracePeriodSeconds": 1}
        spec = {"replicas": 1, "serviceName": "counter", "selector": selector, "template": template}
        return "/apis/apps/v1/namespaces/{ns}/statefulsets", {
            "apiVersion": "apps/v1",
            "kind": "StatefulSet",
            "metadata": {"name": "counter"},
            "spec": spec,
        }
    return "/api/v1/namespaces/{ns}/pods", pod


def owner_books(kube: Kube, ns: str, owner: str, survivor: dict[str, Any]) -> str | None:
    """What is wrong with the owner's books once one copy runs, or None (see the module's docstring)."""
    ref = next((r for r in survivor["metadata"].get("ownerReferences") or [] if r.get("controller")), None)
    if owner == "pod":
        return None if ref is None else f"a bare pod got an owner {ref}"
    if ref is None:
        return f"the surviving pod {survivor['metadata']['name']} has no owner"
    if owner == "job":
        if "batch.kubernetes.io/job-tracking" not in (survivor["metadata"].get("finalizers") or []):
            return "the Job's surviving pod has no tracking finalizer"
        st = kube.get(f"/apis/batch/v1/namespaces/{ns}/jobs/counter")["status"]
        others = [
            p["metadata"]["name"]
            for p in kube.pods(ns, label_selector=f"batch.kubernetes.io/controller-uid={ref['uid']}")
            if p["metadata"]["uid"] != survivor["metadata"]["uid"] and not p["metadata"].get("deletionTimestamp")
        ]
        if st.get("active") != 1 or st.get("failed") or others:
            return f"Job status active={st.get('active')} failed={st.get('failed')}, other pods {others}"
        return None
    kind = "replicasets" if owner == "deployment" else "statefulsets"
    st = kube.get(f"/apis/apps/v1/namespaces/{ns}/{kind}/{ref['name']}")["status"]
    if st.get("replicas") != 1 or st.get("readyReplicas") != 1:
        return f"{ref['kind']} status replicas={st.get('replicas')} readyReplicas={st.get('readyReplicas')}"
    return None


def _ready(obj: dict[str, Any] | None) -> bool:
    conds = (obj or {}).get("status", {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conds)


def _get(kube: Kube, path: str) -> dict[str, Any] | None:
    try:
        got: dict[str, Any] = kube.get(path)
    except KubeError as exc:
        if exc.status == 404:
            return None
        raise
    return got


class Bench:
    """Runs faulted moves on a cluster (``one``) with a consolidation flow of its own; ``close`` when done."""

    def __init__(self, cluster: Cluster) -> None:
        env = cluster.env
        self.c = cluster
        self.loop = asyncio.new_event_loop()
        agent = AgentEndpoint(
            cert_file=env["AGENT_CLIENT_CERT"], key_file=env["AGENT_CLIENT_KEY"], ca_file=env["AGENT_CA"]
        )
        settings = ConsolidationSettings(
            enabled=True, agent=agent, migration_timeout_seconds=180, destination_ready_timeout_seconds=60,
            request_attempts=40,  # a killed source agent is back after the kubelet's restart back-off (10 s, 20 s ..)
        )  # fmt: skip
        self.flow = ConsolidationFlow(settings)
        self.agents_replaced = 0
        self.api = self.loop.run_until_complete(new_api_client(KubernetesConfig(kubeconfig=env["KUBECONFIG"])))
        self.flow.attach(self.api, ExtenderConfig().bind)
        self.client = AgentClient(
            AgentTlsConfig(
                cert_file=env["AGENT_CLIENT_CERT"], key_file=env["AGENT_CLIENT_KEY"], ca_file=env["AGENT_CA"]
            ),
                                  timeout_seconds=10)  # fmt: skip

    def close(self) -> None:
        self.loop.run_until_complete(self.flow.stop())
        self.loop.run_until_complete(self.client.close())
        self.loop.run_until_complete(self.api.close())
        self.loop.close()

    def agent_url(self, node: str) -> str:
        n = self.c.kube.get(f"/api/v1/nodes/{node}")
        url = policy.agent_url(n, port=9443)
        if url is None:
            raise RuntimeError(f"no agent address for {node}")
        return url

    def wait_agents(self, timeout: float = 400) -> float:
        """Both agents answer /v1/info with fault injection on; returns how long that took."""
        t0 = time.monotonic()
        last = ""
        while time.monotonic() - t0 < timeout:
            self._replace_backed_off_agents()
            ok = 0
            for node in (self.c.batch, self.c.service):
                try:
                    info = self.loop.run_until_complete(self.client.request("GET", f"{self.agent_url(node)}/v1/info"))
                    ok += bool(info.get("test_fault_injection"))
                except (PeerError, KubeError, RuntimeError) as exc:
                    last = f"{node}: {exc}"
            if ok == 2:
                return time.monotonic() - t0
            time.sleep(1)
        raise RuntimeError(f"agents not back in {timeout:.0f}s: {last}")

    def _replace_backed_off_agents(self) -> None:
        """An agent this bench killed is restarted by its kubelet after a back-off that doubles per kill (10 s to
        5 min, reset only after 10 min running): after a few kills each run would wait minutes for it. That wait is
        the kubelet's policy, not the product's recovery, so a backed-off agent pod is deleted and its DaemonSet
        makes a fresh one (which enrols again). Counted in the run's ``agents_replaced``."""
        for pod in self.c.kube.pods(AGENT_NS, label_selector="app.kubernetes.io/name=qos-agent"):
            states = [s.get("state") or {} for s in pod.get("status", {}).get("containerStatuses") or []]
            if any((st.get("waiting") or {}).get("reason") == "CrashLoopBackOff" for st in states):
                log(f"agent {pod['metadata']['name']} in CrashLoopBackOff: replaced")
                self.c.kube.delete_pod(AGENT_NS, pod["metadata"]["name"])
                self.agents_replaced += 1

    def arm(self, node: str, faults: dict[str, int]) -> None:
        self.loop.run_until_complete(
            self.client.request("PUT", f"{self.agent_url(node)}/v1/test/faults", {"faults": faults})
        )

    def one(self, fault: str | None, index: int, source: str, dest: str, owner: str = "pod") -> dict[str, Any]:
        kube = self.c.kube
        ns = f"bench-faults-{uuid.uuid4().hex[:6]}"
        kube.ensure_namespace(ns)
        result: dict[str, Any] = {"owner": owner, "fault": fault or "none", "index": index, "source": source,
                                  "destination": dest}  # fmt: skip
        try:
            image = ONLY_ON_SOURCE if fault == "restore-refused" else BUSYBOX
            collection, obj = workload(owner, source, image)
            kube.create(collection.format(ns=ns), obj)

            def running() -> dict[str, Any] | None:
                pods = [p for p in kube.pods(ns) if not p["metadata"].get("deletionTimestamp")]
                return pods[0] if len(pods) == 1 and _ready(pods[0]) else None

            src = kube.wait(running, "counter Running", timeout=120)
            name = src["metadata"]["name"]
            path = f"/api/v1/namespaces/{ns}/pods/{name}"
            src_cid = src["status"]["containerStatuses"][0]["containerID"].removeprefix("containerd://")
            kube.wait(lambda: len(self.c.logs(ns, name)) >= 5 or None, "5 ticks", timeout=60, interval=0.5)
            result["agents_back_seconds"] = round(self.wait_agents(), 2)
            for node in (source, dest):  # nothing left armed by an earlier run (a fault set for every attempt)
                self.arm(node, {})
            if fault == "dest-killed-mid-transfer":
                self.arm(dest, {"destination.kill.during-transfer": 1})
            elif fault == "source-killed-after-checkpoint":
                self.arm(source, {"source.kill.after-checkpoint": 1})
            elif fault == "archive-corrupted":
                result["variant"] = "once" if index % 2 else "every attempt"
                self.arm(source, {"source.transfer.corrupt": 1 if index % 2 else -1})
            deleted: list[float] = []
            stop = threading.Event()
            if fault == "dest-node-deleted":
                threading.Thread(
                    target=self._delete_when_restoring, args=(ns, dest, deleted, stop), daemon=True
                ).start()
            follower = LogFollower(self.c.bin_dir, self.c.env, ns, name)
            kube.wait(lambda: follower.ticks or None, "the source's log followed", timeout=30, interval=0.2)
            mid = f"bench-{owner[:6]}-{(fault or 'none')[:12]}-{uuid.uuid4().hex[:6]}"
            t0 = time.monotonic()
            move = self.loop.run_until_complete(self.flow.move_pod(mid, kube.get(path), source, dest))
            result["migration_seconds"] = round(time.monotonic() - t0, 3)
            stop.set()
            if fault == "dest-node-deleted":
                result["node_deleted"] = bool(deleted)
            record = move.get("record") or {}
            result.update(outcome=move["outcome"], verdict=str(move["verdict"].value),
                          reason=str(move.get("reason", ""))[:400], checkpoint_image=move.get("checkpoint_image"),
                          archive_bytes=(record.get("meta") or {}).get("archive_bytes"),
                          agent_timings=record.get("timings"))  # fmt: skip
            time.sleep(1.5)  # the last lines of a source deleted by the commit reach the follower
            source_log = follower.stop()
            if deleted:
                self.c.restart_kubelet(dest)
                kube.wait(lambda: _ready(_get(kube, f"/api/v1/nodes/{dest}")) or None, "node Ready", timeout=120)
            result.update(self._check(ns, src["metadata"]["uid"], src_cid, source_log, record, move))
            if result.get("one_copy"):
                survivor = next(p for p in kube.pods(ns) if not p["metadata"].get("deletionTimestamp"))
                wrong = None
                for _ in range(20):  # the owner's status follows its controller's next sync
                    if (wrong := owner_books(kube, ns, owner, survivor)) is None:
                        break
                    time.sleep(0.5)
                result["owner_ok"], result["owner_problem"] = wrong is None, wrong
            result.update({k: move[k] for k in ("job_replacements", "statefulset_stop_seconds",
                                                "statefulset_recreates_taken_back") if k in move})  # fmt: skip
        except Exception as exc:
            result.setdefault("outcome", "bench-error")
            result["error"] = f"{type(exc).__name__}: {exc}"[:600]
            result.setdefault("one_copy", False)
            result.setdefault("progress_kept", False)
        finally:
            kube.delete_namespace(ns)
        log(f"{owner} {result['fault']} #{index}: {result.get('outcome')} one_copy={result.get('one_copy')} "
            f"progress_kept={result.get('progress_kept')} owner_ok={result.get('owner_ok')} "
            f"{result.get('migration_seconds')}s {result.get('owner_problem') or ''} "
            f"{result.get('error') or result.get('reason', '')[:160]}")  # fmt: skip
        return result

    def _delete_when_restoring(self, ns: str, dest: str, deleted: list[float], stop: threading.Event) -> None:
        """Delete the destination Node as soon as the destination pod (made from the checkpoint image) exists."""
        kube = self.c.kube
        while not stop.is_set():
            pods = [p for p in kube.pods(ns) if p["spec"].get("nodeName") == dest]
            if pods:
                kube.delete_node(dest)
                deleted.append(time.time())
                log(f"deleted node {dest} while {pods[0]['metadata']['name']} was {pods[0]['status'].get('phase')}")
                return
            time.sleep(0.05)

    def _check(
        self,
        ns: str,
        src_uid: str,
        src_cid: str,
        source_log: list[tuple[float, int]],
        record: dict[str, Any],
        move: dict[str, Any],
    ) -> dict[str, Any]:
        kube = self.c.kube

        def settled() -> list[dict[str, Any]] | None:
            pods = [p for p in kube.pods(ns) if not p["metadata"].get("deletionTimestamp")]
            running = [p for p in pods if _ready(p)]
            return running if len(pods) == len(running) == 1 else None

        out: dict[str, Any] = {}
        try:
            running = kube.wait(settled, "one Running counter pod", timeout=90, interval=0.5)
        except Exception:
            names = [(p["metadata"]["name"], p["status"].get("phase")) for p in kube.pods(ns)]
            return {"one_copy": False, "progress_kept": False, "pods": names}
        pod = running[0]
        name = pod["metadata"]["name"]
        cid = pod["status"]["containerStatuses"][0]["containerID"].removeprefix("containerd://")

        def one_task() -> list[str] | None:
            tasks = self.c.counter_tasks(self.c.batch, ns) + self.c.counter_tasks(self.c.service, ns)
            return tasks if tasks == [cid] else None

        try:
            kube.wait(one_task, "one running counter task", timeout=60, interval=1)
            out["one_copy"] = True
        except Exception:
            out["one_copy"] = False
            out["tasks"] = self.c.counter_tasks(self.c.batch, ns) + self.c.counter_tasks(self.c.service, ns)
        source_survived = pod["metadata"]["uid"] == src_uid
        out["survivor"] = "source" if source_survived else "destination"
        # counting on: two more ticks
        last = self.c.logs(ns, name)[-1][1]
        kube.wait(lambda: self.c.logs(ns, name)[-1][1] >= last + 2 or None, "counting on", timeout=30, interval=0.5)
        ticks = self.c.logs(ns, name)
        if source_survived:
            nums = [n for _, n in ticks]
            out["progress_kept"] = cid == src_cid and nums == list(range(len(nums)))
        else:
            committed = next(t for p, t in reversed(record.get("history", [])) if p == "committed")
            cut = next(t for p, t in reversed(record.get("history", [])) if p == "cutover")
            dumped = next(t for p, t in reversed(record.get("history", [])) if p == "final-dumped")
            after = [(t, n) for t, n in ticks if t > committed]
            nums = [n for _, n in after]
            before_cut = [n for t, n in source_log if t <= cut]
            by_dump = [n for t, n in source_log if t <= dumped + 0.05]
            first = nums[0] if nums else -1
            out["progress_kept"] = bool(
                before_cut and before_cut[-1] + 1 <= first <= by_dump[-1] + 1
                and nums == list(range(first, first + len(nums)))
            )  # fmt: skip
            kept = [t for t, n in source_log if n == first - 1]
            if kept and after:
                out["stop_seconds"] = round(after[0][0] - kept[-1], 3)
            out["first_restored_tick"], out["last_tick_before_cutover"] = first, before_cut[-1] if before_cut else None
        return out


def setup(env: dict[str, str], deploy: bool) -> Cluster:
    kube = Kube(env["KUBECONFIG"])
    bin_dir = Path(env["QOS_BIN_DIR"])
    topology = "kind" if env.get("QOS_TOPOLOGY") == "kind" else "real-nodes"
    if topology == "kind":  # kind's workers: every node with a node group that kwok does not fake
        real = [
            n["metadata"]["name"]
            for n in kube.nodes()
            if GROUP in n["metadata"].get("labels", {})
            and "kwok.x-k8s.io/node" not in n["metadata"].get("annotations", {})
        ]
        if deploy:
            raise SystemExit("on kind the product is deployed by hack/kind-up.sh: run with --no-deploy")
    else:
        listing = subprocess.run([str(ROOT / "hack/real-nodes.sh"), "list"], env=env, capture_output=True, text=True,
                                 check=True).stdout  # fmt: skip
        real = [ln.split()[0] for ln in listing.splitlines() if ln.strip()]
    groups = {n: kube.get(f"/api/v1/nodes/{n}")["metadata"]["labels"].get(GROUP) for n in real}
    batch = sorted(n for n, g in groups.items() if g == "batch")
    service = sorted(n for n, g in groups.items() if g == "service")
    if not batch or not service:
        raise SystemExit(f"needs a real batch node and a real service node; real nodes: {groups}")
    c = Cluster(env, kube, bin_dir, batch[0], service[0], topology=topology)
    images = Path(env.get("QOS_CACHE", str(Path.home() / ".cache/kube-qos-extender"))) / "images"
    if deploy:
        t0 = time.monotonic()
        tars = [str(images / t) for t in ("kube-qos-extender.tar", "kube-scheduler.tar")]
        c.run(str(ROOT / "hack/real-nodes.sh"), "import", *tars, timeout=600)
        out = c.run(str(ROOT / "hack/deploy-local.sh"), timeout=900)
        env.update(line.split("=", 1) for line in out.splitlines() if "=" in line)  # type: ignore[misc]
        log(f"images imported and product deployed in {time.monotonic() - t0:.0f}s")
    missing = [k for k in ("AGENT_CA", "AGENT_CLIENT_CERT", "AGENT_CLIENT_KEY") if not env.get(k)]
    if missing:
        raise SystemExit(f"hack/deploy-local.sh's {missing} are not set (run without --no-deploy)")
    return c


def prepare_refusal(c: Cluster) -> None:
    """For restore-refused: the python image on the batch node only, under a name never pulled."""
    images = Path(c.env.get("QOS_CACHE", str(Path.home() / ".cache/kube-qos-extender"))) / "images"
    if ONLY_ON_SOURCE not in c.ctr(c.batch, "images", "ls", "-q").split():
        if c.topology == "kind":  # the tar is on this host, not in the node's container: fed on stdin
            with (images / "python.tar").open("rb") as tar:
                subprocess.run(["docker", "exec", "-i", c.batch, "ctr", "-n", "k8s.io", "images", "import", "-"],
                               stdin=tar, check=True, capture_output=True, timeout=600)  # fmt: skip
        else:
            c.ctr(c.batch, "images", "import", str(images / "python.tar"))
        c.ctr(c.batch, "images", "tag", "--force", "docker.io/qos-local/python:3.11-bookworm", ONLY_ON_SOURCE)
        c.ctr(c.batch, "images", "rm", "docker.io/qos-local/python:3.11-bookworm")
    if ONLY_ON_SOURCE in c.ctr(c.service, "images", "ls", "-q").split():
        raise SystemExit(f"{ONLY_ON_SOURCE} is on {c.service} too: restore-refused would not be refused")


def set_fault_flag(c: Cluster, on: bool) -> None:
    ds = c.kube.get(f"/apis/apps/v1/namespaces/{AGENT_NS}/daemonsets/qos-agent")
    args: list[str] = ds["spec"]["template"]["spec"]["containers"][0].get("args") or []
    want = [a for a in args if a != FAULT_FLAG] + ([FAULT_FLAG] if on else [])
    if want == args:
        return
    patch = [{"op": "replace", "path": "/spec/template/spec/containers/0/args", "value": want}]
    c.kube.request("PATCH", f"/apis/apps/v1/namespaces/{AGENT_NS}/daemonsets/qos-agent", patch,
                   content_type="application/json-patch+json")  # fmt: skip
    c.kubectl("-n", AGENT_NS, "rollout", "status", "daemonset/qos-agent", "--timeout=300s")
    log(f"agent DaemonSet: test fault injection {'on' if on else 'off'}")


def direction(c: Cluster, fault: str | None, index: int) -> tuple[str, str]:
    """(source, destination) of run ``index`` of ``fault``."""
    if fault == "restore-refused":
        return c.batch, c.service  # the counter's image is on the batch node only
    if fault == "dest-node-deleted":
        return c.service, c.batch  # the batch node's Node object goes and comes back (fewer product pods there)
    # alternate, so each agent is killed every other run (the kubelet's restart back-off grows per container)
    return (c.batch, c.service) if index % 2 == 0 else (c.service, c.batch)


def summarise(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per owner kind (``summarise_owner``), and the totals the exit status is made of."""
    owners = sorted({str(r.get("owner", "pod")) for r in runs})
    per = {o: summarise_owner([r for r in runs if r.get("owner", "pod") == o]) for o in owners}
    faulted = [r for r in runs if r["fault"] != "none"]
    return {
        "injected_runs": len(faulted),
        "ended_with_one_copy_and_progress": sum(1 for r in faulted if r.get("one_copy") and r.get("progress_kept")),
        "owner_books_right": sum(1 for r in runs if r.get("owner_ok")),
        "runs": len(runs),
        "per_owner": per,
    }


def summarise_owner(runs: list[dict[str, Any]]) -> dict[str, Any]:
    base = [r["migration_seconds"] for r in runs if r["fault"] == "none" and r.get("outcome") == "succeeded"]
    base_stop = [r["stop_seconds"] for r in runs if r["fault"] == "none" and "stop_seconds" in r]
    b, bs = (statistics.median(base) if base else None), (statistics.median(base_stop) if base_stop else None)
    per: dict[str, Any] = {}
    for fault in ("none", *FAULTS):
        rs = [r for r in runs if r["fault"] == fault]
        if not rs:
            continue
        secs = [r["migration_seconds"] for r in rs if "migration_seconds" in r]
        stops = [r["stop_seconds"] for r in rs if "stop_seconds" in r]
        sizes = [r["archive_bytes"] for r in rs if r.get("archive_bytes")]
        per[fault] = {
            "runs": len(rs),
            "outcomes": dict(Counter(str(r.get("outcome")) for r in rs)),
            "survivor": dict(Counter(str(r.get("survivor")) for r in rs)),
            "one_copy": sum(1 for r in rs if r.get("one_copy")),
            "progress_kept": sum(1 for r in rs if r.get("progress_kept")),
            "owner_ok": sum(1 for r in rs if r.get("owner_ok")),
            "migration_seconds_median": statistics.median(secs) if secs else None,
            "migration_seconds_max": max(secs) if secs else None,
            "migration_time_ratio_to_baseline": round(statistics.median(secs) / b, 3) if secs and b else None,
            "stop_seconds_median": statistics.median(stops) if stops else None,
            "stop_time_ratio_to_baseline": round(statistics.median(stops) / bs, 3) if stops and bs else None,
            "archive_bytes_median": statistics.median(sizes) if sizes else None,
        }
    faulted = [r for r in runs if r["fault"] != "none"]
    return {
        "injected_runs": len(faulted),
        "ended_with_one_copy_and_progress": sum(1 for r in faulted if r.get("one_copy") and r.get("progress_kept")),
        "baseline_migration_seconds_median": b,
        "baseline_stop_seconds_median": bs,
        "per_fault": per,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs-per-fault", type=int, default=4)
    ap.add_argument("--baseline", type=int, default=2, help="fault-free moves, the time baseline")
    ap.add_argument("--faults", default=",".join(FAULTS), help=f"comma-separated subset of {', '.join(FAULTS)}")
    ap.add_argument("--owners", default="pod", help=f"comma-separated subset of {', '.join(OWNERS)}")
    ap.add_argument("--no-deploy", action="store_true", help="the product is deployed and AGENT_* exported")
    ap.add_argument("--out", default=str(ROOT / "bench/results/migration-faults.json"))
    a = ap.parse_args()
    faults = [f for f in a.faults.split(",") if f]
    owners = [o for o in a.owners.split(",") if o]
    unknown = sorted((set(faults) - set(FAULTS)) | (set(owners) - set(OWNERS)))
    if unknown or a.runs_per_fault < 0 or a.baseline < 0:
        ap.error(f"unknown fault(s) or owner(s) {unknown} or negative counts")
    env = dict(os.environ)
    missing = [k for k in ("KUBECONFIG", "QOS_STATE", "QOS_BIN_DIR") if not env.get(k)]
    if missing:
        ap.error(f"{missing} not set: export hack/local-up.sh's KEY=VALUE lines (a cluster with real nodes)")
    t_start = time.monotonic()
    c = setup(env, not a.no_deploy)
    if "restore-refused" in faults:
        prepare_refusal(c)
    set_fault_flag(c, True)
    bench = Bench(c)
    runs: list[dict[str, Any]] = []
    try:
        for owner in owners:
            for i in range(a.baseline):
                runs.append(bench.one(None, i, c.batch, c.service, owner))
            for i in range(a.runs_per_fault):
                for fault in faults:
                    runs.append(bench.one(fault, i, *direction(c, fault, i), owner))
    finally:
        bench.close()
        try:
            set_fault_flag(c, False)
        except Exception as exc:
            log(f"could not turn fault injection off: {exc}")
    doc = {
        "bench": "migration_faults",
        "command": " ".join(sys.argv),
        "nodes": {"batch": c.batch, "service": c.service},
        "wall_seconds": round(time.monotonic() - t_start, 1),
        "agents_replaced_after_crash_loop_backoff": bench.agents_replaced,
        "summary": summarise(runs),
        "runs": runs,
    }
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(doc, indent=1, default=str) + "\n")
    print(json.dumps(doc["summary"], indent=1))
    log(f"wrote {a.out}")
    s = summarise(runs)
    return (
        0 if s["ended_with_one_copy_and_progress"] == s["injected_runs"] and s["owner_books_right"] == s["runs"] else 1
    )


if __name__ == "__main__":
    raise SystemExit(main())
