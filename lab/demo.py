"""`make demo` (python -m lab.demo): the whole product on a kind cluster, in a few minutes, then a report.

1. ``hack/kind-up.sh service:m1.medium=1 batch:m1.large=2`` on a cluster of its own (``QOS_DEMO_CLUSTER``, default
   qos-demo; state ``QOS_DEMO_STATE``, default /tmp/qos-demo-kind): a control plane and three real kind workers
   labelled with node group and flavour, the product deployed from config/kind (qos-scheduler with the extender
   and the QoS controller, the autoscaler with its kwok provider, the node agents with CRIU), kwok and
   Prometheus in the cluster.
2. Each real worker is given the same room, 1.3 cores, by a plain pod standing for load already there: kind's
   workers report the host's cores, so without it the workload below would overflow on a 2-core machine and fit
   without a purchase on a larger one. The demo must show the same thing everywhere.
3. A workload of real busybox containers (services as Deployments, batch jobs as pods with runtimes; gold /
   silver / bronze) larger than the workers: the admission webhook gates every pod, the QoS controller releases
   them in increasing Q (time to violate) onto the room there is (a service of a higher class than one already
   placed gets its room by kube-scheduler's priority preemption), the pods left waiting become the autoscaler's
   demand and it buys a cost-efficient mix of flavours (kwok nodes: the lab's stand-in for a cloud), where the
   rest then runs.
4. One batch pod, a counter printing ``tick N`` every second, is moved from its batch worker to the other by
   checkpoint/restore through the node agents (the consolidation flow's ``move_pod``, as the autoscaler's
   consolidation runs it); the destination's count must go on from the source's.
5. The report (lab/demo_report.py): release order and per-class waits, placement by node group and flavour,
   the purchases and the cost per hour, the migration, the extender's verbs from Prometheus; a PNG and the
   report as text and JSON under ``--out`` (default ``<state>.report``, outside the repo). Then the simulator's
   comparison of the whole product with default Kubernetes (htas-cycle, a few seconds).
6. ``hack/kind-up.sh --down``, also on failure or Ctrl-C (``--keep`` leaves the cluster).

Exit status: 0 when every claim held (``demo_report.failures``), 1 when one did not, 2 when the cluster could
not be brought up. CI runs it first (.ci/run). Progress on stdout, one JSON log line per step in <out>/demo.log.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO
from urllib.parse import quote

from extender.cli import build_parser
from extender.core.model import cpu_millicores
from extender.logs import JsonFormatter
from extender.settings.extender import ExtenderConfig
from lab.demo_report import (
    NAME_LABEL,
    SCHEDULER_PRIORITY,
    Migration,
    Report,
    VerbRow,
    build_report,
    failures,
    parse_ticks,
    preemptions_in,
    render,
    write_plot,
)
from lab.kube_sync import Kube, KubeError, http_json

__all__ = ["NODES", "KindDemo", "filler_cpu", "main", "repo_root", "sample_workload"]

log = logging.getLogger("lab.demo")

PREFIX = "qos.kube-qos-extender.io/"
NAMESPACE = "qos-demo"
BUSYBOX = "qos-local/busybox:1.35.0"  # hack/build-image.sh's, in the kind node image (imagePullPolicy Never)
NODES = ("service:m1.medium=1", "batch:m1.large=2")
ROOM_M = 1300  # cpu each real worker offers the demo (the rest is filled: module docstring, step 2)
COUNTER = "batch-gold-counter"
JOB = "kube-qos-extender-in-cluster"  # config/kind/prometheus.yaml's job for the extender pods
# Up to one more batch cycle (300 s) than the first purchase needs: a batch job the first cycle left over (the
# controller released it to a worker it then did not fit, or a DaemonSet pod took its room) is bought for at the
# next cycle; seen once in CI at d8f73f6 (batch-bronze-1 and -2 still gated at +300 s). The poll ends as soon
# as every pod runs, so a run without a straggler is no longer.
SETTLE_SECONDS = 420.0
# The existing load outranks every class (qos-gold is 1000): a pod with no room by the QoS rules is otherwise
# released to kube-scheduler's priority preemption, which evicted the fillers and undid step 2 of the docstring.
FILLER_PRIORITY: dict[str, Any] = {
    "apiVersion": "scheduling.k8s.io/v1",
    "kind": "PriorityClass",
    "metadata": {"name": "qos-demo-existing-load"},
    "value": 1000000,
    "preemptionPolicy": "Never",
    "description": "make demo: load already on the kind workers, never preempted by the demo's pods",
}


def repo_root() -> Path:
    root = Path(__file__).resolve().parent.parent
    if not (root / "hack" / "kind-up.sh").is_file():
        raise FileNotFoundError(f"{root}/hack/kind-up.sh not found: the demo runs from a source checkout")
    return root


# ---------------------------------------------------------------------------------------------- workload


def _pod(name: str, cls: str, kind: str, cpu: str, memory: str, runtime: int | None, command: str) -> dict[str, Any]:
    ann = {PREFIX + "class": cls, PREFIX + "kind": kind}
    if runtime is not None:
        ann[PREFIX + "runtime-seconds"] = str(runtime)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "annotations": ann,
            "labels": {"app.kubernetes.io/part-of": NAMESPACE, NAME_LABEL: name},
        },
        "spec": {
            "schedulerName": "qos-scheduler",
            "priorityClassName": f"qos-{cls}",
            "terminationGracePeriodSeconds": 0,
            "containers": [
                {
                    "name": "main",
                    "image": BUSYBOX,
                    "imagePullPolicy": "Never",
                    "command": ["sh", "-c", command],
                    "resources": {"requests": {"cpu": cpu, "memory": memory}},
                }
            ],
        },
    }


def as_deployment(pod: Mapping[str, Any]) -> dict[str, Any]:
    """A service as users run one: a Deployment of one replica with ``pod`` as its template. A service pod evicted
    by a preemption (kube-scheduler's by priority, or the controller's by Q) is made again by its ReplicaSet, gated
    and ordered anew; a bare pod would be gone for good (a first run lost a bronze service that way)."""
    name = pod["metadata"]["name"]
    template = {"metadata": {k: v for k, v in pod["metadata"].items() if k != "name"}, "spec": pod["spec"]}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "labels": {"app.kubernetes.io/part-of": NAMESPACE}},
        "spec": {"replicas": 1, "selector": {"matchLabels": {NAME_LABEL: name}}, "template": template},
    }


SLEEP = "exec sleep 86400"
TICKS = "i=0; while true; do echo tick $i; i=$((i+1)); sleep 1; done"


def sample_workload() -> list[dict[str, Any]]:
    """7 services (2.2 cores for a 1.3-core service worker) and 8 batch jobs with runtimes (3.9 cores for two
    1.3-core batch workers), gold / silver / bronze. What the controller releases first (lowest Q, and priority
    for services) runs on the kind workers; what is left waits behind the gate and is bought for: three bronze
    services of 768 MiB (an m3.xsmall and a t3.xsmall are cheaper together than any one flavour holding all
    three) and three bronze batch jobs (a t3.xsmall each). Why these sizes (both found by running the demo):
    the pods left over in one group are of one size, because the controller places them by its own score, not by
    the plan's pod-to-node assignment (a mixed-size batch overflow left one for the next batch cycle, 300 s);
    and no two of them fill a node whole, because the controller fills a new node before its DaemonSet pods
    arrive, and the route DaemonSet's pod (system-node-critical) then preempted one of ours. Runtimes are >= 600 s
    so none counts as ending within the batch cycle."""
    pods = [
        _pod("web-gold-0", "gold", "service", "250m", "256Mi", None, SLEEP),
        _pod("web-gold-1", "gold", "service", "250m", "256Mi", None, SLEEP),
        _pod("web-silver-0", "silver", "service", "250m", "512Mi", None, SLEEP),
        _pod("web-silver-1", "silver", "service", "250m", "512Mi", None, SLEEP),
        _pod("web-bronze-0", "bronze", "service", "400m", "768Mi", None, SLEEP),
        _pod("web-bronze-1", "bronze", "service", "400m", "768Mi", None, SLEEP),
        _pod("web-bronze-2", "bronze", "service", "400m", "768Mi", None, SLEEP),
        # the pod the demo migrates: a counter whose progress must survive the move
        _pod(COUNTER, "gold", "batch", "100m", "32Mi", 3600, TICKS),
        _pod("batch-gold-0", "gold", "batch", "500m", "512Mi", 1200, SLEEP),
        _pod("batch-gold-1", "gold", "batch", "500m", "512Mi", 2400, SLEEP),
        _pod("batch-silver-0", "silver", "batch", "500m", "512Mi", 900, SLEEP),
        _pod("batch-silver-1", "silver", "batch", "500m", "512Mi", 1800, SLEEP),
        _pod("batch-bronze-0", "bronze", "batch", "600m", "512Mi", 600, SLEEP),
        _pod("batch-bronze-1", "bronze", "batch", "600m", "512Mi", 1500, SLEEP),
        _pod("batch-bronze-2", "bronze", "batch", "600m", "512Mi", 3000, SLEEP),
    ]
    return pods


def filler_cpu(node: Mapping[str, Any], pods: Sequence[Mapping[str, Any]], room_m: int = ROOM_M) -> int:
    """Millicores a filler pod must request so that ``node`` keeps exactly ``room_m`` free (0: it has no more)."""
    name = node["metadata"]["name"]
    alloc = cpu_millicores(str(node["status"]["allocatable"]["cpu"]))
    used = sum(
        cpu_millicores(str((c.get("resources") or {}).get("requests", {}).get("cpu", "0")))
        for p in pods
        if (p.get("spec") or {}).get("nodeName") == name
        and (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")
        for c in (p.get("spec") or {}).get("containers") or []
    )
    return max(0, alloc - used - room_m)


def _filler(node: str, cpu_m: int) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"existing-load-{node}", "labels": {"app.kubernetes.io/part-of": "qos-demo-filler"}},
        "spec": {
            "nodeName": node,
            "priorityClassName": FILLER_PRIORITY["metadata"]["name"],
            "terminationGracePeriodSeconds": 0,
            "containers": [
                {
                    "name": "main",
                    "image": BUSYBOX,
                    "imagePullPolicy": "Never",
                    "command": ["sh", "-c", SLEEP],
                    "resources": {"requests": {"cpu": f"{cpu_m}m", "memory": "16Mi"}},
                }
            ],
        },
    }


# ---------------------------------------------------------------------------------------------- the demo


def _ready(pod: Mapping[str, Any]) -> bool:
    status = pod.get("status") or {}
    return status.get("phase") == "Running" and any(
        c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or []
    )


@dataclass
class KindDemo:
    """One run against a kind cluster whose kind-up environment is ``env`` (KEY=VALUE of hack/kind-up.sh)."""

    env: Mapping[str, str]
    out: TextIO = sys.stdout
    timings: dict[str, float] = field(default_factory=dict)
    expected: list[str] = field(default_factory=list)
    names_of: dict[str, str] = field(default_factory=dict)  # pod name -> the demo's name, every pod seen
    uids: dict[str, str] = field(default_factory=dict)  # uid -> pod name, every pod seen
    bare: set[str] = field(default_factory=set)  # demo names whose pod has no owner (nothing re-creates it)
    gone: set[str] = field(default_factory=set)  # of those, the ones kube-scheduler's preemption deleted
    _t0: float = 0.0

    def say(self, text: str = "") -> None:
        print(text, file=self.out, flush=True)

    def step(self, name: str, started: float, **extra: Any) -> None:
        seconds = time.monotonic() - started
        self.timings[name] = seconds
        log.info("demo step done", extra={"step": name, "seconds": round(seconds, 2), "decision": extra or None})

    # ------------------------------------------------------------------------------ reads
    def prom(self, query: str) -> list[dict[str, Any]]:
        doc = http_json(f"{self.env['PROMETHEUS_URL']}/api/v1/query?query={quote(query)}")
        result: list[dict[str, Any]] = doc["data"]["result"]
        return result

    def prom_by(self, query: str, label: str) -> dict[str, float]:
        return {r["metric"].get(label, ""): float(r["value"][1]) for r in self.prom(query)}

    # ------------------------------------------------------------------------------ steps
    def run(self) -> Report:
        kube = Kube(self.env["KUBECONFIG"])
        try:
            return self._run(kube)
        finally:
            kube.close()

    def _run(self, kube: Kube) -> Report:
        t = time.monotonic()
        kube.wait(lambda: self.prom(f'up{{job="{JOB}"}} == 1'), "Prometheus scraping the extender", 120, 1.0)
        kube.ensure_namespace(NAMESPACE)
        self._fill(kube)
        self.step("prepare", t)

        workload = sample_workload()
        services = [as_deployment(p) for p in workload if p["metadata"]["annotations"][PREFIX + "kind"] == "service"]
        jobs = [p for p in workload if p["metadata"]["annotations"][PREFIX + "kind"] == "batch"]
        t = time.monotonic()
        self._t0 = time.time()
        with ThreadPoolExecutor(max_workers=8) as pool:  # all at once: one burst for the controller's passes
            list(pool.map(lambda d: kube.create(f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments", d), services))
            kube.create_pods(NAMESPACE, jobs, parallel=8)
        self.say(
            f"== submitted to qos-scheduler in namespace {NAMESPACE}: {len(services)} services (Deployments of one "
            f"replica) and {len(jobs)} batch jobs (pods with a runtime), gold / silver / bronze"
        )
        self.expected = [p["metadata"]["name"] for p in workload]
        running_at = self._settle(kube, self.expected)
        self.step("workload", t, running=len(running_at))

        t = time.monotonic()
        migration = self._migrate(kube)
        self.step("migration", t, outcome=migration.outcome if migration else None)

        t = time.monotonic()
        report = self._collect(kube, running_at, migration)
        self.step("collect", t)
        report.timings = dict(self.timings)
        return report

    def _fill(self, kube: Kube) -> None:
        kube.request("POST", "/apis/scheduling.k8s.io/v1/priorityclasses", FILLER_PRIORITY, ok=(201, 409))
        workers = kube.nodes(label_selector="type=kind")
        pods = kube.pods()
        made = []
        for node in workers:
            cpu = filler_cpu(node, pods)
            if cpu > 0:
                kube.create_pod(NAMESPACE, _filler(node["metadata"]["name"], cpu))
                made.append(f"{node['metadata']['name']} {cpu}m")
        names = [f"existing-load-{n['metadata']['name']}" for n in workers]

        def running() -> bool:
            by = {p["metadata"]["name"]: p for p in kube.pods(NAMESPACE)}
            return all(_ready(by[n]) for n in names if n in by)

        kube.wait(running, "the existing-load pods Running", 60, 0.5)
        self.say(f"== each kind worker keeps {ROOM_M / 1000:.1f} cores for the demo (existing load: {', '.join(made)})")

    def _settle(self, kube: Kube, names: list[str]) -> dict[str, float]:
        """Poll until each of the demo's ``names`` has a pod Running; return pod name -> seconds after submission
        it was first seen Running, and remember every pod seen (``names_of``, ``uids``: a preempted pod is gone
        by the end, its Events name it)."""
        running_at: dict[str, float] = {}
        deadline = time.monotonic() + SETTLE_SECONDS
        last_said = 0.0
        while True:
            now = time.time() - self._t0
            current = [p for p in kube.pods(NAMESPACE) if NAME_LABEL in (p["metadata"].get("labels") or {})]
            up: set[str] = set()
            present: set[str] = set()
            gated = 0
            for p in current:
                meta = p["metadata"]
                present.add(meta["labels"][NAME_LABEL])
                self.names_of[meta["name"]] = meta["labels"][NAME_LABEL]
                self.uids[meta.get("uid", "")] = meta["name"]
                if not meta.get("ownerReferences"):
                    self.bare.add(meta["labels"][NAME_LABEL])
                gated += 1 if p["spec"].get("schedulingGates") else 0
                if _ready(p) and not meta.get("deletionTimestamp"):
                    running_at.setdefault(meta["name"], now)
                    up.add(meta["labels"][NAME_LABEL])
            vanished = (self.bare & set(names)) - present
            if vanished:
                # a bare pod kube-scheduler preempted is deleted and nothing re-creates it: stop waiting for it
                # (the report shows it); a pod re-queued by the controller is re-created under the same name
                preempted = preemptions_in(kube.events(NAMESPACE), self.names_of, self.uids)
                gone = vanished & {x.victim for x in preempted if x.who == SCHEDULER_PRIORITY}
                for name in sorted(gone - self.gone):
                    self.say(
                        f"   {name} was preempted by kube-scheduler (priority) and deleted: a bare pod, not re-created"
                    )
                self.gone |= gone
            if up | self.gone >= set(names):
                break
            if now - last_said >= 15:
                last_said = now
                bought = len(kube.nodes(label_selector=PREFIX + "provisioned-by"))
                self.say(
                    f"   +{now:3.0f} s: {len(up & set(names))}/{len(names)} Running, {gated} held by the ordering "
                    f"gate, {bought} nodes bought"
                )
            if time.monotonic() > deadline:
                self.say(f"!! not every pod Running after {SETTLE_SECONDS:.0f} s: {', '.join(sorted(set(names) - up))}")
                break
            time.sleep(1.0)
        self.say(f"   +{time.time() - self._t0:3.0f} s: {len(up & set(names))}/{len(names)} Running")
        return running_at

    def _migrate(self, kube: Kube) -> Migration | None:
        path = f"/api/v1/namespaces/{NAMESPACE}/pods/{COUNTER}"
        try:
            src = kube.get(path)
        except KubeError as exc:
            self.say(f"!! no counter pod to migrate: {exc}")
            return None
        source = src["spec"].get("nodeName")
        node = kube.get(f"/api/v1/nodes/{source}") if source else {}
        labels = node.get("metadata", {}).get("labels", {})
        if not source or labels.get("type") != "kind":
            self.say(f"!! the counter runs on {source or 'no node'}, not a kind worker: nothing to checkpoint")
            return None
        others = [
            n["metadata"]["name"]
            for n in kube.nodes(label_selector=f"type=kind,{PREFIX}node-group=batch")
            if n["metadata"]["name"] != source
        ]
        if not others:
            self.say("!! no second batch worker to migrate to")
            return None
        dest = others[0]
        kube.wait(lambda: len(parse_ticks(kube.log(NAMESPACE, COUNTER, timestamps=True))) >= 5, "5 ticks", 60, 0.5)
        self.say(f"\n== migrating {COUNTER} from {source} to {dest} (checkpoint -> transfer -> restore)")
        before = parse_ticks(kube.log(NAMESPACE, COUNTER, timestamps=True))
        result = asyncio.run(_move(self.env, kube.get(path), source, dest))
        record = result.get("record") or {}
        history = tuple((str(p), float(t)) for p, t in record.get("history", []))
        committed = next((t for p, t in reversed(history) if p == "committed"), None)
        dest_pod = str(result.get("destination_pod", "/")).split("/")[-1]
        after: list[tuple[float, int]] = []
        if result.get("outcome") == "succeeded":

            def restored() -> list[tuple[float, int]] | None:
                ticks = parse_ticks(kube.log(NAMESPACE, dest_pod, timestamps=True))
                return ticks if committed is not None and sum(1 for t, _ in ticks if t > committed) >= 3 else None

            try:
                after = kube.wait(restored, "3 ticks from the restored counter", 30, 0.5)
            except TimeoutError:
                after = parse_ticks(kube.log(NAMESPACE, dest_pod, timestamps=True))
        return Migration(
            pod=COUNTER,
            source=source,
            destination=dest,
            destination_pod=dest_pod,
            outcome=str(result.get("outcome")),
            reason=str(result.get("reason") or ""),
            seconds=float(result.get("seconds") or 0.0),
            ticks_source=tuple(before),
            ticks_destination=tuple(after),
            committed=committed,
            phases=history,
        )

    def _collect(self, kube: Kube, running_at: Mapping[str, float], migration: Migration | None) -> Report:
        # one more scrape of the extender after the last step, so Prometheus holds every verb the run caused
        end = time.time()
        try:
            kube.wait(
                lambda: any(float(r["value"][1]) >= end for r in self.prom(f'timestamp(up{{job="{JOB}"}})')),
                "a Prometheus scrape after the run",
                30,
                1.0,
            )
        except TimeoutError:
            self.say("!! no Prometheus scrape after the run: its figures may miss the last seconds")
        sel = f'job="{JOB}"'
        count = self.prom_by(f"sum by (verb) (qos_extender_request_duration_seconds_count{{{sel}}})", "verb")
        total = self.prom_by(f"sum by (verb) (qos_extender_request_duration_seconds_sum{{{sel}}})", "verb")
        p99 = self.prom_by(
            f"histogram_quantile(0.99, sum by (verb, le) (qos_extender_request_duration_seconds_bucket{{{sel}}}))",
            "verb",
        )
        verbs = [
            VerbRow(
                v,
                count.get(v, 0.0),
                1000 * total[v] / count[v] if count.get(v) else None,
                1000 * p99[v] if v in p99 and p99[v] == p99[v] else None,  # NaN: no sample
            )
            for v in ("filter", "prioritize", "preempt", "bind")
        ]
        fulfil = self.prom_by(f"max by (class) (qos_extender_controller_slo_fulfillment{{{sel}}})", "class")
        avail_sum = self.prom_by(f"sum by (class) (qos_extender_controller_request_availability_sum{{{sel}}})", "class")
        avail_n = self.prom_by(f"sum by (class) (qos_extender_controller_request_availability_count{{{sel}}})", "class")
        class_metrics = {
            c: {
                **({"fulfilment": fulfil[c]} if c in fulfil else {}),
                **({"availability": avail_sum[c] / avail_n[c]} if avail_n.get(c) else {}),
            }
            for c in set(fulfil) | set(avail_n)
        }
        reasons = self.prom_by(f"sum by (reason) (qos_extender_controller_releases_total{{{sel}}})", "reason")
        workload = [p for p in kube.pods(NAMESPACE) if NAME_LABEL in (p["metadata"].get("labels") or {})]
        return build_report(
            t0=self._t0,
            workload=workload,
            all_pods=kube.pods(),
            nodes=kube.nodes(),
            events=kube.events(NAMESPACE),
            running_at=running_at,
            names=self.names_of,
            uids=self.uids,
            expected=self.expected,
            verbs=verbs,
            class_metrics=class_metrics,
            slo={name: c.slo for name, c in ExtenderConfig().policy.classes.items()},
            releases_by_reason=reasons,
            migration=migration,
            bare=self.bare,
        )


async def _move(env: Mapping[str, str], pod: dict[str, Any], source: str, dest: str) -> dict[str, Any]:
    """The consolidation flow's move of one pod (extender.consolidation.flow.ConsolidationFlow.move_pod), run here
    with the autoscaler's agent client certificate, as e2e/test_migration_real.py runs it."""
    from extender.consolidation.flow import ConsolidationFlow
    from extender.consolidation.settings import AgentEndpoint, ConsolidationSettings
    from extender.kube.client import new_api_client
    from extender.settings.extender import KubernetesConfig

    settings = ConsolidationSettings(
        enabled=True,
        agent=AgentEndpoint(
            cert_file=env["AGENT_CLIENT_CERT"], key_file=env["AGENT_CLIENT_KEY"], ca_file=env["AGENT_CA"]
        ),
        migration_timeout_seconds=180,
        destination_ready_timeout_seconds=90,
    )
    flow = ConsolidationFlow(settings)
    api = await new_api_client(KubernetesConfig(kubeconfig=env["KUBECONFIG"]))
    try:
        flow.attach(api, ExtenderConfig().bind)
        return await flow.move_pod(f"demo-{uuid.uuid4().hex[:8]}", pod, source, dest)
    finally:
        await flow.stop()
        await api.close()


