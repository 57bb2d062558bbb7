"""Migration between real kubelet nodes that run **CRI-O** (issue 32 part 3): the kubelet checkpoints through CRI-O,
the destination agent writes the checkpoint image into CRI-O's containers/storage with skopeo and CRI-O restores
the container from it when the flow creates the destination pod.

The cluster: hack/local-up.sh with real nodes made by hack/real-nodes.sh with ``QOS_NODE_RUNTIME=crio`` (CRI-O
1.34.0 of hack/build-crio.sh, conmon, runc 1.3.3, CRIU 4.1.1), the product deployed from config/local-crio
(config/local plus the agent's CRI-O component config/agent/crio) by e2e/test_deployed.py's ``product`` fixture:
phase 5 of hack/run-live-tests.sh. The same phase runs e2e/test_migration_owned_real.py (Job, Deployment,
StatefulSet, a two-container pod) on these nodes. Fails, never skips, without them.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from typing import Any

import pytest

from e2e.test_deployed import Product, _ready, namespace, product  # noqa: F401  (fixtures)
from e2e.test_migration_real import _counter, _group_nodes, _history, _logs, agent_features, flow  # noqa: F401
from e2e.ticks import LogFollower
from extender.agent.crio import CrioImporter
from extender.consolidation.flow import ConsolidationFlow
from extender.consolidation.policy import MoveVerdict

pytestmark = [pytest.mark.live, pytest.mark.deployed, pytest.mark.crio]


def _crio(node: str) -> CrioImporter:
    """The node's CRI-O as the host sees it (hack/real-nodes.sh: /run/qos-local-nodes/<node>/crio.sock)."""
    return CrioImporter(f"/run/qos-local-nodes/{node}/crio.sock")


def _container_state(node: str, cid: str) -> int:
    """HTTP status of CRI-O's ``GET /containers/<id>`` on the node (200: it holds that container; 404: gone)."""
    import aiohttp

    async def ask() -> int:
        connector = aiohttp.UnixConnector(path=f"/run/qos-local-nodes/{node}/crio.sock")
        async with aiohttp.ClientSession(connector=connector) as s, s.get(f"http://crio/containers/{cid}") as r:
            return r.status

    return asyncio.run(ask())


def _cid(pod: dict[str, Any]) -> str:
    cid = str(pod["status"]["containerStatuses"][0]["containerID"])
    assert cid.startswith("cri-o://"), f"not a CRI-O container: {cid}"
    return cid.removeprefix("cri-o://")


def test_crio_nodes_say_they_restore(product: Product, flow: ConsolidationFlow) -> None:  # noqa: F811
    """Every agent on a CRI-O node answers the restore probe from its CRI-O (CRI Version and /config)."""
    for node in product.real_nodes:
        version, config = asyncio.run(_crio(node).runtime())
        assert config is not None and config["crio"]["runtime"]["enable_criu_support"] is True, node
        features = agent_features(product, flow, node)
        assert features["runtime"] == "cri-o" and features["containerd"] is None, features
        assert features["restore"]["supported"] is True, features["restore"]
        assert features["restore"]["runtime"] == f"cri-o {version}", features["restore"]


