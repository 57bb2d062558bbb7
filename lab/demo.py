"""`make demo` (python -m lab.demo): the real local control plane with the extender, a sample workload, a report.

Steps: hack/local-up.sh with QOS_WITH_EXTENDER=1 on its own state dir and ports (builds or reuses the
binaries first: hack/build-tools.sh is cached), kwok nodes of several flavours in both node groups, a mix of
batch pods (with runtimes) and services across the gold/silver/bronze classes submitted to qos-scheduler,
then a report: where pods landed by node group and flavour, the extender's per-verb counts and latency from
its /metrics, and a Prometheus query over its HTTP API. Then the simulator's comparison of the same policy
core on the paper workloads; hack/local-down.sh tears everything down.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

from extender.cli import build_parser
from extender.core.model import cpu_millicores
from lab.kube_sync import Kube, http_json, scrape_metrics

__all__ = ["DEMO_ENV", "NODES", "ClusterDemo", "cluster_env", "main", "repo_root"]

PREFIX = "qos.kube-qos-extender.io/"
MARKER = PREFIX + "managed"
NAMESPACE = "qos-demo"
# Own state dir and ports, so the demo never collides with a developer's hack/local-up.sh (defaults 6443...).
DEMO_ENV = {
    "QOS_STATE": "/tmp/qos-demo",
    "QOS_APISERVER_PORT": "53443",
    "QOS_ETCD_PORT": "53790",
    "QOS_ETCD_PEER_PORT": "53800",
    "QOS_SCHEDULER_PORT": "53259",
    "QOS_CONTROLLER_MANAGER_PORT": "53257",
    "QOS_KWOK_PORT": "53247",
    "QOS_PROMETHEUS_PORT": "53090",
    "EXTENDER_URL": "https://127.0.0.1:53843",
}
NODES = ("service:m3.small=2", "service:m1.medium=2", "batch:m1.medium=1", "batch:m1.large=2")


def repo_root() -> Path:
    root = Path(__file__).resolve().parent.parent
    if not (root / "hack" / "local-up.sh").is_file():
        raise FileNotFoundError(f"{root}/hack/local-up.sh not found: the demo runs from a source checkout")
    return root


def cluster_env() -> dict[str, str]:
    """DEMO_ENV, each value overridable from the environment."""
    return {k: os.environ.get(f"QOS_DEMO_{k}", v) for k, v in DEMO_ENV.items()}


def _pod(
    name: str, cpu: str, memory: str, cls: str, kind: str, runtime: int | None = None, *, qos: bool = True
) -> dict[str, Any]:
    ann = {PREFIX + "class": cls, PREFIX + "kind": kind}
    if runtime is not None:
        ann[PREFIX + "runtime-seconds"] = str(runtime)
    requests = {"cpu": cpu, "memory": memory}
    limits: dict[str, str] = {}
    spec: dict[str, Any] = {"terminationGracePeriodSeconds": 0, "priorityClassName": f"qos-{cls}"}
    if qos:
        requests[MARKER] = limits[MARKER] = "1"  # the QoS admission webhook injects this in a real cluster
        spec["schedulerName"] = "qos-scheduler"
    spec["containers"] = [
        {"name": "main", "image": "registry.invalid/pause:3.9", "resources": {"requests": requests, "limits": limits}}
    ]
    labels = {"app.kubernetes.io/part-of": "qos-demo", "demo/kind": kind}
    return {"metadata": {"name": name, "annotations": ann, "labels": labels}, "spec": spec}


def sample_workload() -> list[dict[str, Any]]:
    """Services (long-running) and batch pods with runtimes, across the three classes."""
    pods: list[dict[str, Any]] = []
    for i, (cls, cpu, mem) in enumerate(
        [
            ("gold", "500m", "1Gi"),
            ("gold", "500m", "1Gi"),
            ("silver", "750m", "1536Mi"),
            ("silver", "250m", "512Mi"),
            ("bronze", "500m", "768Mi"),
            ("bronze", "1", "2Gi"),
            ("silver", "500m", "1Gi"),
            ("bronze", "250m", "512Mi"),
        ]
    ):
        pods.append(_pod(f"svc-{cls}-{i}", cpu, mem, cls, "service"))
    for i, (cls, runtime, cpu, mem) in enumerate(
        [
            ("gold", 3600, "1", "2Gi"),
            ("silver", 3000, "500m", "1Gi"),
            ("bronze", 2700, "1", "1Gi"),
            ("silver", 600, "500m", "1Gi"),
            ("bronze", 450, "1", "2Gi"),
            ("gold", 300, "500m", "512Mi"),
            ("bronze", 1800, "500m", "1Gi"),
            ("silver", 7200, "1", "2Gi"),
            ("bronze", 900, "250m", "512Mi"),
            ("gold", 1200, "500m", "1Gi"),
        ]
    ):
        pods.append(_pod(f"batch-{cls}-{runtime}s-{i}", cpu, mem, cls, "batch", runtime))
    # Two default-scheduler pods: they never reach the extender (no marker), for contrast in the verb counts.
    pods.append(_pod("plain-0", "250m", "256Mi", "bronze", "service", qos=False))
    pods.append(_pod("plain-1", "250m", "256Mi", "bronze", "service", qos=False))
    return pods


@dataclass
class ClusterDemo:
    env: Mapping[str, str]
    out: Any = sys.stdout

    def say(self, text: str = "") -> None:
        print(text, file=self.out, flush=True)

    def up(self, root: Path) -> dict[str, str]:
        env = {**os.environ, **self.env, "QOS_WITH_EXTENDER": "1"}
        env.pop("KUBECONFIG", None)
        t0 = time.monotonic()
        self.say(f"== bringing up the local control plane with the extender (state {env['QOS_STATE']}) ...")
        proc = subprocess.run(
            [str(root / "hack" / "local-up.sh"), *NODES], env=env, stdout=subprocess.PIPE, text=True, check=False
        )
        if proc.returncode != 0:
            raise RuntimeError(f"hack/local-up.sh failed (exit {proc.returncode}); logs in {env['QOS_STATE']}/logs")
        values = dict(line.split("=", 1) for line in proc.stdout.splitlines() if "=" in line)
        self.say(f"   up in {time.monotonic() - t0:.0f} s: {len(NODES)} node pools {', '.join(NODES)}")
        return values

    def down(self, root: Path) -> None:
        env = {**os.environ, **self.env}
        subprocess.run([str(root / "hack" / "local-down.sh")], env=env, check=False)

    def run(self, values: Mapping[str, str]) -> int:
        kube = Kube(values["KUBECONFIG"])
        try:
            return self._run(kube, values)
        finally:
            kube.close()

    def _metrics(self, values: Mapping[str, str]) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        return scrape_metrics(
            values["EXTENDER_METRICS_URL"],
            values["EXTENDER_CA"],
            values["EXTENDER_CLIENT_CERT"],
            values["EXTENDER_CLIENT_KEY"],
        )

    def _run(self, kube: Kube, values: Mapping[str, str]) -> int:
        kube.ensure_namespace(NAMESPACE)
        pods = sample_workload()
        t0 = time.monotonic()
        kube.create_pods(NAMESPACE, pods, parallel=8)
        self.say(f"== submitted {len(pods)} pods to namespace {NAMESPACE} (qos-scheduler, 2 default-scheduler)")

        def placed() -> list[dict[str, Any]] | None:
            items = kube.pods(NAMESPACE)
            return items if len(items) == len(pods) and all(p["spec"].get("nodeName") for p in items) else None

        try:
            items = kube.wait(placed, "every demo pod bound", timeout=90, interval=0.5)
        except TimeoutError:
            items = kube.pods(NAMESPACE)
        self.say(
            f"   {sum(1 for p in items if p['spec'].get('nodeName'))}/{len(pods)} bound in "
            f"{time.monotonic() - t0:.1f} s"
        )
        nodes = {n["metadata"]["name"]: n for n in kube.nodes()}
        self._placement(items, nodes)
        self._verbs(values)
        self._prometheus(values)
        pending = [p["metadata"]["name"] for p in items if not p["spec"].get("nodeName")]
        if pending:
            self.say(f"!! still pending: {', '.join(pending)}")
            return 1
        return 0

    def _placement(self, items: list[dict[str, Any]], nodes: Mapping[str, dict[str, Any]]) -> None:
        self.say("\n== where pods landed")
        self.say(f"{'pod':<28} {'class':<7} {'kind':<8} {'runtime':>7}  {'node':<24} {'group':<8} flavour")
        by_node: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for p in sorted(items, key=lambda p: (p["spec"].get("nodeName") or "~", p["metadata"]["name"])):
            node = p["spec"].get("nodeName") or "-"
            by_node[node].append(p)
            labels = nodes.get(node, {}).get("metadata", {}).get("labels", {})
            ann = p["metadata"].get("annotations", {})
            self.say(
                f"{p['metadata']['name']:<28} {ann.get(PREFIX + 'class', '-'):<7} {ann.get(PREFIX + 'kind', '-'):<8} "
                f"{ann.get(PREFIX + 'runtime-seconds', '-'):>7}  {node:<24} "
                f"{labels.get(PREFIX + 'node-group', '-'):<8} {labels.get('node.kubernetes.io/instance-type', '-')}"
            )
        self.say("\n== by node group / flavour (cpu requested / allocatable; nodes with pods are what you pay for)")
        groups: dict[tuple[str, str], Counter[str]] = defaultdict(Counter)
        cost_used = cost_all = 0.0
        for name, node in sorted(nodes.items()):
            labels = node["metadata"].get("labels", {})
            key = (labels.get(PREFIX + "node-group", "-"), labels.get("node.kubernetes.io/instance-type", "-"))
            price = float(node["metadata"].get("annotations", {}).get(PREFIX + "price-per-hour", 0) or 0)
            alloc = cpu_millicores(node["status"].get("allocatable", {}).get("cpu", "0"))
            used = sum(
                cpu_millicores(c.get("resources", {}).get("requests", {}).get("cpu", "0"))
                for p in by_node.get(name, [])
                for c in p["spec"]["containers"]
            )
            g = groups[key]
            g["nodes"] += 1
            g["busy"] += 1 if by_node.get(name) else 0
            g["pods"] += len(by_node.get(name, []))
            g["cpu_used"] += used
            g["cpu_alloc"] += alloc
            cost_all += price
            cost_used += price if by_node.get(name) else 0.0
        self.say(f"{'group':<8} {'flavour':<10} {'nodes':>5} {'busy':>5} {'pods':>5} {'cpu':>14}")
        for (group, flavour), g in sorted(groups.items()):
            self.say(
                f"{group:<8} {flavour:<10} {g['nodes']:>5} {g['busy']:>5} {g['pods']:>5} "
                f"{g['cpu_used'] / 1000:>6.2f}/{g['cpu_alloc'] / 1000:<6.2f}"
            )
        self.say(f"cost per hour: ${cost_used:.4f} for the busy nodes (all {len(nodes)} nodes: ${cost_all:.4f})")

    def _verbs(self, values: Mapping[str, str]) -> None:
        m = self._metrics(values)
        self.say("\n== extender verbs (its /metrics)")
        self.say(f"{'verb':<11} {'requests':>8} {'mean ms':>8}  outcomes")
        for verb in ("filter", "prioritize", "preempt", "bind"):
            count = m.get(("qos_extender_request_duration_seconds_count", (("verb", verb),)), 0.0)
            total = m.get(("qos_extender_request_duration_seconds_sum", (("verb", verb),)), 0.0)
            outcomes = {
                dict(ls)["outcome"]: int(v)
                for (n, ls), v in m.items()
                if n == "qos_extender_requests_total" and dict(ls).get("verb") == verb
            }
            mean = f"{1000 * total / count:.2f}" if count else "-"
            self.say(f"{verb:<11} {int(count):>8} {mean:>8}  {outcomes or ''}")
        decisions = {dict(ls)["policy"]: int(v) for (n, ls), v in m.items() if n == "qos_extender_decisions_total"}
        self.say(f"decisions by policy: {decisions}")

    def _prometheus(self, values: Mapping[str, str]) -> None:
        query = 'sum by (verb) (qos_extender_requests_total{job="kube-qos-extender"})'
        self.say(f"\n== Prometheus ({values['PROMETHEUS_URL']}): {query}")
        url = f"{values['PROMETHEUS_URL']}/api/v1/query?query={quote(query)}"
        deadline = time.monotonic() + 20  # one or two 5 s scrapes
        want = int(sum(v for (n, ls), v in self._metrics(values).items() if n == "qos_extender_requests_total"))
        result: list[dict[str, Any]] = []
        while time.monotonic() < deadline:
            result = http_json(url)["data"]["result"]
            if sum(float(r["value"][1]) for r in result) >= want:
                break
            time.sleep(1)
        for r in sorted(result, key=lambda r: r["metric"].get("verb", "")):
            self.say(f"  verb={r['metric'].get('verb', '?'):<11} {float(r['value'][1]):>6.0f}")
        if not result:
            self.say("  (no samples yet)")


def _demo_simulate() -> None:
    for workload, policies in (
        ("qos-validation1", ["qos-driven", "qos-paper", "priority"]),
        ("htas-cycle", ["htas", "k8s"]),
    ):
        # through the real parser: every option `simulate` reads has its default (a hand-built Namespace missed
        # `days` and `make demo` died after its cluster part)
        ns = build_parser().parse_args(
            ["simulate", "--workload", workload, *(a for p in policies for a in ("--policy", p))]
        )
        ns.func(ns)
        print()


def _demo(args: argparse.Namespace) -> int:
    """make demo: the real local control plane + extender, a sample workload and its report, then the
    simulator's comparison of the same policy core on the paper workloads; tears the cluster down."""
    rc = 0
    if not args.simulate_only:
        root = repo_root()
        demo = ClusterDemo(cluster_env())
        try:
            values = demo.up(root)
            rc = demo.run(values)
        except (RuntimeError, TimeoutError, OSError) as exc:
            print(f"make demo: {exc}", file=sys.stderr)
            rc = 1
        finally:
            if args.keep:
                print(f"kept the cluster: set -a; . {demo.env['QOS_STATE']}/env; set +a  (hack/local-down.sh to stop)")
            else:
                demo.down(root)
    print("\n== simulator: the same policy core on the paper workloads (qos-validation1, htas-cycle)\n")
    _demo_simulate()
    return rc


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m lab.demo",
        description="the README's first command: local cluster + extender, sample workload, report, simulator",
    )
    parser.add_argument("--keep", action="store_true", help="leave the demo cluster running")
    parser.add_argument("--simulate-only", action="store_true", help="skip the cluster part (no binaries needed)")
    return _demo(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
