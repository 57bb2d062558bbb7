"""CPU time of one QoS controller decide pass at 5,000 nodes x 1,000 gated pods (a figure, not a test).

The world: 5,000 nodes of two flavours, each running 0-4 QoS-managed pods of mixed classes (some nodes full),
1,000 gated pods of mixed classes and sizes. One ``decide`` call is timed (process CPU seconds) with the fast
host choice (``decide._FAST_HOSTS``) on and off, in the same process, for each host score; the decisions and
the rng state after the pass must be equal, and the ratio is printed.

    python bench/decide_pass.py [--nodes 5000] [--pods 1000] [--repeat 1] [--full 0.0]
"""

from __future__ import annotations

import argparse
import random
import time

from extender.controller import decide as decide_mod
from extender.controller.accounting import Account, RequestState
from extender.controller.decide import Decision, GatedPod, Settings, World, decide
from extender.core import qos
from extender.core.model import DEFAULT_CLASSES, Node, Pod, Resources, WorkloadKind

CLASSES = ("gold", "silver", "bronze")
PRIORITY = {"gold": 1000, "silver": 500, "bronze": 100}


def world(n_nodes: int, n_pods: int, seed: int = 0, full: float = 0.0) -> World:
    """``full``: the fraction of nodes filled with four 1-core pods on 4 cores (a gated pod fits there only
    by preemption; at 1.0 every gated pod takes the preemption path, which the fast host choice leaves as is)."""
    r = random.Random(seed)
    now = 10_000.0
    nodes: list[Node] = []
    running: dict[str, str] = {}
    accounts: dict[str, Account] = {}
    for n in range(n_nodes):
        pods = []
        packed = r.random() < full
        for k in range(4 if packed else r.choice((0, 0, 1, 2, 4))):
            cls = r.choice(CLASSES)
            key = f"n{n}p{k}"
            pods.append(
                Pod(
                    key,
                    Resources.request(1000 if packed else r.choice((500, 1000)), r.choice((512, 1024)) * 2**20, 1),
                    request_id=key,
                    class_name=cls,
                    node_name=f"node{n}",
                    priority=PRIORITY[cls],
                )
            )
            running[f"default/{key}"] = key
            accounts[key] = Account(
                r.uniform(0, 3000), r.uniform(0, 3000), RequestState.RUNNING, now, 0.0, cls, run_started=now - 600
            )
        cpu = 4000 if packed else r.choice((4000, 8000))
        nodes.append(Node(f"node{n}", Resources(cpu, 4096 * 2**20, 110), pods=tuple(pods)))
    gated = []
    for k in range(n_pods):
        cls = r.choice(CLASSES)
        key = f"g{k}"
        batch = r.random() < 0.3
        pod = Pod(
            key,
            Resources.request(r.choice((250, 500, 1000)), r.choice((256, 512)) * 2**20, 1),
            request_id=key,
            class_name=cls,
            priority=PRIORITY[cls],
            kind=WorkloadKind.BATCH if batch else WorkloadKind.SERVICE,
            runtime_seconds=600.0 if batch else None,
        )
        accounts[key] = Account(r.uniform(0, 2000), r.uniform(0, 2000), RequestState.PENDING, now, 0.0, cls)
        gated.append(GatedPod(pod, key, now - r.uniform(0, 100)))
    return World(tuple(nodes), running, tuple(gated), accounts, now)


def timed(w: World, settings: Settings, fast: bool) -> tuple[float, tuple[Decision, object]]:
    old = decide_mod._FAST_HOSTS
    decide_mod._FAST_HOSTS = fast
    try:
        rng = random.Random(1)
        t0 = time.process_time()
        d = decide(w, qos.QosPolicy(classes=DEFAULT_CLASSES, alpha_seconds=2.0), settings, rng)
        return time.process_time() - t0, (d, rng.getstate())
    finally:
        decide_mod._FAST_HOSTS = old


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--nodes", type=int, default=5000)
    ap.add_argument("--pods", type=int, default=1000)
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--full", type=float, default=0.0, help="fraction of nodes full of 1-core pods (0..1)")
    args = ap.parse_args()
    w = world(args.nodes, args.pods, full=args.full)
    for settings in (Settings(), Settings(host_score="profile"), Settings(host_score="profile", profile="spread")):
        for _ in range(args.repeat):
            slow, a = timed(w, settings, fast=False)
            fast, b = timed(w, settings, fast=True)
            label = settings.host_score + ("/" + settings.profile if settings.host_score == "profile" else "")
            releases = len(a[0].releases)
            print(
                f"{args.nodes} nodes ({args.full:.0%} full) x {args.pods} gated, {label}:"
                f" reference {slow:.2f} CPU s, fast {fast:.2f} CPU s, ratio {slow / fast:.1f}x,"
                f" {releases} releases, identical={a == b}"
            )
            if a != b:
                raise SystemExit("the fast host choice diverged from the reference: a bug, not a figure")


if __name__ == "__main__":
    main()