# ---------------------------------------------------------------------------------------------- cluster


@dataclass
class KindCluster:
    """hack/kind-up.sh for the demo's own cluster name and state (never a developer's qos-kind)."""

    root: Path
    name: str
    state: Path
    logfile: Path

    def _env(self) -> dict[str, str]:
        env = {**os.environ, "QOS_KIND_CLUSTER": self.name, "QOS_KIND_STATE": str(self.state)}
        env.pop("KUBECONFIG", None)
        return env

    def up(self) -> dict[str, str]:
        self.logfile.parent.mkdir(parents=True, exist_ok=True)
        with self.logfile.open("a") as err:
            proc = subprocess.run(
                [str(self.root / "hack" / "kind-up.sh"), *NODES],
                env=self._env(),
                stdout=subprocess.PIPE,
                stderr=err,
                text=True,
                check=False,
            )
        if proc.returncode != 0:
            tail = self.logfile.read_text(errors="replace").splitlines()[-30:]
            raise RuntimeError(f"hack/kind-up.sh failed (exit {proc.returncode}):\n" + "\n".join(tail))
        return dict(line.split("=", 1) for line in proc.stdout.splitlines() if "=" in line)

    def down(self) -> None:
        with self.logfile.open("a") as err:
            subprocess.run(
                [str(self.root / "hack" / "kind-up.sh"), "--down"], env=self._env(), stdout=err, stderr=err, check=False
            )


