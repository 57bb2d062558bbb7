"""kwok provider: the local STAND-IN FOR A CLOUD API. It "boots" a machine by waiting a sampled acquisition lag
and then creating a kwok-managed Node object of the chosen flavour; kwok makes it Ready and runs its pods.

Node shape = hack/local-up.sh's ``node_manifest``: annotation ``kwok.x-k8s.io/node: fake`` (kwok manages only
those), labels ``type=kwok``, ``node.kubernetes.io/instance-type``, the node-group selector labels,
capacity = allocatable = the flavour's cpu / memory / pods, price in ``qos.kube-qos-extender.io/price-per-hour``;
plus ``qos.kube-qos-extender.io/provisioned-by`` so the sidecar only ever removes nodes it bought, and
``spec.providerID = kwok://<name>`` (the instance id cluster-autoscaler's externalgrpc provider matches Nodes by).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import random
from collections.abc import Sequence
from typing import Any

from kubernetes_asyncio import client as k8s

from extender.autoscaler.loop import RETIRING_LABEL, ProvisionRequest
from extender.autoscaler.settings import LagDistribution
from extender.kube.client import ApiError, read_json

__all__ = ["PROVIDER_ID_PREFIX", "KwokProvider", "node_manifest", "sample_lag"]

log = logging.getLogger("extender.autoscaler.kwok")

KUBE_VERSION = "v1.35.8"
KWOK_VERSION = "v0.8.0"
PROVIDER_ID_PREFIX = "kwok://"


def sample_lag(dist: LagDistribution, rng: random.Random) -> float:
    """One acquisition lag in seconds (never negative)."""
    if dist.distribution == "fixed":
        value = dist.seconds
    elif dist.distribution == "uniform":
        value = rng.uniform(dist.minimum, dist.upper)
    elif dist.distribution == "normal":
        value = max(dist.minimum, rng.gauss(dist.seconds, dist.sd))
    else:  # lognormal: median seconds, shape sigma
        value = math.exp(rng.gauss(math.log(max(dist.seconds, 1e-9)), dist.sigma))
    return max(0.0, value)


def _quantity_mi(nbytes: int) -> str:
    return f"{nbytes // 2**20}Mi" if nbytes % 2**20 == 0 else str(nbytes)


def node_manifest(request: ProvisionRequest) -> dict[str, Any]:
    cap = request.flavour.capacity
    resources = {"cpu": f"{cap.cpu_milli}m", "memory": _quantity_mi(cap.memory_bytes), "pods": str(cap.pods)}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": request.name,
            "annotations": {
                "kwok.x-k8s.io/node": "fake",
                "node.alpha.kubernetes.io/ttl": "0",
                "qos.kube-qos-extender.io/price-per-hour": repr(request.flavour.price_per_hour),
            },
            "labels": {
                "type": "kwok",
                "kubernetes.io/arch": "amd64",
                "kubernetes.io/os": "linux",
                "kubernetes.io/hostname": request.name,
                **request.labels,
            },
        },
        "spec": {"providerID": f"{PROVIDER_ID_PREFIX}{request.name}"},
        "status": {
            "allocatable": dict(resources),
            "capacity": dict(resources),
            "nodeInfo": {
                "architecture": "amd64",
                "operatingSystem": "linux",
                "kubeletVersion": KUBE_VERSION,
                "kubeProxyVersion": KUBE_VERSION,
                "containerRuntimeVersion": f"kwok-{KWOK_VERSION}",
            },
            "phase": "Running",
        },
    }


class KwokProvider:
    name = "kwok"

    def __init__(self, api_client: Any, lag: LagDistribution, request_timeout: float = 30.0) -> None:
        self._core = k8s.CoreV1Api(api_client)
        self._lag = lag
        self._rng = random.Random(lag.seed)
        self._timeout = request_timeout
        self._booting: dict[str, asyncio.Task[None]] = {}
        self.created = 0
        self.deleted = 0

    async def create(self, request: ProvisionRequest) -> None:
        if request.name in self._booting:
            return
        lag = sample_lag(self._lag, self._rng)
        self._booting[request.name] = asyncio.create_task(self._boot(request, lag), name=f"kwok-boot-{request.name}")
        log.info("kwok node requested", extra={"decision": {"node": request.name, "lag_seconds": round(lag, 3)}})

    async def _boot(self, request: ProvisionRequest, lag: float) -> None:
        try:
            await asyncio.sleep(lag)
            for attempt in range(5):
                try:
                    body: Any = node_manifest(request)  # plain JSON, not the generated V1Node
                    response = await self._core.create_node(
                        body, _preload_content=False, _request_timeout=self._timeout
                    )
                    await read_json(response)
                    self.created += 1
                    return
                except ApiError as exc:
                    if exc.status == 409:
                        return  # already there (a retry that had succeeded)
                    if exc.status < 500 and exc.status != 429:
                        log.error("kwok node create refused", extra={"error": str(exc)})
                        return
                except (TimeoutError, OSError) as exc:
                    log.warning("kwok node create failed", extra={"error": repr(exc)})
                await asyncio.sleep(min(2.0**attempt, 10.0))
        finally:
            self._booting.pop(request.name, None)

    async def create_all(self, requests: Sequence[ProvisionRequest]) -> None:
        for request in requests:
            await self.create(request)

    async def fulfilled(self, node_names: Sequence[str]) -> None:
        """Nothing to do: the loop saw the nodes join."""

    async def cancel(self, node_name: str) -> None:
        task = self._booting.pop(node_name, None)
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self.delete(node_name)

    async def delete(self, node_name: str) -> None:
        try:
            response = await self._core.delete_node(node_name, _preload_content=False, _request_timeout=self._timeout)
            await read_json(response)
            self.deleted += 1
        except ApiError as exc:
            if exc.status != 404:
                log.warning("kwok node delete failed", extra={"error": str(exc), "node": node_name})

    async def set_retiring(self, node_name: str, retiring: bool) -> None:
        """Cordon + label a node retired for capacity, or undo both (``loop.RETIRING_LABEL`` is how the next
        scans, and a restarted sidecar, know it is retiring). A failure is logged; the next scan decides again
        from the label."""
        body = {
            "metadata": {"labels": {RETIRING_LABEL: "true" if retiring else None}},
            "spec": {"unschedulable": retiring},
        }
        try:
            response = await self._core.patch_node(
                node_name, body, _preload_content=False, _request_timeout=self._timeout
            )
            await read_json(response)
        except ApiError as exc:
            if exc.status != 404:
                log.warning("retiring node patch failed", extra={"error": str(exc), "node": node_name})
        except Exception as exc:  # the API is unreachable: the next scan decides again
            log.warning("retiring node patch failed", extra={"error": str(exc), "node": node_name})
        else:
            log.info(
                "retiring for capacity" if retiring else "retirement cancelled",
                extra={"decision": {"node": node_name, "retiring": retiring}},
            )

    async def close(self) -> None:
        for name in list(self._booting):
            task = self._booting.pop(name)
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
