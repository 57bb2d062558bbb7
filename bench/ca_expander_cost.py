"""What the real cluster-autoscaler 1.35.2 buys for the CA e2e workload on its own, without our expander and without
the QoS controller: the baseline the issue-27 figures are read against.

The 30 pods of e2e/test_cluster_autoscaler.py's WORKLOAD plus its default-scheduler pod, all as ordinary
default-scheduler pods (nodeSelector = their node group, as nothing of ours filters them), on a cluster with no node
of any group; CA with `--cloud-provider=kwok` (the same template node groups as the e2e test) and each of its own
expanders. Reported per expander: nodes bought by flavour, $/h, seconds until all pods bound. Our own figure comes
from the e2e test (`pytest -m live e2e/test_cluster_autoscaler.py -s`), run on the same cluster.

    set -a; eval "$(QOS_WITH_EXTENDER=1 hack/local-up.sh)"; set +a
    python bench/ca_expander_cost.py --expanders random,least-waste,most-pods --json bench/results/ca-expander-cost.json

Needs KUBECONFIG and the CA binaries (hack/build-ca.sh).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from e2e.ca_support import (
    FLAVOURS,
    cluster_autoscaler,
    kubectl,
    kwok_provider_configmaps,
    kwok_templates,
)
from e2e.test_cluster_autoscaler import WORKLOAD

PRICES = {f.name: f.price_per_hour for f in FLAVOURS}
GROUP_LABEL = "qos.kube-qos-extender.io/node-group"


def _pod(name: str, group: str, cpu: str, memory: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": "ca-bench"}},
        "spec": {
            "terminationGracePeriodSeconds": 0,
            "nodeSelector": {GROUP_LABEL: group},
            "containers": [
                {
                    "name": "c",
                    "image": "registry.k8s.io/pause:3.10",
                    "resources": {"requests": {"cpu": cpu, "memory": memory}},
                }
            ],
        },
    }


def _json(*args: str) -> Any:
    return json.loads(kubectl(*args, "-o", "json"))


def _grouped_nodes() -> dict[str, str]:
    items = _json("get", "nodes")["items"]
    return {
        n["metadata"]["name"]: n["metadata"]["labels"].get("node.kubernetes.io/instance-type", "?")
        for n in items
        if GROUP_LABEL in (n["metadata"].get("labels") or {})
    }


def run(expander: str, kubeconfig: str, logs: Path, timeout: float) -> dict[str, Any]:
    ns = f"ca-bench-{expander}-{int(time.time()) % 100000}"
    if _grouped_nodes():
        raise SystemExit("the cluster has node-group nodes: start from a cluster without them")
    kubectl("create", "namespace", ns)
    kubectl("wait", "--for=jsonpath={.metadata.name}=default", "serviceaccount/default", "-n", ns, "--timeout=30s")
    kwok_provider_configmaps(ns, kwok_templates(FLAVOURS, ("service", "batch")))
    pods = [
        _pod(f"{cls}-{kind}-{i}", kind, cpu, memory)
        for cls, kind, count, cpu, memory, _ in WORKLOAD
        for i in range(count)
    ] + [_pod("default-0", "service", "1", "1Gi")]
    try:
        with cluster_autoscaler(
            "kwok", ns, kubeconfig, logs / f"ca-{expander}.log", [f"--expander={expander}", "--cloud-provider=kwok"]
        ):
            time.sleep(2.0)
            t0 = time.monotonic()
            kubectl(
                "create",
                "-n",
                ns,
                "-f",
                "-",
                stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": pods}).encode(),
            )
            while True:
                items = _json("get", "pods", "-n", ns)["items"]
                if len(items) == len(pods) and all(p["spec"].get("nodeName") for p in items):
                    break
                if time.monotonic() - t0 > timeout:
                    raise SystemExit(f"{expander}: not all pods bound after {timeout} s (log {logs})")
                time.sleep(0.5)
            seconds = time.monotonic() - t0
            bought = Counter(_grouped_nodes().values())
        return {
            "expander": expander,
            "nodes": dict(sorted(bought.items())),
            "node_count": sum(bought.values()),
            "dollars_per_hour": round(sum(PRICES.get(f, 0.0) * n for f, n in bought.items()), 4),
            "seconds_to_all_bound": round(seconds, 1),
        }
    finally:
        kubectl("delete", "namespace", ns, "--wait=false")
        for name in _grouped_nodes():  # CA's kwok provider deletes its nodes on exit; leftovers go here
            kubectl("delete", "node", name, "--ignore-not-found", "--wait=false")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--expanders", default="random,least-waste,most-pods")
    ap.add_argument("--timeout", type=float, default=240.0)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    import os

    kubeconfig = os.environ.get("KUBECONFIG", "")
    if not kubeconfig:
        raise SystemExit("KUBECONFIG is not set")
    logs = Path(tempfile.mkdtemp(prefix="ca-bench-"))
    results = []
    for expander in args.expanders.split(","):
        r = run(expander, kubeconfig, logs, args.timeout)
        results.append(r)
        print(
            f"{expander:12s} nodes {r['node_count']:2d} {r['nodes']} ${r['dollars_per_hour']:.2f}/h, "
            f"all bound {r['seconds_to_all_bound']} s",
            flush=True,
        )
        deadline = time.monotonic() + 60
        while _grouped_nodes() and time.monotonic() < deadline:
            time.sleep(1.0)
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "workload": "e2e/test_cluster_autoscaler.py WORKLOAD + 1 default pod",
                    "ca": "1.35.2 --cloud-provider=kwok",
                    "results": results,
                },
                indent=2,
            )
            + "\n"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
