"""percentageOfNodesToScore of the qos-scheduler profile: cost (nodes the pods landed on) and pods/s, each candidate
against the baseline (kube-scheduler's adaptive default) measured in the same run, candidates interleaved.

    .venv/bin/python bench/nodes_to_score.py --candidates 0,50,100 --pods 1000 --rounds 3 \
        [--json FILE]

Uses the running local cluster of $QOS_STATE (hack/local-up.sh with QOS_WITH_EXTENDER=1 and N kwok nodes, e.g.
`hack/local-up.sh service:m1.xlarge=5000`; at 5,000 nodes its per-node Ready wait alone takes ~20 min, so the
cluster is brought up once, not per candidate). For each round and candidate (the order rotated every round, so
no candidate always runs first on a machine whose load drifts): rewrite percentageOfNodesToScore in the
qos-scheduler profile of $QOS_STATE/config/kube-scheduler.yaml (0: the field removed, kube-scheduler's adaptive
default: 50 - nodes/125 percent, at least 5 %, i.e. 10 % at 5,000 nodes), restart kube-scheduler, wait until it
is ready, then run e2e_throughput's phase: the scheduler paused while --pods pods are created, resumed, the time
until the last is bound. The pods are the extender's alone (a namespace no QoS controller orders: nothing is
pinned, so kube-scheduler's sample is what the extender ranks).

Cost: the distinct nodes the phase's pods were bound to (all nodes are one flavour, so cost per hour is this count
times its price), and the lower bound ceil(pods / pods per node). Never pass/fail on time: this prints figures.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import signal
import ssl
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from e2e_throughput import UNORDERED, cleanup, phase  # noqa: E402

from lab.kube_sync import Kube  # noqa: E402

PROFILE_LINE = "- schedulerName: qos-scheduler\n"


def set_percentage(config: Path, percentage: int) -> None:
    """Rewrite the qos-scheduler profile's percentageOfNodesToScore (0: removed, the adaptive default)."""
    text = re.sub(r"  percentageOfNodesToScore: \d+\n", "", config.read_text())
    if PROFILE_LINE not in text:
        raise SystemExit(f"{config}: no qos-scheduler profile")
    if percentage:
        text = text.replace(PROFILE_LINE, f"{PROFILE_LINE}  percentageOfNodesToScore: {percentage}\n")
    config.write_text(text)


def restart_scheduler(state: Path, port: int) -> None:
    """Stop kube-scheduler and start it again with the same command line (local-up's daemon), then wait until
    its /readyz answers ok (informers synced: every node listed)."""
    pid_file = state / "pids" / "kube-scheduler.pid"
    pid = int(pid_file.read_text())
    argv = [a for a in Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0") if a]
    os.kill(pid, signal.SIGTERM)
    for _ in range(300):
        if not Path(f"/proc/{pid}").exists():
            break
        time.sleep(0.1)
    else:
        os.kill(pid, signal.SIGKILL)
    log = (state / "logs" / "kube-scheduler.log").open("ab")
    proc = subprocess.Popen(argv, stdout=log, stderr=log, stdin=subprocess.DEVNULL, start_new_session=True)
    pid_file.write_text(f"{proc.pid}\n")
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"https://127.0.0.1:{port}/readyz", context=ctx, timeout=5) as resp:
                if resp.status == 200:
                    time.sleep(2.0)  # its first scheduling cycles start from a fresh queue
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise SystemExit("kube-scheduler not ready after 600 s")


def nodes_used(kube: Kube, ns: str) -> int:
    return len({p["spec"]["nodeName"] for p in kube.pods(ns) if p["spec"].get("nodeName")})


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--candidates", default="0,50,100", help="percentages; 0 = adaptive default (the baseline)")
    ap.add_argument("--pods", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--pods-per-node", type=int, default=80, help="lower bound: m1.xlarge 8 CPU / the pods' 100m")
    ap.add_argument("--timeout", type=float, default=600.0)
    ap.add_argument("--json")
    args = ap.parse_args()
    candidates = [int(c) for c in args.candidates.split(",")]
    baseline = candidates[0]
    state = Path(os.environ.get("QOS_STATE", "/tmp/qos-bench"))
    values = dict(line.split("=", 1) for line in (state / "env").read_text().splitlines() if "=" in line)
    port = int(os.environ.get("QOS_SCHEDULER_PORT", "10259"))
    config = state / "config" / "kube-scheduler.yaml"
    original = config.read_text()
    kube = Kube(values["KUBECONFIG"], maxsize=32)
    nodes = len(kube.get("/api/v1/nodes")["items"])
    results: dict[int, list[dict[str, Any]]] = {c: [] for c in candidates}
    try:
        for r in range(args.rounds):
            order = candidates[r % len(candidates) :] + candidates[: r % len(candidates)]
            for c in order:
                set_percentage(config, c)
                restart_scheduler(state, port)
                ns = f"nts-{c}-{r}"
                print(f"round {r}, percentageOfNodesToScore {c or 'default'}:", flush=True)
                res = phase(kube, state, values, ns, args.pods, True, args.timeout, UNORDERED)
                res["nodes_used"] = nodes_used(kube, ns)
                print(f"    nodes used: {res['nodes_used']}", flush=True)
                results[c].append(res)
                cleanup(kube, ns)
    finally:
        config.write_text(original)
        restart_scheduler(state, port)
        kube.close()
    bound = math.ceil(args.pods / args.pods_per_node)
    base_rate = statistics.median(x["pods_per_second"] for x in results[baseline])
    base_nodes = statistics.median(x["nodes_used"] for x in results[baseline])
    base_cpu = statistics.median(x["cpu_ms_per_pod_while_binding"]["kube-scheduler"] for x in results[baseline])
    summary = []
    print(f"\n{nodes} nodes, {args.pods} pods per phase, {args.rounds} rounds (medians; lower bound {bound} nodes)")
    for c in candidates:
        rate = statistics.median(x["pods_per_second"] for x in results[c])
        used = statistics.median(x["nodes_used"] for x in results[c])
        cpu = statistics.median(x["cpu_ms_per_pod_while_binding"]["kube-scheduler"] for x in results[c])
        ext = statistics.median(x["cpu_ms_per_pod_while_binding"]["qos-extender"] for x in results[c])
        row = {
            "percentage": c,
            "pods_per_second": rate,
            "pods_per_second_ratio": rate / base_rate,
            "nodes_used": used,
            "nodes_used_ratio": used / base_nodes,
            "scheduler_cpu_ms_per_pod": cpu,
            "scheduler_cpu_ratio": cpu / base_cpu,
            "extender_cpu_ms_per_pod": ext,
            "all_pods_per_second": [x["pods_per_second"] for x in results[c]],
            "all_nodes_used": [x["nodes_used"] for x in results[c]],
        }
        summary.append(row)
        print(
            f"  {c or 'default':>7}: {rate:6.1f} pods/s ({rate / base_rate:.2f}x), {used:.0f} nodes used "
            f"({used / base_nodes:.2f}x), kube-scheduler {cpu:.2f} CPU ms/pod ({cpu / base_cpu:.2f}x), "
            f"extender {ext:.2f} CPU ms/pod; runs {row['all_pods_per_second']} / {row['all_nodes_used']}",
            flush=True,
        )
    if args.json:
        doc = {
            "nodes": nodes,
            "pods": args.pods,
            "rounds": args.rounds,
            "baseline": baseline,
            "lower_bound_nodes": bound,
            "command": " ".join(sys.argv),
            "summary": summary,
            "phases": {str(c): results[c] for c in candidates},
        }
        Path(args.json).write_text(json.dumps(doc, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