def test_counter_migrates_between_crio_nodes_with_its_count(
    product: Product,  # noqa: F811
    namespace: str,  # noqa: F811
    flow: ConsolidationFlow,  # noqa: F811
) -> None:
    kube = product.kube
    batch, service = _group_nodes(product)
    kube.create_pod(namespace, _counter("counter", batch))
    path = f"/api/v1/namespaces/{namespace}/pods/counter"
    src = kube.wait(lambda: pod if _ready(pod := kube.get(path)) else None, "the counter Running", timeout=120)
    src_cid = _cid(src)
    assert _container_state(batch, src_cid) == 200
    follower = LogFollower(product.bin_dir, product.env, namespace, "counter")
    kube.wait(lambda: len(follower.ticks) >= 8 or None, "8 ticks from the source", timeout=60, interval=0.5)

    t0 = time.monotonic()
    loop: asyncio.AbstractEventLoop = flow.loop  # type: ignore[attr-defined]
    mid = f"crio-move-{uuid.uuid4().hex[:8]}"
    result = loop.run_until_complete(flow.move_pod(mid, kube.get(path), batch, service))
    seconds = time.monotonic() - t0
    record = result.get("record") or {}
    assert result["verdict"] is MoveVerdict.COMMIT, json.dumps(
        {k: v for k, v in result.items() if k != "verdict"}, indent=1, default=str
    )
    follower.proc.wait(30)
    follower.stop()
    dest_ns, dest_name = result["destination_pod"].split("/")
    dest = kube.get(f"/api/v1/namespaces/{dest_ns}/pods/{dest_name}")
    assert dest["spec"]["nodeName"] == service
    image = dest["spec"]["containers"][0]["image"]
    assert image == record["restored_workload"]["image"] and image.startswith("localhost/qos-checkpoint/")

    # the image is in the service node's CRI-O store, as the kubelet sees it: CRI-O's checkpoint annotation on it
    store = _crio(service)
    annotations = asyncio.run(store.image_annotations(image))
    assert annotations and annotations["io.kubernetes.cri-o.annotations.checkpoint.name"] == "c", annotations
    assert asyncio.run(_crio(batch).image_digest(image)) is None  # only where it was restored

    # the count goes on from the checkpoint (restored, not started): the destination's first tick follows the
    # last one the source printed before the checkpoint, then one by one
    committed = _history(record, "committed")

    def restored_log() -> list[tuple[float, int]] | None:
        ts = _logs(product, dest_ns, dest_name)
        return ts if sum(1 for t, _ in ts if t > committed) >= 3 else None

    dest_log = kube.wait(restored_log, "3 ticks from the destination", timeout=30, interval=0.5)
    after = [(t, n) for t, n in dest_log if t > committed]
    first = after[0][1]
    cut = _history(record, "cutover")
    before_cut = [n for t, n in follower.ticks if t <= cut]
    assert before_cut and first >= before_cut[-1] + 1 and first >= 8, (first, follower.ticks[-10:])
    assert first <= follower.ticks[-1][1] + 1, (first, follower.ticks[-10:])
    restored = [n for _, n in after]
    assert restored == list(range(first, first + len(restored))), f"no gap, no repeat after the restore: {restored}"

    # exactly one copy: one pod, Ready on the service node; the source container gone from the batch node's CRI-O
    kube.wait(lambda: [p["metadata"]["name"] for p in kube.pods(namespace)] == [dest_name] or None,
              "only the destination pod left", timeout=60, interval=0.5)  # fmt: skip
    assert _ready(kube.get(f"/api/v1/namespaces/{dest_ns}/pods/{dest_name}"))
    kube.wait(lambda: _container_state(batch, src_cid) == 404 or None, "the source container gone", timeout=60)
    assert _container_state(service, _cid(kube.get(f"/api/v1/namespaces/{dest_ns}/pods/{dest_name}"))) == 200
    for node, role in ((batch, "source"), (service, "destination")):
        left = f"{product.node_dir(node, 'agent')}/archives/{role}/{mid}"
        assert product.node_ls(node, left) is None, f"{left} left behind on {node}"
    checkpoints = product.node_ls(batch, product.node_dir(batch, "kubelet-checkpoints")) or []
    assert not [n for n in checkpoints if n.startswith("checkpoint-")], checkpoints

    last_kept = next(t for t, n in follower.ticks if n == first - 1)
    timings = {
        "migration_seconds": round(seconds, 3),
        "checkpoint_final_seconds": record["timings"].get("checkpoint_final"),
        "restore_import_seconds": record["timings"].get("restore_at_destination"),
        "stop_seconds": round(after[0][0] - last_kept, 3),
        "archive_bytes": int(record["meta"]["archive_bytes"]),
        "first_destination_tick": first,
    }
    product.timings.update({f"crio_migration_{k}": v for k, v in timings.items() if isinstance(v, int | float)})
    print("\ncrio migration:", json.dumps(timings))


def test_a_crio_without_criu_support_refuses_before_any_checkpoint(
    product: Product,  # noqa: F811
    namespace: str,  # noqa: F811
    flow: ConsolidationFlow,  # noqa: F811
) -> None:
    """The destination's CRI-O restarted with ``enable_criu_support = false``: its agent says no when asked (at
    most 10 s later: it asks CRI-O again no more often), so the move is refused before anything is checkpointed
    and the source keeps counting, never restarted."""
    kube = product.kube
    batch, service = _group_nodes(product)
    product.restart_crio(service, criu_support=False)
    try:
        kube.wait(lambda: _ready(kube.get(f"/api/v1/nodes/{service}")) or None, "node Ready", timeout=120)

        def says_no() -> dict[str, Any] | None:
            answer: dict[str, Any] = agent_features(product, flow, service)["restore"]
            return answer if answer["supported"] is False else None

        off = kube.wait(says_no, "the destination agent saying it cannot restore", timeout=60, interval=1.0)
        assert "enable_criu_support" in off["reason"], off
        kube.create_pod(namespace, _counter("counter", batch))
        path = f"/api/v1/namespaces/{namespace}/pods/counter"
        kube.wait(lambda: pod if _ready(pod := kube.get(path)) else None, "the counter Running", timeout=120)
        kube.wait(lambda: len(_logs(product, namespace, "counter")) >= 3 or None, "3 ticks", timeout=60, interval=0.5)
        loop: asyncio.AbstractEventLoop = flow.loop  # type: ignore[attr-defined]
        mid = f"crio-off-{uuid.uuid4().hex[:8]}"
        result = loop.run_until_complete(flow.move_pod(mid, kube.get(path), batch, service))
        print("\ncrio without criu support:", result["outcome"], str(result["reason"])[:300])
        assert result["verdict"] is MoveVerdict.ROLL_BACK and result["outcome"] == "refused", result
        assert f"{service} cannot restore a checkpoint" in result["reason"], result["reason"]
        assert result["record"] is None, "the source agent was never asked: nothing checkpointed"
        assert [p["metadata"]["name"] for p in kube.pods(namespace)] == ["counter"]
        checkpoints = product.node_ls(batch, product.node_dir(batch, "kubelet-checkpoints")) or []
        assert not [n for n in checkpoints if n.startswith("checkpoint-")], checkpoints
        n = _logs(product, namespace, "counter")[-1][1]
        kube.wait(lambda: _logs(product, namespace, "counter")[-1][1] >= n + 2 or None, "the source counting on",
                  timeout=30, interval=0.5)  # fmt: skip
        ticks = [t for _, t in _logs(product, namespace, "counter")]
        assert ticks == list(range(len(ticks))), "the source never restarted"
    finally:
        product.restart_crio(service, criu_support=True)
        kube.wait(lambda: _ready(kube.get(f"/api/v1/nodes/{service}")) or None, "node Ready", timeout=120)
        kube.wait(lambda: agent_features(product, flow, service)["restore"]["supported"] is True or None,
                  "the destination agent able to restore again", timeout=60, interval=1.0)  # fmt: skip
