"""`product` against `k8s` over many workload seeds per HTAS pattern (issue 33 part 2): a figure, not a test.

One seed is one workload draw (``workloads.htas(pattern, seed=s)``: arrivals, job mix, runtimes) and the
simulator's own random stream (``SimConfig(seed=s)``: node lags, tie-breaks); both policies replay the same draw.
Per seed: the saving on the bill (1 - product / k8s), every class's share of requests meeting its SLO under each,
the classes worse off than under k8s, and cost / fluid lower bound. Per pattern and seed set: min / median / max.

Seed sets (say which is which, issue 33): ``dev`` = seeds 1-3, the ones earlier sessions tuned the shipped
defaults on (sim/README.md); ``held-out`` = 101-120, never looked at before the figures were taken. Nothing in this
session's changes was tuned on any HTAS seed (they were chosen on the first 5,000 Alibaba tasks).
``qos.peer_victim_wait_seconds`` (issue 33 part 2's silver case) was NOT chosen blind of 101-120 and 201-220
(``held-out-2``): an earlier session tried variants of the rule on 101-120, and its first value (150 s) was
measured on both before the shipped 300 s was derived from the victims' waits seen there; ``fresh`` = 301-320 was
run once, for the final figure.

    python bench/htas_seeds.py [--pattern P ...] [--seeds dev|held-out|held-out-2|fresh|A-B] [--json OUT]
        [--peer-victim-wait S]
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import orjson

from extender.sim.engine import SimConfig, simulate
from extender.sim.product import ProductSettings
from extender.sim.report import run_json
from extender.sim.workloads import HTAS_PATTERNS, htas

SEED_SETS = {"dev": range(1, 4), "held-out": range(101, 121), "held-out-2": range(201, 221), "fresh": range(301, 321)}


def one_seed(pattern: str, seed: int, product: ProductSettings | None = None) -> dict[str, Any]:
    """product and k8s on one draw: the saving, SLO met per class under each, the classes worse off."""
    w = htas(pattern, seed=seed)
    runs = {}
    cpu = {}
    cfg = SimConfig(seed=seed) if product is None else SimConfig(seed=seed, product=product)
    for policy in ("product", "k8s"):
        t0 = time.process_time()
        runs[policy] = run_json(simulate(w, policy, cfg))
        cpu[policy] = time.process_time() - t0
    p, k = runs["product"], runs["k8s"]
    met = {
        c: {"product": s["slo_fulfillment"], "k8s": k["classes"][c]["slo_fulfillment"]}
        for c, s in p["classes"].items()
        if c in k["classes"]
    }
    return {
        "pattern": pattern,
        "seed": seed,
        "saving": 1.0 - p["cost_usd"] / k["cost_usd"],
        "cost_usd": {"product": p["cost_usd"], "k8s": k["cost_usd"]},
        "cost_over_fluid": {"product": p["cost_over_fluid"], "k8s": k["cost_over_fluid"]},
        "slo_met": met,
        "worse_classes": sorted(c for c, m in met.items() if m["product"] < m["k8s"] - 1e-12),
        "preemptions": p["preemptions"],
        "migrations": p["migrations"],
        "incomplete": {"product": p["requests_incomplete"], "k8s": k["requests_incomplete"]},
        "cpu_seconds": cpu,
    }


def spread(values: list[float]) -> dict[str, float]:
    return {"min": min(values), "median": statistics.median(values), "max": max(values)}


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "seeds": [r["seed"] for r in rows],
        "saving": spread([r["saving"] for r in rows]),
        "cost_over_fluid_product": spread([r["cost_over_fluid"]["product"] for r in rows]),
        "cost_over_fluid_k8s": spread([r["cost_over_fluid"]["k8s"] for r in rows]),
        "seeds_with_a_class_worse_than_k8s": [r["seed"] for r in rows if r["worse_classes"]],
        "slo_met_product_min": {
            c: min(r["slo_met"][c]["product"] for r in rows if c in r["slo_met"])
            for c in sorted({c for r in rows for c in r["slo_met"]})
        },
        "preemptions": spread([float(r["preemptions"]) for r in rows]),
    }


def _seeds(text: str) -> range:
    if text in SEED_SETS:
        return SEED_SETS[text]
    lo, _, hi = text.partition("-")
    return range(int(lo), int(hi or lo) + 1)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pattern", action="append", choices=sorted(HTAS_PATTERNS))
    ap.add_argument(
        "--seeds", action="append", help="dev, held-out, held-out-2, fresh or A-B (default: dev and held-out)"
    )
    ap.add_argument("--json", help="write every seed's figures and the summaries here")
    ap.add_argument(
        "--peer-victim-wait",
        type=float,
        help="product's qos.peer_victim_wait_seconds for this run (default: shipped; 0 = the rule before it)",
    )
    args = ap.parse_args()
    sets = args.seeds or ["dev", "held-out"]
    product = ProductSettings()
    if args.peer_victim_wait is not None:
        product = replace(product, peer_victim_wait_seconds=args.peer_victim_wait)
    doc: dict[str, Any] = {
        "seed_sets": {s: list(_seeds(s)) for s in sets},
        "product_peer_victim_wait_seconds": product.peer_victim_wait_seconds,
        "rows": [],
        "summary": {},
    }
    for pattern in args.pattern or list(HTAS_PATTERNS):
        for name in sets:
            rows = []
            for seed in _seeds(name):
                r = one_seed(pattern, seed, product)
                rows.append(r)
                worse = ",".join(r["worse_classes"]) or "-"
                print(
                    f"{pattern:8s} {name:8s} seed {seed:3d}: saving {100 * r['saving']:5.1f} %  "
                    f"x fluid {r['cost_over_fluid']['product']:.2f} vs {r['cost_over_fluid']['k8s']:.2f}  "
                    f"worse: {worse}  preemptions {r['preemptions']}  "
                    f"cpu {r['cpu_seconds']['product']:.1f}+{r['cpu_seconds']['k8s']:.1f} s",
                    flush=True,
                )
            doc["rows"].extend(rows)
            s = doc["summary"].setdefault(pattern, {})[name] = summary(rows)
            sv = s["saving"]
            print(
                f"{pattern:8s} {name:8s} saving min / median / max {100 * sv['min']:.1f} / {100 * sv['median']:.1f} / "
                f"{100 * sv['max']:.1f} %, seeds with a class worse than k8s: "
                f"{s['seeds_with_a_class_worse_than_k8s'] or 'none'}",
                flush=True,
            )
    if args.json:
        Path(args.json).write_bytes(orjson.dumps(doc, option=orjson.OPT_INDENT_2))
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
