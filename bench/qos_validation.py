"""Paper 002 §4.4 validation 1 on the real local control plane: QoS controller vs the priority reference.

256 requests (80 gold, 80 silver, 96 bronze; extender/sim/data/validation1.csv), one single-replica Deployment
each (0.375 cpu / 0.375 GiB, terminationGracePeriodSeconds 0), submitted one second apart, on 20 kwok nodes of
3.75 cpu / 3.75 GiB, observed for one hour — all compressed in time by ``--compression c``: arrivals and the
horizon are divided by c, and the extender gets ``controller.time_compression: c``, which multiplies the
measured e, p, run lengths and overheads before the policy sees them and divides the watchdog (10 s) and
the gate bound by c. alpha (2 s), quantum (120 s), hysteresis (90 s) and margins (10 s) stay in workload
seconds, i.e. they are scaled by 1/c in wall time. c = 6 runs one policy in 10 minutes of wall time.

Policies:
* ``qos-driven``: schedulerName qos-scheduler, no PriorityClass; `qos-extender serve` (started here, killed and
  restarted with ``--kill-at``) gates the pods at admission, releases them in increasing Q pinned to a host
  and evicts victims with the Eviction API. It is a controller instance of its own (controller.instance = the
  run's namespace, labelled for it, with its own webhook configuration and Lease), so a local-up extender
  running the default controller instance never touches the run's pods.
* ``priority``: schedulerName default-scheduler with PriorityClasses qos-gold/-silver/-bronze (1000/500/100):
  kube-scheduler's own priority preemption, the paper's reference (§4.1.2). No extender involved.

Availability is measured HERE, independently of the controller, from a pod watch: a request runs while one
of its pods is Running and not terminating, and is pending from its Deployment's creation otherwise. The JSON
uses the simulator's report schema (extender/sim/report.py summarize_classes / class_stats) plus a few
measured extras (alpha = release -> Running, controller accounts vs measurement, gates left).

Needs the cluster of hack/local-up.sh (KUBECONFIG, EXTENDER_URL, EXTENDER_SERVING_CERT/KEY, QOS_STATE):

    set -a; eval "$(hack/local-up.sh)"; set +a
    python bench/qos_validation.py --compression 6 --json /tmp/qos-validation.json
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import json
import math
import os
import signal
import statistics
import string
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import yaml
from kubernetes_asyncio import client as k8s

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from extender.controller.accounting import ACCOUNT_ANNOTATION, decode_account  # noqa: E402
from extender.core.model import DEFAULT_CLASSES  # noqa: E402
from extender.kube.client import ApiError, new_api_client, read_json  # noqa: E402
from extender.settings.extender import KubernetesConfig  # noqa: E402
from extender.sim.report import format_table, summarize_classes  # noqa: E402
from extender.sim.workloads import RequestSpec, qos_validation1  # noqa: E402

NODE_LABEL = "qos-validation"
IMAGE = "registry.invalid/pause:3.10"
WEBHOOK_MANIFEST = ROOT / "hack" / "manifests" / "qos-controller-webhook.yaml"
HORIZON = 3600.0  # paper 002 §4.4.2: the tests ran for one hour


@dataclass
class ReqTrack:
    """Independent e/p measurement of one request (its Deployment), from the pod watch."""

    spec: RequestSpec
    created: float | None = None
    running_pods: set[str] = field(default_factory=set)
    since: float = 0.0
    e: float = 0.0
    p: float = 0.0

    def _fold(self, now: float) -> None:
        if self.created is None:
            return
        dt = max(0.0, now - self.since)
        if self.running_pods:
            self.e += dt
        else:
            self.p += dt
        self.since = now

    def set_running(self, pod: str, running: bool, now: float) -> None:
        self._fold(now)  # the time since the last event belongs to the state before this one
        if running:
            self.running_pods.add(pod)
        else:
            self.running_pods.discard(pod)

    def finish(self, now: float) -> None:
        self._fold(now)


def _name(spec: RequestSpec) -> str:
    return "q-" + spec.request_id.lower().replace("_", "-")


# ------------------------------------------------------------------------------------------ cluster setup


async def ensure_nodes(api: Any, count: int = 20) -> list[str]:
    """20 kwok nodes of 3.75 cpu / 3.75 GiB (paper 002 §4.4.2), labelled for the workload's nodeSelector."""
    core = k8s.CoreV1Api(api)
    names = [f"qv-host-{i}" for i in range(1, count + 1)]
    for name in names:
        body = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": name,
                "annotations": {"kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0"},
                "labels": {"type": "kwok", NODE_LABEL: "host", "kubernetes.io/hostname": name},
            },
            "spec": {},
            "status": {
                "allocatable": {"cpu": "3750m", "memory": "3840Mi", "pods": "110"},
                "capacity": {"cpu": "3750m", "memory": "3840Mi", "pods": "110"},
                "phase": "Running",
            },
        }
        try:
            await read_json(await core.create_node(body, _preload_content=False))
        except ApiError as exc:
            if exc.status != 409:
                raise
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        page = await read_json(await core.list_node(label_selector=f"{NODE_LABEL}=host", _preload_content=False))
        ready = 0
        for node in page["items"]:
            conds = (node.get("status") or {}).get("conditions") or []
            ready += any(c.get("type") == "Ready" and c.get("status") == "True" for c in conds)
        if ready >= count:
            return names
        await asyncio.sleep(0.5)
    raise RuntimeError("kwok nodes did not become Ready within 60 s (is kwok running?)")


