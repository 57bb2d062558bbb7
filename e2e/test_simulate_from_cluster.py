"""`qos-extender simulate --from-cluster` against a real cluster (issue 33 part 5): a small workload runs on kwok
nodes of this test's own (a real kube-apiserver, kube-scheduler, kube-controller-manager's Job controller, kwok
completing the Jobs' pods), then the CLI, as a subprocess with the cluster's KUBECONFIG and the local Prometheus,
replays the window under `product` and must report what ran: the pods counted, the bill = each node's flavour
price x its life in the window (per minute, rounded up), the malformed annotation counted, the assumptions printed.

The workload: a service node (m1.medium) and a batch node (m1.large) of the catalogue and a batch node of an
unknown flavour (priced as the nearest catalogue flavour: an assumption the report must name), all there before
the first pod; two silver services; two bronze Jobs (kwok completes a Job's pod the moment it runs); three bronze
batch pods that run ~20 s, ended by the test writing the terminated status a kubelet would (kwok has no runtime
for bare pods); a pod with an unknown class (defaulted to bronze); a 6-cpu batch pod that fits none of the nodes
until a fourth (m1.xlarge, the cluster's "own scaling") is added after it, and a 16-cpu pod that fits nothing and
never starts.
Needs KUBECONFIG and PROMETHEUS_URL (hack/local-up.sh prints both); no extender.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import orjson
import pytest

from extender.kube.convert import parse_timestamp
from lab.kube_sync import Kube
from tests.live import require_kubeconfig

pytestmark = [pytest.mark.live]

PREFIX = "qos.kube-qos-extender.io/"
ROOT = Path(__file__).resolve().parent.parent
# catalogue prices (extender/flavours.yaml)
PRICES = {"m1.medium": 0.1371, "m1.large": 0.2746, "m1.xlarge": 0.5479}


def _node(name: str, run: str, group: str, flavour: str, cpu: str, memory: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {"kwok.x-k8s.io/node": "fake"},
            "labels": {
                "type": "kwok",
                "fc-run": run,
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "node.kubernetes.io/instance-type": flavour,
                f"{PREFIX}node-group": group,
            },
        },
        "spec": {},
        "status": {
            "allocatable": {"cpu": cpu, "memory": memory, "pods": "110"},
            "capacity": {"cpu": cpu, "memory": memory, "pods": "110"},
        },
    }


def _spec(run: str, group: str, cpu: str, memory: str, restart: str = "Always") -> dict[str, Any]:
    return {
        "terminationGracePeriodSeconds": 0,
        "restartPolicy": restart,
        "nodeSelector": {"fc-run": run, f"{PREFIX}node-group": group},
        "tolerations": [{"key": "kwok.x-k8s.io/node", "operator": "Exists", "effect": "NoSchedule"}],
        "containers": [
            {
                "name": "c",
                "image": "registry.invalid/pause:3.9",
                "resources": {"requests": {"cpu": cpu, "memory": memory}},
            }
        ],
    }


def _pod(name: str, run: str, group: str, cpu: str, memory: str, ann: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "annotations": {f"{PREFIX}{k}": v for k, v in ann.items()}},
        "spec": _spec(run, group, cpu, memory),
    }


def _job(name: str, run: str) -> dict[str, Any]:
    ann = {f"{PREFIX}class": "bronze", f"{PREFIX}kind": "batch", f"{PREFIX}runtime-seconds": "30"}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {
            "backoffLimit": 0,
            "template": {"metadata": {"annotations": ann}, "spec": _spec(run, "batch", "1", "2Gi", "Never")},
        },
    }


def _complete(kube: Kube, ns: str, name: str) -> None:
    """What a kubelet writes when the pod's only container exits 0."""
    pod = kube.get(f"/api/v1/namespaces/{ns}/pods/{name}")
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    started = pod["status"].get("startTime", now)
    status = {
        "phase": "Succeeded",
        "containerStatuses": [
            {
                "name": "c",
                "image": "registry.invalid/pause:3.9",
                "imageID": "",
                "ready": False,
                "restartCount": 0,
                "state": {
                    "terminated": {"exitCode": 0, "reason": "Completed", "startedAt": started, "finishedAt": now}
                },
            }
        ],
    }
    kube.request(
        "PATCH", f"/api/v1/namespaces/{ns}/pods/{name}/status", {"status": status},
        content_type="application/merge-patch+json",
    )  # fmt: skip


