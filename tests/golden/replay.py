"""Rebuild the cluster state of a recorded kube-scheduler <-> extender session (see ORIGIN.md)."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson

from extender.kube.convert import pod_from_k8s
from extender.kube.snapshot import Snapshot
from extender.settings.extender import ExtenderConfig

GOLDEN = Path(__file__).resolve().parent
FULL_LOG = GOLDEN / "requests.log"
NODECACHE_LOG = GOLDEN / "nodecache-true" / "requests.log"

# Inferred deletions (ORIGIN.md): pod key -> deleted right before the request with this (verb, seq, pod).
INFERRED_DELETIONS: dict[Path, dict[tuple[str, int], tuple[str, ...]]] = {
    FULL_LOG: {("filter", 6): ("default/low-1", "default/low-3")},
}


def load_log(path: Path) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in path.read_bytes().splitlines() if line.strip()]


# Recaptured from the pinned kube-scheduler by tests/golden/capture.sh (ORIGIN.md): nodes.json beside each log.
V135_DIR = GOLDEN / "v1.35.8"
V135_LOGS = (V135_DIR / "nodecache-true" / "requests.log", V135_DIR / "nodecache-false" / "requests.log")


def node_objects(path: Path | None = None) -> list[dict[str, Any]]:
    if path is not None and (path.parent / "nodes.json").is_file():
        recorded: list[dict[str, Any]] = orjson.loads((path.parent / "nodes.json").read_bytes())
        return recorded
    for event in load_log(FULL_LOG):
        nodes = event["request"].get("Nodes")
        if event["verb"] == "filter" and nodes and len(nodes["items"]) == 3:
            return copy.deepcopy(nodes["items"])
    raise AssertionError("no full node list in the golden log")


def pod_of(event: dict[str, Any]) -> dict[str, Any] | None:
    pod = event["request"].get("Pod")
    return pod if isinstance(pod, dict) else None


def _key(pod: dict[str, Any]) -> str:
    return f"{pod['metadata'].get('namespace', 'default')}/{pod['metadata']['name']}"


def _rfc3339(t: float) -> str:
    return datetime.fromtimestamp(int(t), tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class Step:
    event: dict[str, Any]
    snapshot: Snapshot
    now: float

    @property
    def verb(self) -> str:
        return str(self.event["verb"])

    @property
    def request(self) -> dict[str, Any]:
        return dict(self.event["request"])


def replay(path: Path, config: ExtenderConfig, *, watch_confirms: bool = True) -> Iterator[Step]:
    """Yield each recorded request with a Snapshot holding the cluster as it was just before it.

    The same Snapshot object is mutated between steps: consume each step before asking for the next.
    ``watch_confirms=False`` never shows our bindings through the "watch", so only the ledger knows them.
    """
    events = load_log(path)
    t0 = events[0]["t"] - 1
    snap = Snapshot(config)
    snap.replace_nodes(node_objects(path), "1", now=t0)
    snap.replace_pods([], "1", now=t0)
    pods: dict[str, dict[str, Any]] = {}
    unconfirmed: list[dict[str, Any]] = []
    deletions = INFERRED_DELETIONS.get(path, {})
    for i, event in enumerate(events):
        now = float(event["t"])
        for key in deletions.get((event["verb"], event["seq"]), ()):
            if key in pods:
                snap.apply_pod("DELETED", pods.pop(key), now=now)
        if watch_confirms:
            for obj in unconfirmed:
                snap.apply_pod("MODIFIED", obj, now=now)
            unconfirmed.clear()
        yield Step(event, snap, now)
        req = event["request"]
        verb = event["verb"]
        pod = pod_of(event)
        if pod is not None:
            key = _key(pod)
            if key not in pods or not pods[key]["spec"].get("nodeName"):
                pods[key] = copy.deepcopy(pod)
                snap.apply_pod("ADDED", pods[key], now=now)
        if verb == "bind" and event["response"].get("Error") == "":
            key = f"{req['PodNamespace']}/{req['PodName']}"
            obj = copy.deepcopy(pods[key])
            obj["spec"]["nodeName"] = req["Node"]
            obj.setdefault("status", {})["conditions"] = [
                {"type": "PodScheduled", "status": "True", "lastTransitionTime": _rfc3339(now)}
            ]
            pods[key] = obj
            core, _ = pod_from_k8s(
                pods[key], config.pod_defaults, config.policy.classes, config.scheduling.managed_resources
            )
            snap.record_bind(core, req["Node"], now)
            unconfirmed.append(obj)
        if verb == "preempt":
            preemptor = _key(req["Pod"])
            target = next(
                (
                    e["request"]["Node"]
                    for e in events[i + 1 :]
                    if e["verb"] == "bind"
                    and f"{e['request']['PodNamespace']}/{e['request']['PodName']}" == preemptor
                    and e["response"].get("Error") == ""
                ),
                None,
            )
            uids: list[str] = []
            if target is not None:
                if req.get("NodeNameToVictims"):
                    uids = [p["metadata"]["uid"] for p in req["NodeNameToVictims"][target]["Pods"]]
                else:
                    uids = [p["UID"] for p in req["NodeNameToMetaVictims"][target]["Pods"]]
            for uid in uids:
                key = snap.key_for_uid(uid)
                if key is not None and key in pods:
                    snap.apply_pod("DELETED", pods.pop(key), now=now)