INSTANCE_LABEL = "qos.kube-qos-extender.io/controller"


async def ensure_webhook(api: Any, extender_url: str, ca_file: str, instance: str) -> str:
    """The run's own admission webhook: hack/manifests/qos-controller-webhook.yaml renamed for ``instance`` and
    scoped to namespaces labelled qos.kube-qos-extender.io/controller=<instance> (the default webhook skips
    those), so a local-up extender with its own controller never gates, accounts or evicts this run's pods.
    Returns the configuration's name (delete it afterwards)."""
    env = {"EXTENDER_URL": extender_url, "QOS_CA_BUNDLE": base64.b64encode(Path(ca_file).read_bytes()).decode()}
    doc = yaml.safe_load(string.Template(WEBHOOK_MANIFEST.read_text()).safe_substitute(env))
    name = f"{doc['metadata']['name']}-{instance}"
    doc["metadata"]["name"] = name
    for hook in doc["webhooks"]:
        hook["name"] = f"{instance}.{hook['name']}"
        hook["namespaceSelector"] = {"matchLabels": {INSTANCE_LABEL: instance}}
    adm = k8s.AdmissionregistrationV1Api(api)
    with contextlib.suppress(ApiError):
        await read_json(await adm.delete_mutating_webhook_configuration(name, _preload_content=False))
    await read_json(await adm.create_mutating_webhook_configuration(doc, _preload_content=False))
    return name


async def delete_webhook(api: Any, name: str) -> None:
    adm = k8s.AdmissionregistrationV1Api(api)
    with contextlib.suppress(ApiError):
        await read_json(await adm.delete_mutating_webhook_configuration(name, _preload_content=False))


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def deployment(spec: RequestSpec, policy: str, namespace: str) -> dict[str, Any]:
    name = _name(spec)
    pod_spec: dict[str, Any] = {
        "schedulerName": "qos-scheduler" if policy == "qos-driven" else "default-scheduler",
        "terminationGracePeriodSeconds": 0,
        "nodeSelector": {NODE_LABEL: "host"},
        "tolerations": [{"key": "kwok.x-k8s.io/node", "operator": "Exists", "effect": "NoSchedule"}],
        "containers": [
            {
                "name": "app",
                "image": IMAGE,
                "resources": {
                    "requests": {"cpu": f"{spec.cpu_milli}m", "memory": f"{spec.memory_bytes // 2**20}Mi"},
                    "limits": {"cpu": f"{spec.cpu_milli}m", "memory": f"{spec.memory_bytes // 2**20}Mi"},
                },
            }
        ],
    }
    if policy == "priority":
        pod_spec["priorityClassName"] = f"qos-{spec.class_name}"
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": namespace, "labels": {"qv-request": name}},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"qv-request": name}},
            "strategy": {"type": "Recreate"},
            "template": {
                "metadata": {
                    "labels": {"qv-request": name, "qos.kube-qos-extender.io/class": spec.class_name},
                    "annotations": {"qos.kube-qos-extender.io/class": spec.class_name},
                },
                "spec": pod_spec,
            },
        },
    }


