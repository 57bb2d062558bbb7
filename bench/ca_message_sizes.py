"""The largest requests the real cluster-autoscaler 1.35.2 sends to the sidecar's gRPC servers, on a cluster of
``--nodes`` kwok nodes with a burst of ``--pods`` pending pods: what the receive limits
(``autoscaler.cluster_autoscaler.max_message_bytes`` and ``...cloud_provider.max_message_bytes``) are sized from.

Real parts: kube-apiserver, kube-scheduler, kube-controller-manager, kwok (hack/local-up.sh), the real CA binary
built from ../shared/vendor (hack/build-ca.sh) with ``--cloud-provider=externalgrpc --expander=grpc``, and the
sidecar (``start_autoscaler``) serving both, as deployed (mTLS, the limits under test set far above the default so
nothing is refused while measuring). The ``--nodes`` nodes are tainted (no pod lands there: the burst stays
pending for CA) and belong to no node group (CA asks NodeGroupForNode about each). The burst is one ReplicaSet of
``--pods`` pods without a nodeSelector, so every node group (service/batch x the e2e catalogue's 3 flavours) is
an option of CA's and each option carries every pod that fits on the nodes it may add (``--max-size``).

What is reported: per server and method, the calls and the largest request (bytes, exact, from the servers'
own guard), BestOptions' answer time, and the refused calls (none expected). Nothing here passes or fails.

    set -a; source /tmp/grpc.env; set +a     # a cluster from hack/local-up.sh
    .venv/bin/python bench/ca_message_sizes.py --nodes 5000 --pods 5000 --json bench/results/ca-message-sizes.json

Needs KUBECONFIG and the CA binaries (hack/build-ca.sh). Creates and deletes its nodes (label bench=ca-message-sizes)
and its namespace.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import orjson

from e2e.ca_support import FLAVOURS, cluster_autoscaler, kubectl, pki, tool_dirs
from extender.autoscaler.settings import (
    AutoscalerSettings,
    CaExpanderSettings,
    CloudProviderSettings,
    MetricsSettings,
    ProvisioningRequestSettings,
)
from extender.processes.sidecar import start_autoscaler
from extender.settings.extender import ExtenderConfig, KubernetesConfig

BENCH_LABEL = "bench=ca-message-sizes"
UNLIMITED = 2**31 - 1  # measuring: nothing may be refused


def _node(i: int) -> dict[str, Any]:
    """A cloud-looking node (the labels and annotations a managed node carries), tainted so nothing schedules."""
    name = f"bench-msg-{i:05d}"
    cap = {"cpu": "8", "memory": "32Gi", "pods": "110", "ephemeral-storage": "100Gi"}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {
                "kwok.x-k8s.io/node": "fake",
                "node.alpha.kubernetes.io/ttl": "0",
                "volumes.kubernetes.io/controller-managed-attach-detach": "true",
                "csi.volume.kubernetes.io/nodeid": json.dumps({"pd.csi.storage.gke.io": f"projects/p/zones/z/{name}"}),
            },
            "labels": {
                "bench": "ca-message-sizes",
                "type": "kwok",
                "kubernetes.io/arch": "amd64",
                "kubernetes.io/os": "linux",
                "kubernetes.io/hostname": name,
                "node.kubernetes.io/instance-type": "n2-standard-8",
                "topology.kubernetes.io/region": "europe-west1",
                "topology.kubernetes.io/zone": f"europe-west1-{'bcd'[i % 3]}",
                "cloud.google.com/gke-nodepool": f"pool-{i % 10}",
                "cloud.google.com/machine-family": "n2",
            },
        },
        "spec": {"taints": [{"key": "bench.kube-qos-extender.io/full", "effect": "NoSchedule"}]},
        "status": {"allocatable": cap, "capacity": cap},
    }


def _replicaset(ns: str, replicas: int) -> dict[str, Any]:
    """An ordinary workload's pod: labels, an env, probes, a volume, resources (the pod bytes CA marshals)."""
    labels = {
        "app": "bench-burst",
        "tier": "backend",
        "app.kubernetes.io/name": "bench-burst",
        "pod-template-hash": "x",
    }
    container = {
        "name": "app",
        "image": "registry.k8s.io/pause:3.10",
        "args": ["--port=8080", "--log-level=info"],
        "ports": [{"name": "http", "containerPort": 8080}],
        "env": [{"name": f"SETTING_{k}", "value": f"value-{k}"} for k in range(5)],
        "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}, "limits": {"memory": "64Mi"}},
        "readinessProbe": {"httpGet": {"path": "/ready", "port": "http"}, "periodSeconds": 10},
        "volumeMounts": [{"name": "config", "mountPath": "/etc/app"}],
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "ReplicaSet",
        "metadata": {"name": "bench-burst", "namespace": ns},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels, "annotations": {"prometheus.io/scrape": "true"}},
                "spec": {
                    "terminationGracePeriodSeconds": 0,
                    "containers": [container],
                    "volumes": [{"name": "config", "emptyDir": {}}],
                },
            },
        },
    }