def test_from_cluster_replays_what_ran(tmp_path: Path) -> None:
    kubeconfig = require_kubeconfig()
    prometheus = os.environ.get("PROMETHEUS_URL")
    if not prometheus:
        pytest.fail("PROMETHEUS_URL is not set (hack/local-up.sh prints it)", pytrace=False)
    kube = Kube(kubeconfig)
    run = f"fc-{uuid.uuid4().hex[:6]}"
    ns = run
    nodes = {
        f"{run}-svc": _node(f"{run}-svc", run, "service", "m1.medium", "2", "8Gi"),
        f"{run}-batch": _node(f"{run}-batch", run, "batch", "m1.large", "4", "16Gi"),
        # not in the catalogue: 3 cpu / 6 GiB is nearest to m1.medium (2 / 8 GiB)
        f"{run}-odd": _node(f"{run}-odd", run, "batch", "x9.custom", "3", "6Gi"),
    }
    late = f"{run}-late"
    started = time.monotonic()
    try:
        kube.ensure_namespace(ns)
        for body in nodes.values():
            kube.create_node(body)
        kube.wait(
            lambda: (
                all(
                    any(c["type"] == "Ready" and c["status"] == "True" for c in n["status"].get("conditions", []))
                    and not (n["spec"].get("taints") or [])
                    for n in kube.nodes(f"fc-run={run}")
                )
                and len(kube.nodes(f"fc-run={run}")) == 3
            ),
            "the nodes Ready and untainted",
            timeout=60,
        )
        kube.create_pods(
            ns,
            [
                _pod("web-1", run, "service", "500m", "1Gi", {"class": "silver", "kind": "service"}),
                _pod("web-2", run, "service", "500m", "1Gi", {"class": "silver", "kind": "service"}),
                _pod("odd-class", run, "service", "250m", "256Mi", {"class": "platinum", "kind": "service"}),
                _pod("big", run, "batch", "6", "8Gi", {"class": "bronze", "kind": "batch", "runtime-seconds": "60"}),
                _pod("huge", run, "batch", "16", "8Gi", {"class": "bronze", "kind": "batch", "runtime-seconds": "60"}),
            ],
        )
        batch = {"class": "bronze", "kind": "batch", "runtime-seconds": "20"}
        kube.create_pods(ns, [_pod(f"work-{i}", run, "batch", "1", "2Gi", batch) for i in range(3)])
        for i in range(2):
            kube.create(f"/apis/batch/v1/namespaces/{ns}/jobs", _job(f"job-{i}", run))

        def phases() -> dict[str, str]:
            return {p["metadata"]["name"]: p["status"].get("phase", "") for p in kube.pods(ns)}

        kube.wait(
            lambda: (
                sum(1 for n, ph in phases().items() if n.startswith("job-") and ph == "Succeeded") == 2
                and all(
                    phases().get(n) == "Running" for n in ("web-1", "web-2", "odd-class", "work-0", "work-1", "work-2")
                )
            ),
            "the Jobs to complete and the other pods to run",
            timeout=60,
        )
        time.sleep(8)  # "big" has waited a while when the cluster adds a node it fits
        kube.create_node(_node(late, run, "batch", "m1.xlarge", "8", "32Gi"))
        kube.wait(lambda: phases().get("big") == "Running", "'big' running on the added node", timeout=60)
        time.sleep(max(0.0, 20 - (time.monotonic() - started)))
        for i in range(3):
            _complete(kube, ns, f"work-{i}")
        time.sleep(15)
        out_json = tmp_path / "report.json"
        cmd = [
            sys.executable, "-m", "extender.cli", "simulate", "--from-cluster", "--since", "30m",
            "--namespace", ns, "--node-selector", f"fc-run={run}", "--prometheus", prometheus,
            "--json", str(out_json),
        ]  # fmt: skip
        t_cli = time.monotonic()
        proc = subprocess.run(
            cmd, capture_output=True, text=True, timeout=120, cwd=ROOT, env={**os.environ, "KUBECONFIG": kubeconfig}
        )
        cli_seconds = time.monotonic() - t_cli
        assert proc.returncode == 0, proc.stderr
        out = proc.stdout
        report = orjson.loads(out_json.read_bytes())
        actual = report["actual"]
        # ---- what ran
        assert actual["pods"] == 10, actual  # 2 services + odd class + 3 work + 2 Job pods + big + huge
        assert actual["requests_completed"] == 5
        assert actual["requests_running_at_end"] == 4  # web-1, web-2, odd-class, big
        assert actual["requests_never_started"] == 1  # huge
        assert actual["pods_with_annotation_problems"] == 1
        assert actual["classes"]["silver"]["requests"] == 2
        assert actual["classes"]["bronze"]["requests"] == 8  # the unknown class defaults to bronze
        assert actual["classes"]["bronze"]["availability_min"] == 0.0  # huge never ran
        assert actual["classes"]["bronze"]["slo_fulfillment"] < 1.0
        # ---- the bill: each node's flavour x its life in the window, per minute rounded up
        window = actual["window"]
        seen = {n["metadata"]["name"]: n for n in kube.nodes(f"fc-run={run}")}
        created = {name: parse_timestamp(n["metadata"]["creationTimestamp"]) for name, n in seen.items()}
        pod_created = [parse_timestamp(p["metadata"]["creationTimestamp"]) for p in kube.pods(ns)]
        assert window["start"] == min(v for v in [*created.values(), *pod_created] if v is not None)
        price = {f"{run}-svc": PRICES["m1.medium"], f"{run}-batch": PRICES["m1.large"],
                 f"{run}-odd": PRICES["m1.medium"], late: PRICES["m1.xlarge"]}  # fmt: skip
        rows = {r["name"]: r for r in actual["nodes"]}
        assert set(rows) == set(price)
        expected = 0.0
        for name, p in price.items():
            born = max(created[name] or window["start"], window["start"])
            alive = window["end"] - born
            assert rows[name]["seconds"] == pytest.approx(alive, abs=1e-6)
            assert rows[name]["price_per_hour"] == p
            expected += math.ceil(alive / 60 - 1e-9) * p / 60
        assert actual["cost_usd"] == pytest.approx(expected, rel=1e-9)
        assert rows[f"{run}-odd"]["priced_by"] == "nearest flavour"
        assert rows[f"{run}-odd"]["replayed_as"] == "m1.medium"
        # the replay starts with the nodes there before the first pod, not the one added later
        assert sorted(actual["initial_nodes"]) == ["m1.large/batch", "m1.medium/batch", "m1.medium/service"]
        # ---- the replay and the comparison
        (prod,) = report["runs"]
        assert prod["policy"] == "product"
        assert set(prod["classes"]) == {"bronze", "silver"}
        assert prod["classes"]["bronze"]["requests"] + prod["classes"]["silver"]["requests"] == 10
        vs = report["vs_actual"]["product"]
        assert vs["actual_cost_usd"] == actual["cost_usd"]
        assert vs["replayed_cost_usd"] == prod["cost_usd"] > 0
        assert set(vs["classes"]) == {"bronze", "silver"}
        # ---- printed: the comparison and the assumptions
        assert "under product you would have paid" in out
        assert "ASSUMPTIONS" in out
        assert f"node {run}-odd: label 'x9.custom' not in the catalogue" in out
        assert "malformed qos annotation(s) on 1 pod(s)" in out and "platinum" in out
        assert "still running at the window's end" in out
        assert "kube_node_created" in out  # the local Prometheus has no kube-state-metrics: said so
        print(
            f"\nfrom-cluster e2e: window {window['seconds']:.0f} s, actual ${actual['cost_usd']:.4f}, product "
            f"${prod['cost_usd']:.4f}; bronze SLO met observed {actual['classes']['bronze']['slo_fulfillment']:.3f} "
            f"/ product {prod['classes']['bronze']['slo_fulfillment']:.3f}; silver observed "
            f"{actual['classes']['silver']['slo_fulfillment']:.3f} / product "
            f"{prod['classes']['silver']['slo_fulfillment']:.3f}; CLI {cli_seconds:.1f} s; "
            f"test {time.monotonic() - started:.0f} s"
        )
        print(out)
        # an unreachable Prometheus: one line, exit 2, no traceback (the API server was reached first)
        bad = [*cmd[: cmd.index("--prometheus") + 1], "http://127.0.0.1:9"]
        proc = subprocess.run(bad, capture_output=True, text=True, timeout=60, cwd=ROOT)
        assert proc.returncode == 2, (proc.stdout, proc.stderr)
        assert proc.stderr.startswith("qos-extender: error: cannot reach Prometheus at http://127.0.0.1:9")
        assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    finally:
        kube.delete_namespace(ns)
        for name in [*nodes, late]:
            kube.delete_node(name)
        kube.close()
