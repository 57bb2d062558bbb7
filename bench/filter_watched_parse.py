"""The filter verb with and without the watch's parse of the same pod version (issue 34): figures, not tests.

A released pod usually reaches the filter in the version whose MODIFIED event the extender's watch has parsed
already; extender.webhook.verbs._watched hands the filter that parse. This times filter_nodes for one
candidate node (a pinned pod) over 3,000 pods on 500 nodes, with the request's copy in another version (parsed,
the baseline) and in the watched version (reused), medians of 7 interleaved runs.

    .venv/bin/python bench/filter_watched_parse.py
"""

from __future__ import annotations

import copy
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from extender.webhook import verbs
from tests.test_webhook_snapshot import node, pod, synced

snap = synced(*[node(f"n{i}", cpu="16") for i in range(500)])
cfg = snap.config
N = 3000


def make(i):
    p = pod(f"p{i}", cpu="100m", memory="128Mi")
    p["metadata"]["resourceVersion"] = str(i + 10)
    p["metadata"]["creationTimestamp"] = "2026-11-27T10:00:00Z"
    p["metadata"]["annotations"] = {"qos.kube-qos-extender.io/kind": "service"}
    return p


pods = [make(i) for i in range(N)]
for p in pods:
    snap.apply_pod("MODIFIED", p, now=0.0)


def run(watched: bool):
    reqs = [{"Pod": copy.deepcopy(p), "NodeNames": ["n7"], "Nodes": None} for p in pods]
    if not watched:
        for r in reqs:
            r["Pod"]["metadata"]["resourceVersion"] += "x"  # another version than the watch's: parsed
    snap.request_pods._by_uid.clear()
    t = time.perf_counter()
    for r in reqs:
        verbs.filter_nodes(r, snap, cfg, 1.0)
    return (time.perf_counter() - t) / N * 1e6


res = {"parsed": [], "watched": []}
for _ in range(7):
    res["parsed"].append(run(False))
    res["watched"].append(run(True))
a, b = statistics.median(res["parsed"]), statistics.median(res["watched"])
print(
    f"filter_nodes per call, 1 candidate: request parsed {a:.1f} us (baseline), "
    f"watch's parse reused {b:.1f} us, ratio {b / a:.2f}"
)