def _create_nodes(n: int, chunk: int = 200) -> None:
    """In bulk (a List per kubectl call), skipping those a previous run left (a shared 2-core machine is slow)."""
    have = set(kubectl("get", "nodes", "-l", BENCH_LABEL, "-o", "name").split())
    for start in range(0, n, chunk):
        items = [_node(i) for i in range(start, min(n, start + chunk))]
        items = [i for i in items if f"node/{i['metadata']['name']}" not in have]
        if items:
            subprocess.run(
                [str(tool_dirs()[0] / "kubectl"), "create", "-f", "-"],
                input=orjson.dumps({"apiVersion": "v1", "kind": "List", "items": items}),
                capture_output=True,
                check=True,
                timeout=600,
            )


def _ready_nodes() -> int:
    out = kubectl("get", "nodes", "-l", BENCH_LABEL, "--no-headers")
    return sum(1 for line in out.splitlines() if len(line.split()) > 1 and line.split()[1] == "Ready")


def _unschedulable(ns: str) -> int:
    out = kubectl(
        "get", "pods", "-n", ns, "-o",
        "jsonpath={range .items[*]}{.status.conditions[?(@.type=='PodScheduled')].reason}{'\\n'}{end}",
    )  # fmt: skip
    return sum(1 for line in out.splitlines() if line.strip() == "Unschedulable")


def _cleanup(ns: str) -> None:
    with contextlib.suppress(AssertionError):
        kubectl("delete", "namespace", ns, "--wait=false")
    for selector in ("qos.kube-qos-extender.io/provisioned-by=qos-autoscaler",):  # what CA bought through us
        with contextlib.suppress(AssertionError):
            kubectl("delete", "nodes", "-l", selector, "--wait=false")