def _read_env(path: Path) -> dict[str, str]:
    return dict(line.split("=", 1) for line in path.read_text().splitlines() if "=" in line)


def _reset(env: Mapping[str, str], say: Callable[[str], None]) -> None:
    """--reuse: the previous run's namespace and bought nodes gone, the autoscaler (its batch cycle and ledgers)
    and the qos-scheduler (the controller's accounts, the extender's counters) restarted, so the run shows the
    same thing as on a fresh cluster."""
    kube = Kube(env["KUBECONFIG"])
    try:
        kube.delete_namespace(NAMESPACE)
        for n in kube.nodes(label_selector=PREFIX + "provisioned-by"):
            kube.delete_node(n["metadata"]["name"])
        kube.wait(
            lambda: not any(ns["metadata"]["name"] == NAMESPACE for ns in kube.get("/api/v1/namespaces")["items"]),
            "the previous demo namespace gone",
            120,
            1.0,
        )
    finally:
        kube.close()
    kubectl = [str(Path(env["QOS_BIN_DIR"]) / "kubectl"), "--kubeconfig", env["KUBECONFIG"], "-n", "kube-qos-system"]
    for deployment in ("qos-autoscaler", "qos-scheduler"):
        subprocess.run([*kubectl, "rollout", "restart", f"deployment/{deployment}"], check=True, capture_output=True)
    for deployment in ("qos-autoscaler", "qos-scheduler"):
        subprocess.run([*kubectl, "rollout", "status", f"deployment/{deployment}", "--timeout=180s"], check=True,
                       capture_output=True)  # fmt: skip
    say("== reusing the cluster: previous demo namespace and bought nodes removed, qos-scheduler and autoscaler "
        "restarted")  # fmt: skip


