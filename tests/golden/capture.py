"""Recapture the golden extender bodies from the real kube-scheduler of hack/ (see ORIGIN.md).

    tests/golden/capture.sh            # brings up its own cluster twice (nodeCacheCapable true / false)

This module is the inner part: with a cluster whose scheduler calls EXTENDER_URL but whose extender is NOT
started by local-up (QOS_START_EXTENDER=0), it serves the real extender in-process on EXTENDER_URL's port,
records every verb request and response, runs a fixed scenario (three nodes, a small pod, three 3-CPU
bronze pods, a 3-CPU gold pod that must preempt), and writes ``<out>/requests.log`` (one JSON per line:
t, verb, seq, request, response) and ``<out>/nodes.json`` (the Node objects the replay rebuilds state from).
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
from aiohttp import web

from extender.kube.binder import KubeBinder
from extender.kube.client import new_api_client
from extender.kube.snapshot import Snapshot
from extender.kube.watch import node_reflector, pod_reflector
from extender.settings.extender import ExtenderConfig, KubernetesConfig, ServerConfig, TlsConfig
from extender.webhook.app import make_app, start_server
from extender.webhook.metrics import Metrics
from lab.kube_sync import Kube

MARKER = "qos.kube-qos-extender.io/managed"
NS = "golden"
NODES = ("node-1", "node-2", "node-3")


def _node(name: str) -> dict[str, Any]:
    res = {"cpu": "4", "memory": "8Gi", "pods": "110"}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {"kwok.x-k8s.io/node": "fake"},
            "labels": {
                "type": "kwok",
                "golden": "1",
                "kubernetes.io/hostname": name,
                "qos.kube-qos-extender.io/node-group": "service",
                "node.kubernetes.io/instance-type": "golden-4x8",
            },
        },
        "spec": {},
        "status": {"allocatable": res, "capacity": res},
    }


def _pod(name: str, cpu: str, cls: str, priority_class: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": {"app": "golden"}, "annotations": {"qos.kube-qos-extender.io/class": cls}},
        "spec": {
            "schedulerName": "qos-scheduler",
            "priorityClassName": priority_class,
            "terminationGracePeriodSeconds": 0,
            "nodeSelector": {"golden": "1"},
            "containers": [
                {
                    "name": "c",
                    "image": "registry.invalid/pause:3.9",
                    "resources": {
                        "requests": {"cpu": cpu, "memory": "256Mi", MARKER: "1"},
                        "limits": {MARKER: "1"},
                    },
                }
            ],
        },
    }


async def capture(out: Path) -> None:
    env = os.environ
    url = env["EXTENDER_URL"].rstrip("/")
    port = int(url.rsplit(":", 1)[1])
    config = ExtenderConfig().model_copy(
        update=dict(
            server=ServerConfig(
                port=port,
                tls=TlsConfig(env["EXTENDER_SERVING_CERT"], env["EXTENDER_SERVING_KEY"], env["EXTENDER_CA"]),
            ),
            kubernetes=KubernetesConfig(kubeconfig=env["KUBECONFIG"], watch_timeout_seconds=60),
        )
    )
    records: list[dict[str, Any]] = []
    seq: Counter[str] = Counter()

    @web.middleware
    async def record(request: web.Request, handler: Any) -> web.StreamResponse:
        verb = request.path.strip("/")
        if request.method != "POST":
            passthrough: web.StreamResponse = await handler(request)
            return passthrough
        body = await request.read()
        response = await handler(request)
        assert isinstance(response, web.Response) and response.body is not None
        seq[verb] += 1
        records.append(
            {
                "t": time.time(),
                "verb": verb,
                "seq": seq[verb],
                "request": orjson.loads(body),
                "response": orjson.loads(bytes(response.body)),  # type: ignore[arg-type]
            }
        )
        return response

    api = await new_api_client(config.kubernetes)
    snapshot = Snapshot(config)
    reflectors = [node_reflector(api, snapshot, config.kubernetes), pod_reflector(api, snapshot, config.kubernetes)]
    app = make_app(config, snapshot, KubeBinder(api, config.bind), events=None, metrics=Metrics(), clock=time.time)
    app.middlewares.append(record)
    runner, _ = await start_server(app, config)
    tasks = [asyncio.create_task(r.run()) for r in reflectors]
    kube = Kube(env["KUBECONFIG"])
    try:
        for name in NODES:
            kube.create_node(_node(name))
        kube.wait(
            lambda: (
                all(
                    any(c["type"] == "Ready" and c["status"] == "True" for c in n["status"].get("conditions", []))
                    for n in kube.nodes("golden=1")
                )
                and len(kube.nodes("golden=1")) == 3
            ),
            "golden nodes Ready",
        )
        while not snapshot.ready or any(n not in snapshot.nodes for n in NODES):
            await asyncio.sleep(0.1)
        kube.ensure_namespace(NS)

        async def bound(*names: str) -> None:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                pods = {p["metadata"]["name"]: p for p in kube.pods(NS)}
                if all(pods.get(n, {}).get("spec", {}).get("nodeName") for n in names):
                    return
                await asyncio.sleep(0.2)
            raise TimeoutError(f"{names} not bound")

        kube.create_pod(NS, _pod("pod-a", "500m", "bronze", "qos-bronze"))
        await bound("pod-a")
        for i in (1, 2, 3):  # one 3-CPU pod per node (node-1 keeps pod-a beside it)
            kube.create_pod(NS, _pod(f"low-{i}", "3", "bronze", "qos-bronze"))
            await bound(f"low-{i}")
        kube.create_pod(NS, _pod("high-1", "3", "gold", "qos-gold"))  # nothing fits: preempt a bronze pod
        await bound("high-1")
        await asyncio.sleep(1.0)
    finally:
        for t in tasks:
            t.cancel()
        await runner.cleanup()
        await api.close()
        kube.delete_namespace(NS)
        for name in NODES:
            kube.delete_node(name)
        kube.close()
    nodes = [_node(n) for n in NODES]
    out.mkdir(parents=True, exist_ok=True)
    (out / "requests.log").write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in records))
    (out / "nodes.json").write_bytes(orjson.dumps(nodes, option=orjson.OPT_INDENT_2) + b"\n")
    print(f"{out}: {dict(Counter(r['verb'] for r in records))}", file=sys.stderr)


if __name__ == "__main__":
    asyncio.run(capture(Path(sys.argv[1])))
