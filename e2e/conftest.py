"""e2e fixtures: a real cluster from the environment hack/local-up.sh prints (QOS_WITH_EXTENDER=1).

Required: KUBECONFIG, EXTENDER_URL, EXTENDER_CA, EXTENDER_CLIENT_CERT, EXTENDER_CLIENT_KEY, PROMETHEUS_URL.
Missing or unreachable -> the tests FAIL (never skip): a skipped e2e test proves nothing. `make e2e` (or
hack/run-live-tests.sh) brings the local cluster up when KUBECONFIG is not given.

Isolation: each test gets its own namespace and its own kwok nodes labelled ``e2e-run=<id>``; its pods
select those nodes (nodeSelector), so tests neither see nor disturb each other's or the cluster's nodes.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from lab.kube_sync import Kube, KubeError, http_json, scrape_metrics

_LIFECYCLE_TAINTS = ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable")

MARKER = os.environ.get("QOS_MARKER_RESOURCE") or "qos.kube-qos-extender.io/managed"
PREFIX = "qos.kube-qos-extender.io/"
IMAGE = "registry.invalid/pause:3.9"
REQUIRED = (
    "KUBECONFIG",
    "EXTENDER_URL",
    "EXTENDER_CA",
    "EXTENDER_CLIENT_CERT",
    "EXTENDER_CLIENT_KEY",
    "PROMETHEUS_URL",
)
FLAVOURS = {"m1.medium": ("2", "4Gi"), "m1.large": ("4", "8Gi"), "m1.xlarge": ("8", "16Gi")}

Sample = dict[tuple[str, tuple[tuple[str, str], ...]], float]


@dataclass
class Cluster:
    kube: Kube
    extender_url: str
    ca: str
    cert: str
    key: str
    prometheus_url: str
    state: Path | None

    def metrics(self) -> Sample:
        return scrape_metrics(f"{self.extender_url}/metrics", self.ca, self.cert, self.key)

    def prom(self, query: str) -> list[dict[str, Any]]:
        from urllib.parse import quote

        doc = http_json(f"{self.prometheus_url}/api/v1/query?query={quote(query)}")
        assert doc["status"] == "success", doc
        result: list[dict[str, Any]] = doc["data"]["result"]
        return result


def counter(samples: Sample, name: str, **labels: str) -> float:
    """Sum of the samples of ``name`` whose labels include ``labels``."""
    return sum(v for (n, ls), v in samples.items() if n == name and all((k, v2) in ls for k, v2 in labels.items()))


def _fail(msg: str) -> None:
    pytest.fail(msg, pytrace=False)


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    missing = [k for k in REQUIRED if not os.environ.get(k)]
    if missing:
        _fail(
            f"e2e needs a real cluster with the extender: {', '.join(missing)} not set. Run `make e2e`, or "
            '`set -a; eval "$(QOS_WITH_EXTENDER=1 hack/local-up.sh)"; set +a` first.'
        )
    env = os.environ
    try:
        kube = Kube(env["KUBECONFIG"])
        kube.get("/version")
    except Exception as exc:
        _fail(f"KUBECONFIG={env['KUBECONFIG']} does not reach an API server: {exc!r}")
    c = Cluster(
        kube,
        env["EXTENDER_URL"].rstrip("/"),
        env["EXTENDER_CA"],
        env["EXTENDER_CLIENT_CERT"],
        env["EXTENDER_CLIENT_KEY"],
        env["PROMETHEUS_URL"].rstrip("/"),
        Path(env["QOS_STATE"]) if env.get("QOS_STATE") else None,
    )
    try:
        c.metrics()
    except Exception as exc:
        _fail(f"the extender does not answer on {c.extender_url}/metrics: {exc!r} (QOS_WITH_EXTENDER=1?)")
    yield c
    kube.close()


@dataclass
class Run:
    """One test's namespace and nodes."""

    cluster: Cluster
    id: str
    ns: str
    nodes: list[str] = field(default_factory=list)

    @property
    def kube(self) -> Kube:
        return self.cluster.kube

    def node(self, name: str, group: str, flavour: str = "m1.large") -> str:
        cpu, mem = FLAVOURS[flavour]
        full = f"{self.id}-{name}"
        self.kube.create_node(
            {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {
                    "name": full,
                    "annotations": {"kwok.x-k8s.io/node": "fake", f"{PREFIX}price-per-hour": "0.2"},
                    "labels": {
                        "type": "kwok",
                        "e2e-run": self.id,
                        "kubernetes.io/hostname": full,
                        "kubernetes.io/os": "linux",
                        "kubernetes.io/arch": "amd64",
                        "node.kubernetes.io/instance-type": flavour,
                        f"{PREFIX}node-group": group,
                    },
                },
                "spec": {},
                "status": {
                    "allocatable": {"cpu": cpu, "memory": mem, "pods": "110"},
                    "capacity": {"cpu": cpu, "memory": mem, "pods": "110"},
                },
            }
        )
        self.nodes.append(full)
        return full

    def wait_nodes_ready(self) -> None:
        def ready() -> bool:
            # Ready is not enough: the node lifecycle controller removes its not-ready NoSchedule taint on its
            # next sync (up to node-monitor-period later), and until then kube-scheduler filters the node out,
            # so a test expecting two feasible nodes would see one (and no prioritize call).
            nodes = {n["metadata"]["name"]: n for n in self.kube.nodes(f"e2e-run={self.id}")}
            return all(
                any(c["type"] == "Ready" and c["status"] == "True" for c in nodes[n]["status"].get("conditions", []))
                and not any(t.get("key") in _LIFECYCLE_TAINTS for t in nodes[n]["spec"].get("taints") or [])
                for n in self.nodes
                if n in nodes
            ) and len(nodes) == len(self.nodes)

        self.kube.wait(ready, f"nodes {self.nodes} Ready", timeout=60)
        # The extender and kube-scheduler both watch nodes: give them a moment to see them.
        self.kube.wait(lambda: self.extender_sees_nodes(), "the extender to see the new nodes", timeout=30)

    def extender_sees_nodes(self) -> bool:
        got = counter(self.cluster.metrics(), "qos_extender_snapshot_objects", kind="nodes")
        return got >= len(self.kube.nodes())

    def pod(
        self,
        name: str,
        cpu: str = "500m",
        memory: str = "256Mi",
        *,
        qos: bool = True,
        kind: str | None = None,
        runtime: float | None = None,
        cls: str | None = None,
        priority_class: str | None = None,
        node_name: str | None = None,
        select_run: bool = True,
        labels: dict[str, str] | None = None,
        marker: bool = True,
    ) -> dict[str, Any]:
        """A pod for the qos-scheduler (with the routing marker unless marker=False: then only the admission
        webhook can add it) or, with qos=False, the default-scheduler."""
        ann: dict[str, str] = {}
        if kind:
            ann[f"{PREFIX}kind"] = kind
        if runtime is not None:
            ann[f"{PREFIX}runtime-seconds"] = str(int(runtime))
        if cls:
            ann[f"{PREFIX}class"] = cls
        requests: dict[str, str] = {"cpu": cpu, "memory": memory}
        limits: dict[str, str] = {}
        if qos and marker:
            requests[MARKER] = limits[MARKER] = "1"
        spec: dict[str, Any] = {
            "terminationGracePeriodSeconds": 0,
            "containers": [{"name": "c", "image": IMAGE, "resources": {"requests": requests, "limits": limits}}],
        }
        if qos:
            spec["schedulerName"] = "qos-scheduler"
        if priority_class:
            spec["priorityClassName"] = priority_class
        if node_name:
            spec["nodeName"] = node_name
        elif select_run:
            spec["nodeSelector"] = {"e2e-run": self.id}
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": self.ns, "annotations": ann, "labels": labels or {}},
            "spec": spec,
        }

    def create(self, *pods: dict[str, Any]) -> None:
        self.kube.create_pods(self.ns, list(pods))

    def pods(self) -> dict[str, dict[str, Any]]:
        return {p["metadata"]["name"]: p for p in self.kube.pods(self.ns)}

    def node_of(self, name: str) -> str | None:
        try:
            pod = self.kube.get(f"/api/v1/namespaces/{self.ns}/pods/{name}")
        except KubeError:
            return None
        node: str | None = pod["spec"].get("nodeName")
        return node

    def wait_bound(self, *names: str, timeout: float = 60.0) -> dict[str, str]:
        def bound() -> dict[str, str] | None:
            pods = self.pods()
            got = {n: pods[n]["spec"].get("nodeName") for n in names if n in pods}
            return got if len(got) == len(names) and all(got.values()) else None

        result: dict[str, str] = self.kube.wait(bound, f"pods {names} bound", timeout=timeout)
        return result


def _run(cluster: Cluster, labels: dict[str, str] | None = None) -> Iterator[Run]:
    rid = f"e2e-{uuid.uuid4().hex[:6]}"
    r = Run(cluster, rid, rid)
    cluster.kube.ensure_namespace(rid, labels)
    yield r
    cluster.kube.delete_namespace(rid)
    for n in r.nodes:
        cluster.kube.delete_node(n)


@pytest.fixture
def run(cluster: Cluster) -> Iterator[Run]:
    """A namespace of the default controller instance: qos pods are gated at admission and released by the
    local-up extender's QoS controller (pinned to the host it chose), then scheduled through the extender."""
    yield from _run(cluster)


@pytest.fixture
def unordered_run(cluster: Cluster) -> Iterator[Run]:
    """A namespace routed to a controller instance that does not run (label qos.kube-qos-extender.io/controller):
    no webhook gates its pods and no controller orders them, so kube-scheduler hands them straight to the
    extender's verbs (filter, prioritize over every feasible node, preempt, bind) — the extender alone."""
    yield from _run(cluster, {"qos.kube-qos-extender.io/controller": "unordered"})


def eventually(check: Any, what: str, timeout: float = 30.0, interval: float = 0.5) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what} (last: {last!r})")