def extender_config(state: Path, port: int, compression: float, kubeconfig: str, instance: str) -> dict[str, Any]:
    certs = state / "certs"
    return {
        "server": {
            "host": "127.0.0.1",
            "port": port,
            # No client CA: the API server calls /admission/mutate without a client certificate.
            "tls": {"cert_file": str(certs / "extender-serving.crt"), "key_file": str(certs / "extender-serving.key")},
        },
        "kubernetes": {"kubeconfig": kubeconfig},
        # No marker: this bench runs kube-scheduler without the extender entry (QOS_WITH_EXTENDER=0), so nodes
        # would have to advertise the marker resource.
        "scheduling": {"marker_resource": None},
        # host_score least-allocated: paper 002's prototype and the simulator's qos-driven policy. Leader election
        # on, with a fixed identity: the SIGKILLed extender comes back as the same candidate (a container restart
        # in its pod) and takes its Lease back at once, as in a cluster.
        "controller": {
            "enabled": True,
            "time_compression": compression,
            "watchdog_seconds": 10,
            "instance": instance,
            "host_score": "least-allocated",
            "leader_election": {"enabled": True, "lease_namespace": "kube-system", "identity": f"{instance}-0"},
        },
        # 20 fixed nodes, no autoscaler: no node for a preempted service to wait for (the setting's doc)
        "qos": {"peer_victim_wait_seconds": 0},
        "logging": {"level": "WARNING"},
    }


class Extender:
    """`qos-extender serve` as a child process (killable with SIGKILL for the restart test)."""

    def __init__(self, config: dict[str, Any], url: str, log_path: Path) -> None:
        self.url = url
        self.log_path = log_path
        self.cfg_path = Path(tempfile.mkstemp(prefix="qv-extender-", suffix=".yaml")[1])
        self.cfg_path.write_text(yaml.safe_dump(config))
        self.proc: subprocess.Popen[bytes] | None = None
        self.cpu_before = 0.0  # CPU seconds of earlier (killed) processes

    def cpu(self) -> float:
        return self.cpu_before + (cpu_seconds(self.proc.pid) if self.proc is not None else 0.0)

    async def start(self, ca: str) -> None:
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "extender.cli", "serve", "--config", str(self.cfg_path)],
            cwd=ROOT,
            stdout=log,
            stderr=log,
        )
        import ssl

        ctx = ssl.create_default_context(cafile=ca)
        deadline = time.monotonic() + 30
        async with aiohttp.ClientSession() as session:
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"extender exited with {self.proc.returncode}; see {self.log_path}")
                with contextlib.suppress(aiohttp.ClientError, OSError):
                    async with session.get(f"{self.url}/readyz", ssl=ctx) as r:
                        if r.status == 200:
                            return
                await asyncio.sleep(0.2)
        raise RuntimeError(f"extender not ready after 30 s; see {self.log_path}")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.cpu_before += cpu_seconds(self.proc.pid)
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()

    async def metrics(self, ca: str) -> str:
        import ssl

        ctx = ssl.create_default_context(cafile=ca)
        async with aiohttp.ClientSession() as session, session.get(f"{self.url}/metrics", ssl=ctx) as r:
            return await r.text()


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a live process (0 when it is gone): where the run's CPU went."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def component_cpu(state: Path) -> dict[str, float]:
    """CPU seconds so far of every component hack/local-up.sh started (its pid files)."""
    out: dict[str, float] = {}
    for f in sorted((state / "pids").glob("*.pid")):
        with contextlib.suppress(OSError, ValueError):
            out[f.stem] = cpu_seconds(int(f.read_text().strip()))
    return out