def _demo_simulate() -> None:
    """The simulator's comparison of the whole product with default Kubernetes + cluster-autoscaler (a few seconds),
    through the real parser: every option `simulate` reads has its default (a hand-built Namespace missed `days`
    and `make demo` died after its cluster part, issue 31)."""
    ns = build_parser().parse_args(["simulate", "--workload", "htas-cycle", "--policy", "product", "--policy", "k8s"])
    ns.func(ns)


def _log_to(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(path)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.INFO)


def _demo(args: argparse.Namespace) -> int:
    if args.simulate_only:
        print("== simulator: the whole product vs default Kubernetes + cluster-autoscaler (htas-cycle)\n")
        _demo_simulate()
        return 0
    root = repo_root()
    state = Path(os.environ.get("QOS_DEMO_STATE", "/tmp/qos-demo-kind"))
    out = Path(args.out or f"{state}.report")
    out.mkdir(parents=True, exist_ok=True)
    _log_to(out / "demo.log")
    cluster = KindCluster(root, os.environ.get("QOS_DEMO_CLUSTER", "qos-demo"), state, out / "kind-up.log")
    started = time.monotonic()
    rc = 0
    try:
        if args.reuse:
            env = _read_env(Path(args.reuse))
            _reset(env, print)
        else:
            print(f"== bringing up kind cluster {cluster.name}: {' '.join(NODES)} (log {cluster.logfile}) ...",
                  flush=True)  # fmt: skip
            t = time.monotonic()
            env = cluster.up()
            print(f"   up in {time.monotonic() - t:.0f} s, the product deployed from config/kind", flush=True)
        demo = KindDemo(env)
        report = demo.run()
        setup = "reset" if args.reuse else "kind-up"
        report.timings = {setup: time.monotonic() - started - sum(report.timings.values()), **report.timings}
        print()
        text = render(report)
        print("\n".join(text))
        (out / "report.txt").write_text("\n".join(text) + "\n")
        (out / "report.json").write_text(report.to_json())
        plot = write_plot(report, out / "demo-report.png")
        problems = failures(report)
        if problems:
            rc = 1
            print("\n!! the demo did not show everything it should:")
            for p in problems:
                print(f"!!   {p}")
        if not args.no_simulate:
            print("\n== simulator: the whole product vs default Kubernetes + cluster-autoscaler (htas-cycle)\n")
            _demo_simulate()
        print(f"\nreport: {out / 'report.txt'} (JSON {out / 'report.json'}), plot: {plot}")
    except (RuntimeError, TimeoutError, OSError, KubeError, subprocess.CalledProcessError) as exc:
        print(f"make demo: {exc}", file=sys.stderr)
        log.error("demo failed", extra={"error": f"{type(exc).__name__}: {exc}"})
        rc = rc or 2
    finally:
        if args.reuse or args.keep:
            print(
                f"kept the cluster: export KUBECONFIG={state}/kubeconfig; rerun with --reuse {state}/kind.env; "
                f"remove it with QOS_KIND_CLUSTER={cluster.name} QOS_KIND_STATE={state} hack/kind-up.sh --down"
            )
        else:
            t = time.monotonic()
            cluster.down()
            print(f"== cluster {cluster.name} removed in {time.monotonic() - t:.0f} s")
    print(f"make demo: {'ok' if rc == 0 else 'FAILED'} in {time.monotonic() - started:.0f} s")
    return rc


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m lab.demo",
        description="the README's first command: the product on kind, a workload, a migration, the report",
    )
    parser.add_argument("--keep", action="store_true", help="leave the kind cluster running")
    parser.add_argument("--reuse", metavar="KIND_ENV", help="run on a kept cluster (its kind.env); never removed")
    parser.add_argument("--out", help="where the report, plot and logs go (default: <state>.report)")
    parser.add_argument("--no-simulate", action="store_true", help="skip the simulator comparison at the end")
    parser.add_argument("--simulate-only", action="store_true", help="only the simulator comparison (no cluster)")
    return _demo(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
