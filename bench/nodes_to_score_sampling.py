"""percentageOfNodesToScore at 5,000 nodes without a cluster: kube-scheduler's node sampling, reproduced, in front of
the extender's real filter and prioritize verbs; cost (nodes the pods land on) and the extender's CPU per pod for
each candidate, against the baseline (kube-scheduler's adaptive default) measured in the same run, candidates
interleaved, medians over rounds.

    .venv/bin/python bench/nodes_to_score_sampling.py --nodes 5000 --pods 1000 --candidates 0,30,50,100 --rounds 5 \
        [--json bench/results/nodes-to-score-sampling-5000.json]

What is reproduced (kube-scheduler v1.35 pkg/scheduler/schedule_one.go): numFeasibleNodesToFind (fewer than 100
nodes: all; percentage 0: 50 - nodes/125, at least 5 %; at least 100 nodes), findNodesThatPassFilters walking
the node list from nextStartNodeIndex and stopping at that many feasible nodes, nextStartNodeIndex advanced by the
nodes it processed; then the extender's filter and prioritize over the sample (nodeCacheCapable: node names), the
highest total score wins (the qos-scheduler profile's in-tree scores are equal for these pods: NodeResourcesFit
and BalancedAllocation are off), ties broken at random (seeded). The chosen node is assumed in the snapshot as the
bind verb does, so the next pod sees it. In-tree feasibility is the pods' cpu fit (identical pods of 100m on
identical m1.xlarge nodes of 8 CPU: 80 per node), which is what NodeResourcesFit's filter decides for them.

What is measured: the distinct nodes used after --pods pods (the cost: one flavour, so price per hour is this count
times m1.xlarge's $0.5479) and the extender's CPU per pod (process time of the verb work as the handler does it:
orjson parse of the request, the verb, orjson dump of the answer, for filter and prioritize). Not measured here:
kube-scheduler's own CPU per pod, which grows with the nodes it filters and scores (live: bench/nodes_to_score.py).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import orjson

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from extender.kube.snapshot import Snapshot  # noqa: E402
from extender.settings.extender import parse_config  # noqa: E402
from extender.webhook import verbs  # noqa: E402

NOW = 1_800_000_000.0
PER_NODE = 80  # 8 CPU / 100m
PRICE = 0.5479  # m1.xlarge, config/flavours.yaml


def num_feasible_nodes_to_find(percentage: int, n: int) -> int:
    if n < 100:
        return n
    if percentage == 0:
        percentage = max(50 - n // 125, 5)
    return max(n * percentage // 100, 100)


def node(name: str) -> dict[str, Any]:
    alloc = {"cpu": "8", "memory": "32Gi", "pods": "110"}
    return {
        "metadata": {
            "name": name,
            "uid": f"uid-{name}",
            "labels": {
                "kubernetes.io/hostname": name,
                "qos.kube-qos-extender.io/node-group": "service",
                "node.kubernetes.io/instance-type": "m1.xlarge",
            },
        },
        "spec": {},
        "status": {"allocatable": alloc, "capacity": alloc, "conditions": [{"type": "Ready", "status": "True"}]},
    }


def pod(i: int) -> dict[str, Any]:
    return {
        "metadata": {"name": f"p{i:05d}", "namespace": "bench", "uid": f"uid-p{i:05d}", "resourceVersion": "1"},
        "spec": {
            "schedulerName": "qos-scheduler",
            "containers": [{"name": "c", "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}}}],
        },
        "status": {"phase": "Pending"},
    }


def run(percentage: int, n_nodes: int, n_pods: int, seed: int) -> dict[str, Any]:
    config = parse_config({})
    names = [f"node-{i:05d}" for i in range(n_nodes)]
    snap = Snapshot(config)
    snap.replace_nodes([node(x) for x in names], "1", now=NOW)
    snap.replace_pods([], "1", now=NOW)
    rng = random.Random(seed)
    counts = np.zeros(n_nodes, dtype=np.int64)
    start = 0
    want = num_feasible_nodes_to_find(percentage, n_nodes)
    cpu = 0.0
    sampled = 0
    for i in range(n_pods):
        # findNodesThatPassFilters: from nextStartNodeIndex, the first `want` feasible nodes
        order = np.concatenate([np.arange(start, n_nodes), np.arange(0, start)])
        feasible = order[counts[order] < PER_NODE]
        chosen = feasible[:want]
        # the nodes it looked at: up to the last one it kept (all of them when fewer than `want` were feasible)
        processed = int(np.nonzero(order == chosen[-1])[0][0]) + 1 if len(chosen) < len(feasible) else n_nodes
        start = (start + processed) % n_nodes
        sampled += len(chosen)
        p = pod(i)
        body = orjson.dumps({"Pod": p, "Nodes": None, "NodeNames": [names[j] for j in chosen]})
        t0 = time.process_time()
        result = verbs.filter_nodes(orjson.loads(body), snap, config, NOW)
        answer = orjson.dumps(result.body)
        passed = orjson.loads(answer)["NodeNames"] or []
        pbody = orjson.dumps({"Pod": p, "Nodes": None, "NodeNames": passed})
        scores = verbs.prioritize(orjson.loads(pbody), snap, config, NOW).body
        orjson.dumps(scores)
        cpu += time.process_time() - t0
        by_host = {h["Host"]: h["Score"] for h in scores}
        best = max((by_host.get(x, 0) for x in passed), default=None)
        if best is None:
            raise SystemExit(f"pod {i}: no node left")
        top = [x for x in passed if by_host.get(x, 0) == best]
        host = rng.choice(top)
        parsed = snap.request_pods.latest(p["metadata"]["uid"])
        snap.assume_bind(parsed[0], host, NOW)
        counts[int(host.rsplit("-", 1)[1])] += 1
    used = int(np.count_nonzero(counts))
    return {
        "percentage": percentage,
        "sample_nodes": want,
        "mean_sampled": sampled / n_pods,
        "nodes_used": used,
        "cost_per_hour": used * PRICE,
        "extender_cpu_ms_per_pod": 1000 * cpu / n_pods,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=5000)
    ap.add_argument("--pods", type=int, default=1000)
    ap.add_argument("--candidates", default="0,30,50,100", help="percentages; the first is the baseline (0: adaptive)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json")
    args = ap.parse_args()
    candidates = [int(c) for c in args.candidates.split(",")]
    results: dict[int, list[dict[str, Any]]] = {c: [] for c in candidates}
    for r in range(args.rounds):
        order = candidates[r % len(candidates) :] + candidates[: r % len(candidates)]
        for c in order:
            res = run(c, args.nodes, args.pods, seed=r)
            results[c].append(res)
            print(
                f"round {r} {c or 'default':>7}: sample {res['sample_nodes']}, nodes used {res['nodes_used']}, "
                f"extender {res['extender_cpu_ms_per_pod']:.2f} CPU ms/pod",
                flush=True,
            )
    base = candidates[0]
    b_used = statistics.median(x["nodes_used"] for x in results[base])
    b_cpu = statistics.median(x["extender_cpu_ms_per_pod"] for x in results[base])
    lower = -(-args.pods // PER_NODE)
    print(f"\n{args.nodes} nodes, {args.pods} pods, {args.rounds} rounds, medians (lower bound {lower} nodes):")
    summary = []
    for c in candidates:
        used = statistics.median(x["nodes_used"] for x in results[c])
        cpu = statistics.median(x["extender_cpu_ms_per_pod"] for x in results[c])
        row = {
            "percentage": c,
            "sample_nodes": results[c][0]["sample_nodes"],
            "nodes_used": used,
            "nodes_used_ratio": used / b_used,
            "cost_per_hour": used * PRICE,
            "extender_cpu_ms_per_pod": cpu,
            "extender_cpu_ratio": cpu / b_cpu,
            "extender_bound_pods_per_second": 1000 / cpu,
            "all_nodes_used": [x["nodes_used"] for x in results[c]],
            "all_cpu_ms": [round(x["extender_cpu_ms_per_pod"], 3) for x in results[c]],
        }
        summary.append(row)
        print(
            f"  {c or 'default':>7} (sample {row['sample_nodes']}): {used:.0f} nodes used ({used / b_used:.2f}x, "
            f"${used * PRICE:.2f}/h), extender {cpu:.2f} CPU ms/pod ({cpu / b_cpu:.2f}x, at most {1000 / cpu:.0f} "
            f"pods/s from the extender alone)",
            flush=True,
        )
    if args.json:
        doc = {
            "nodes": args.nodes,
            "pods": args.pods,
            "rounds": args.rounds,
            "baseline": base,
            "lower_bound_nodes": lower,
            "command": " ".join(sys.argv),
            "summary": summary,
            "runs": {str(c): results[c] for c in candidates},
        }
        Path(args.json).write_text(json.dumps(doc, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