def metric_sum(text: str, name: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and not line.startswith(name + "_created") and " " in line:
            head = line.split(" ")[0]
            if head == name or head.startswith(name + "{"):
                total += float(line.rsplit(" ", 1)[1])
    return total


# ---------------------------------------------------------------------------------------------- the run


class Watcher:
    """Pod watch of the run's namespace: per-request e/p, release -> Running times, gate state."""

    def __init__(self, api: Any, namespace: str, tracks: dict[str, ReqTrack], gate: str) -> None:
        self.core = k8s.CoreV1Api(api)
        self.ns = namespace
        self.tracks = tracks
        self.gate = gate
        self.ungated_at: dict[str, float] = {}
        self.alpha: list[float] = []
        self.pods: dict[str, dict[str, Any]] = {}
        self.rv: str | None = None
        self.started_pods = 0
        self.victims = 0  # Running pods deleted (preemption victims: evictions or kube-scheduler preemption)

    def _apply(self, kind: str, pod: dict[str, Any], now: float) -> None:
        meta = pod.get("metadata") or {}
        name = meta.get("name", "")
        request = (meta.get("labels") or {}).get("qv-request")
        track = self.tracks.get(request or "")
        gates = [g.get("name") for g in (pod.get("spec") or {}).get("schedulingGates") or []]
        phase = (pod.get("status") or {}).get("phase")
        running = kind != "DELETED" and phase == "Running" and meta.get("deletionTimestamp") is None
        prev_running = name in self.pods and (self.pods[name].get("status") or {}).get("phase") == "Running"
        prev_deleting = name in self.pods and (self.pods[name].get("metadata") or {}).get("deletionTimestamp")
        if prev_running and not prev_deleting and (kind == "DELETED" or meta.get("deletionTimestamp")):
            self.victims += 1
        if kind == "DELETED":
            self.pods.pop(name, None)
        else:
            prev = self.pods.get(name)
            was_gated = prev is not None and self.gate in [
                g.get("name") for g in (prev.get("spec") or {}).get("schedulingGates") or []
            ]
            if was_gated and self.gate not in gates:
                self.ungated_at[name] = now
            if prev is None and self.gate not in gates:
                self.ungated_at.setdefault(name, now)  # created ungated (priority run, or webhook down)
            if running and not prev_running:
                self.started_pods += 1
                if name in self.ungated_at:
                    self.alpha.append(now - self.ungated_at.pop(name))
            self.pods[name] = pod
        if track is not None:
            track.set_running(name, running, now)

    async def run(self) -> None:
        while True:
            try:
                kw: dict[str, Any] = {"_preload_content": False}
                if self.rv is None:
                    page = await read_json(await self.core.list_namespaced_pod(self.ns, **kw))
                    now = time.time()
                    for pod in page["items"]:
                        self._apply("ADDED", pod, now)
                    self.rv = page["metadata"]["resourceVersion"]
                resp = await self.core.list_namespaced_pod(
                    self.ns,
                    watch=True,
                    resource_version=self.rv,
                    allow_watch_bookmarks=True,
                    timeout_seconds=300,
                    _request_timeout=aiohttp.ClientTimeout(sock_read=400),
                    **kw,
                )
                buf = b""
                async for chunk in resp.content.iter_any():
                    buf += chunk
                    while b"\n" in buf:
                        line, buf = buf.split(b"\n", 1)
                        if not line.strip():
                            continue
                        ev = orjson.loads(line)
                        obj = ev.get("object") or {}
                        if ev.get("type") == "ERROR":
                            self.rv = None
                            break
                        self.rv = (obj.get("metadata") or {}).get("resourceVersion") or self.rv
                        if ev.get("type") in ("ADDED", "MODIFIED", "DELETED"):
                            self._apply(ev["type"], obj, time.time())
                resp.release()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # reconnect; the measurement keeps its state
                print(f"watch error: {exc!r}", file=sys.stderr)
                await asyncio.sleep(0.5)


async def read_accounts(api: Any, namespace: str) -> dict[str, tuple[float, float, str]]:
    """The controller's persisted accounts (owner annotations), advanced to now: request name -> (e, p, state)."""
    apps = k8s.AppsV1Api(api)
    page = await read_json(await apps.list_namespaced_replica_set(namespace, _preload_content=False))
    out: dict[str, tuple[float, float, str]] = {}
    now = time.time()
    for rs in page["items"]:
        meta = rs["metadata"]
        text = (meta.get("annotations") or {}).get(ACCOUNT_ANNOTATION)
        request = (meta.get("labels") or {}).get("qv-request")
        if text and request:
            acc = decode_account(text)
            e, p = acc.ep(now)
            out[request] = (e, p, acc.state.value)
    return out


async def delete_namespace(api: Any, namespace: str) -> None:
    core = k8s.CoreV1Api(api)
    with contextlib.suppress(ApiError):
        await read_json(await core.delete_namespace(namespace, _preload_content=False))
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            await read_json(await core.read_namespace(namespace, _preload_content=False))
        except ApiError as exc:
            if exc.status == 404:
                return
        await asyncio.sleep(1)


async def run_policy(
    policy: str,
    compression: float,
    *,
    kill_at: float | None = None,
    down_seconds: float = 5.0,
    horizon: float = HORIZON,
    log=print,
) -> dict[str, Any]:
    """One policy over validation 1; returns a report run (simulator schema + measured extras)."""
    kubeconfig = os.environ["KUBECONFIG"]
    state = Path(os.environ.get("QOS_STATE", "/tmp/qos-local"))
    ca = str(state / "certs" / "ca.crt")
    # Our own extender on a free port (local-up's may hold EXTENDER_URL), with a webhook configuration of its own
    # for the run's namespace, deleted afterwards.
    port = free_port()
    own_url = f"https://127.0.0.1:{port}"
    api = await new_api_client(KubernetesConfig(kubeconfig=kubeconfig))
    workload = qos_validation1()
    namespace = f"qv-{policy.split('-')[0]}-{uuid.uuid4().hex[:5]}"
    instance = namespace  # one controller instance per run: its webhook, pods and Lease
    extender: Extender | None = None
    watcher_task: asyncio.Task[None] | None = None
    webhook: str | None = None
    try:
        await ensure_nodes(api)
        core = k8s.CoreV1Api(api)
        apps = k8s.AppsV1Api(api)
        labels = {INSTANCE_LABEL: instance}
        await read_json(
            await core.create_namespace(
                {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace, "labels": labels}},
                _preload_content=False,
            )
        )
        if policy == "qos-driven":
            webhook = await ensure_webhook(api, own_url, ca, instance)
            extender = Extender(
                extender_config(state, port, compression, kubeconfig, instance),
                own_url,
                state / "logs" / "qv-extender.log",
            )
            await extender.start(ca)
        tracks = {_name(r): ReqTrack(r) for r in workload.requests}
        watcher = Watcher(api, namespace, tracks, "qos.kube-qos-extender.io/ordering")
        watcher_task = asyncio.create_task(watcher.run())
        cpu0 = component_cpu(state)
        bench_cpu0 = cpu_seconds(os.getpid())
        t0 = time.time()
        end = t0 + horizon / compression
        killed: dict[str, float] = {}

        async def submit() -> None:
            for r in sorted(workload.requests, key=lambda r: (r.arrival, r.request_id)):
                delay = t0 + r.arrival / compression - time.time()
                if delay > 0:
                    await asyncio.sleep(delay)
                body = deployment(r, policy, namespace)
                track = tracks[_name(r)]
                track.created = track.since = time.time()
                await read_json(await apps.create_namespaced_deployment(namespace, body, _preload_content=False))

        async def chaos() -> None:
            if kill_at is None or extender is None:
                return
            await asyncio.sleep(max(0.0, t0 + kill_at - time.time()))
            extender.kill()
            killed["at"] = time.time() - t0
            log(f"  extender SIGKILLed at {killed['at']:.1f}s, restarting in {down_seconds:.0f}s")
            await asyncio.sleep(down_seconds)
            await extender.start(ca)
            killed["back"] = time.time() - t0

        submitter = asyncio.create_task(submit())
        chaos_task = asyncio.create_task(chaos())
        next_report = t0
        while time.time() < end:
            await asyncio.sleep(min(1.0, max(0.0, end - time.time())))
            if time.time() >= next_report:
                running = sum(bool(t.running_pods) for t in tracks.values())
                gated = sum(
                    any(g.get("name") == watcher.gate for g in (p.get("spec") or {}).get("schedulingGates") or [])
                    for p in watcher.pods.values()
                )
                log(f"  [{policy}] t={time.time() - t0:6.1f}s running={running} gated={gated}")
                next_report += 30
        now = time.time()
        for t in tracks.values():
            t.finish(now)
        await submitter
        await chaos_task
        accounts = await read_accounts(api, namespace) if policy == "qos-driven" else {}
        metrics_text = await extender.metrics(ca) if extender is not None else ""
        cpu1 = component_cpu(state)
        cpu = {k: round(v - cpu0.get(k, 0.0), 1) for k, v in cpu1.items() if k != "qos-extender"}
        cpu["bench"] = round(cpu_seconds(os.getpid()) - bench_cpu0, 1)
        if extender is not None:
            cpu["bench-extender"] = round(extender.cpu(), 1)
        gated_left = [
            name
            for name, p in watcher.pods.items()
            if any(g.get("name") == watcher.gate for g in (p.get("spec") or {}).get("schedulingGates") or [])
        ]
    finally:
        if watcher_task is not None:
            watcher_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher_task
        if webhook is not None:
            await delete_webhook(api, webhook)
        if extender is not None:
            extender.stop()
        await delete_namespace(api, namespace)
        with contextlib.suppress(ApiError):
            await read_json(
                await k8s.CoordinationV1Api(api).delete_namespaced_lease(
                    f"kube-qos-extender-{instance}", "kube-system", _preload_content=False
                )
            )
        await api.close()

    wall = now - t0
    per_request = {name: (t.e / (t.e + t.p) if t.e + t.p > 0 else 1.0) for name, t in tracks.items()}
    triples = [
        (t.spec.class_name, per_request[name], (t.e + t.p) * compression * t.spec.cpu_milli / 1000)
        for name, t in tracks.items()
    ]
    stats, penalty = summarize_classes(triples, DEFAULT_CLASSES)
    busy = sum(t.e for t in tracks.values()) * 0.375
    preemptions = watcher.victims  # measured on the pod watch, for both policies alike
    alpha = sorted(watcher.alpha)
    diffs = [
        abs(e / (e + p) - per_request[name]) for name, (e, p, _) in accounts.items() if e + p > 0 and name in tracks
    ]
    return {
        "policy": policy,
        "classes": stats,
        "penalty": penalty,
        "cost_usd": 0.0,
        "fluid_lower_bound_usd": 0.0,
        "cost_over_fluid": None,
        "node_seconds": 20 * horizon,
        "preemptions": preemptions,
        "evictions": 0,
        "migrations": 0,
        "lost_work_seconds": 0.0,
        "mean_utilization": {"cpu": busy / (20 * 3.75 * wall), "memory": busy / (20 * 3.75 * wall)},
        "wall_seconds": wall,
        "simulated_seconds": horizon,
        "events": None,
        "events_per_second": None,
        "requests_completed": 0,
        "requests_incomplete": len(tracks),
        "nodes_added": 0,
        "nodes_removed": 0,
        "completed_work_seconds": 0.0,
        # measured extras (not in the simulator's runs)
        "compression": compression,
        "per_request_availability": per_request,
        "alpha_seconds": {
            "samples": len(alpha),
            "median_wall": statistics.median(alpha) if alpha else None,
            "p90_wall": alpha[int(0.9 * (len(alpha) - 1))] if alpha else None,
            "max_wall": alpha[-1] if alpha else None,
            "median_workload": statistics.median(alpha) * compression if alpha else None,
        },
        "gated_at_end": len(gated_left),
        "controller_preemptions": metric_sum(metrics_text, "qos_extender_controller_preemptions_total")
        if extender
        else None,
        "gate_timeouts": metric_sum(metrics_text, "qos_extender_controller_gate_timeouts_total")
        if metrics_text
        else None,
        "controller_vs_measured_max_abs_diff": max(diffs) if diffs else None,
        "controller_passes": metric_sum(metrics_text, "qos_extender_controller_passes_total") if extender else None,
        "controller_pass_seconds": metric_sum(metrics_text, "qos_extender_controller_pass_duration_seconds_sum")
        if extender
        else None,
        "controller_account_writes": metric_sum(metrics_text, "qos_extender_controller_account_writes_total")
        if extender
        else None,
        "cpu_seconds": cpu,
        "controller_accounts": len(accounts),
        "zero_availability_requests": sum(a == 0.0 for a in per_request.values()),
        "restart": killed or None,
    }