async def _run(args: argparse.Namespace) -> dict[str, Any]:
    kubeconfig = os.environ["KUBECONFIG"]
    ns = args.namespace or f"bench-msg-{int(time.time()) % 100000}"
    work = Path(tempfile.mkdtemp(prefix="ca-message-sizes-"))
    certs = pki(work)
    t0 = time.monotonic()
    if args.nodes:
        _create_nodes(args.nodes)
        print(f"{_ready_nodes()}/{args.nodes} bench nodes Ready after {time.monotonic() - t0:.0f} s", file=sys.stderr)
    if not args.namespace:
        kubectl("create", "namespace", ns)
        # the whole burst pending (kube-scheduler tried each pod) before CA starts: its first loop sees all of it
        kubectl("apply", "-f", "-", stdin=orjson.dumps(_replicaset(ns, args.pods)))
    deadline = time.monotonic() + args.ready_timeout
    while (waiting := _unschedulable(ns)) < args.pods and time.monotonic() < deadline:
        await asyncio.sleep(5)
    print(f"{waiting}/{args.pods} pods Unschedulable after {time.monotonic() - t0:.0f} s", file=sys.stderr)
    settings = AutoscalerSettings(
        provider="cluster-autoscaler",
        scheduler_names=("qos-scheduler",),
        flavours=FLAVOURS,
        scan_interval_seconds=30.0,
        metrics=MetricsSettings(port=0),
        cluster_autoscaler=CaExpanderSettings(
            listen="127.0.0.1:0",
            cert_file=str(certs["server.crt"]),
            key_file=str(certs["server.key"]),
            max_message_bytes=UNLIMITED,
            cloud_provider=CloudProviderSettings(
                cert_file=str(certs["server.crt"]),
                key_file=str(certs["server.key"]),
                client_ca_file=str(certs["ca.crt"]),
                listen="127.0.0.1:0",
                max_size=args.max_size,
                clients=("cluster-autoscaler", "client"),
                max_message_bytes=UNLIMITED,
            ),
            provisioning_requests=ProvisioningRequestSettings(enabled=False),
        ),
    )
    config = ExtenderConfig(kubernetes=KubernetesConfig(kubeconfig=kubeconfig, watch_timeout_seconds=300))
    running = await start_autoscaler(config, settings)
    cc = work / "cloud-config.yaml"
    cc.write_text(
        f"address: 127.0.0.1:{running.cloud_provider.port}\ncert: {certs['client.crt']}\n"
        f"key: {certs['client.key']}\ncacert: {certs['ca.crt']}\ngrpc_timeout: 30s\n"
    )
    extra = [
        "--cloud-provider=externalgrpc",
        f"--cloud-config={cc}",
        "--expander=grpc",
        f"--grpc-expander-url=127.0.0.1:{running.expander.port}",
        f"--grpc-expander-cert={certs['ca.crt']}",
        "--enable-provisioning-requests=false",
        "--scan-interval=10s",
        f"--max-nodes-per-scaleup={args.max_size}",
        "--v=2",
        # kwok on a shared 2-core machine lets some of 5,000 nodes miss heartbeats: CA must not stop at "cluster
        # unhealthy" (it would send nothing); unready nodes are still nodes it lists and asks NodeGroupForNode about
        "--max-total-unready-percentage=100",
        "--ok-total-unready-count=100000",
    ]
    guards = {"expander": running.expander.guard, "cloudprovider": running.cloud_provider.guard}
    log_path = work / "cluster-autoscaler.log"
    result: dict[str, Any] = {}
    try:
        with cluster_autoscaler("externalgrpc", ns, kubeconfig, log_path, extra):
            burst = time.monotonic()
            while time.monotonic() - burst < args.duration:
                await asyncio.sleep(5)
                calls = running.expander.guard.calls.get("BestOptions", 0)
                if calls >= args.best_options:
                    break
            result = {
                "nodes": args.nodes,
                "pods": args.pods,
                "pods_unschedulable_at_start": waiting,
                "max_size": args.max_size,
                "node_groups": len(running.cloud_provider.state.specs),
                "seconds_after_burst": round(time.monotonic() - burst, 1),
                "servers": {
                    name: {
                        method: {"calls": g.calls.get(method, 0), "largest_bytes": g.largest.get(method, 0)}
                        for method in sorted(g.calls)
                    }
                    for name, g in guards.items()
                },
                "best_options_answer_seconds": {
                    "count": _hist(running.metrics, "qos_extender_autoscaler_expander_duration_seconds", "_count"),
                    "sum": _hist(running.metrics, "qos_extender_autoscaler_expander_duration_seconds", "_sum"),
                },
                "refused": _refused(running.metrics),
                "ca_log": str(log_path),
            }
    finally:
        await running.stop()
        if not args.keep_nodes:
            _cleanup(ns)
    return result


def _hist(metrics: Any, name: str, suffix: str) -> float:
    value = metrics.registry.get_sample_value(name + suffix)
    return round(float(value or 0.0), 4)


def _refused(metrics: Any) -> dict[str, float]:
    out: dict[str, float] = {}
    for family in metrics.registry.collect():
        if family.name == "qos_extender_autoscaler_refused_calls":
            for s in family.samples:
                if s.name.endswith("_total"):
                    out[f"{s.labels['server']}/{s.labels['method']}/{s.labels['reason']}"] = s.value
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=5000, help="tainted kwok nodes (the cluster's size)")
    parser.add_argument("--pods", type=int, default=5000, help="pending pods in one burst")
    parser.add_argument("--max-size", type=int, default=200, help="each node group's max size")
    parser.add_argument("--best-options", type=int, default=3, help="stop after this many BestOptions calls")
    parser.add_argument("--duration", type=float, default=600.0, help="seconds to wait after the burst, at most")
    parser.add_argument("--ready-timeout", type=float, default=600.0)
    parser.add_argument("--namespace", help="reuse this namespace's burst (a previous run's, left by --keep-nodes)")
    parser.add_argument("--keep-nodes", action="store_true", help="leave the bench nodes for the next run")
    parser.add_argument("--json", type=Path, help="also write the result here")
    args = parser.parse_args()
    try:
        result = asyncio.run(_run(args))
    finally:
        if not args.keep_nodes:
            with contextlib.suppress(AssertionError):
                kubectl("delete", "nodes", "-l", BENCH_LABEL, "--wait=false")
    text = json.dumps(result, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")


if __name__ == "__main__":
    main()