def compare_runs(base: dict[str, Any], other: dict[str, Any]) -> dict[str, float]:
    """Per request and per class quantile: how far two runs' final availabilities are apart."""
    a, b = base["per_request_availability"], other["per_request_availability"]
    per_request = max(abs(a[k] - b[k]) for k in a if k in b)
    classes = {k: v for k, v in yaml.safe_load(json.dumps(base["classes"])).items()}
    quantile = 0.0
    for cls in classes:
        xs = sorted(v for k, v in a.items() if k in b and _class_of(k) == cls)
        ys = sorted(v for k, v in b.items() if k in a and _class_of(k) == cls)
        if xs and ys:
            quantile = max(quantile, max(abs(x - y) for x, y in zip(xs, ys, strict=False)))
    return {"per_request_max": per_request, "sorted_per_class_max": quantile}


_CLASS_BY_NAME: dict[str, str] = {}


def _class_of(name: str) -> str:
    if not _CLASS_BY_NAME:
        for r in qos_validation1().requests:
            _CLASS_BY_NAME[_name(r)] = r.class_name
    return _CLASS_BY_NAME[name]


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    runs = []
    for policy in args.policies.split(","):
        print(f"running {policy} (compression {args.compression}: {HORIZON / args.compression:.0f} s)", flush=True)
        runs.append(await run_policy(policy, args.compression))
    report: dict[str, Any] = {"workload": "qos-validation1", "compression": args.compression, "runs": runs}
    if args.kill_at is not None:
        print(f"running qos-driven with the extender killed at {args.kill_at}s", flush=True)
        killed = await run_policy("qos-driven", args.compression, kill_at=args.kill_at, down_seconds=args.down)
        report["restart_run"] = killed
        uninterrupted = [r for r in runs if r["policy"] == "qos-driven"]
        if uninterrupted:
            report["restart_comparison"] = compare_runs(uninterrupted[0], killed)
        if len(uninterrupted) >= 2:
            report["restart_comparison_second"] = compare_runs(uninterrupted[1], killed)
    qos_runs = [r for r in runs if r["policy"] == "qos-driven"]
    if len(qos_runs) >= 2:
        # Two uninterrupted runs of the same policy: how far apart the real cluster puts them by itself (the noise
        # floor the restart comparison has to be read against).
        report["repeat_comparison"] = compare_runs(qos_runs[0], qos_runs[1])
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--compression", type=float, default=6.0, help="time compression factor (default 6)")
    parser.add_argument(
        "--policies",
        default="qos-driven,priority",
        help="comma-separated; name qos-driven twice to measure run-to-run noise",
    )
    parser.add_argument("--kill-at", type=float, default=None, help="also run qos-driven with a SIGKILL at this s")
    parser.add_argument("--down", type=float, default=5.0, help="seconds the extender stays down")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    report = asyncio.run(main_async(args))
    print(format_table(report))
    for run in [*report["runs"], *([report["restart_run"]] if "restart_run" in report else [])]:
        print(
            f"{run['policy']}: alpha median {run['alpha_seconds']['median_wall']} s wall "
            f"(p90 {run['alpha_seconds']['p90_wall']}), gated at end {run['gated_at_end']}, "
            f"zero-availability requests {run['zero_availability_requests']}, "
            f"controller vs measured max |dA| {run['controller_vs_measured_max_abs_diff']}, restart {run['restart']}"
        )
    for key in ("restart_comparison", "restart_comparison_second", "repeat_comparison"):
        if key in report:
            print(f"{key}: {report[key]}")
    if args.json is not None:
        args.json.write_text(
            json.dumps(report, indent=2, default=lambda x: None if isinstance(x, float) and math.isnan(x) else x)
        )
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
