"""Shared by the kwok usage e2e tests (usage reader, slack controller, colocation eviction, ``serve`` with
colocation): a namespace and a tainted kwok node of the run's own, the local Prometheus that scrapes kwok's
emulated usage, and the wait for the slack controller to have classified the node's service through it."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from extender.colocation.controller import SlackController, SlackParams
from extender.core.characterise import DAY_SECONDS, CharacteriseConfig, ServiceProfile, WorkloadModel, fit_model
from extender.core.slack import Amount
from lab.kube_sync import Kube
from tests.live import require_kubeconfig

IMAGE = "registry.invalid/pause:3.9"  # never pulled: kwok runs no containers
CFG = CharacteriseConfig(k=2, seeds=(0,), observation_seconds=20.0)


@contextlib.contextmanager
def kwok_usage_node(prefix: str) -> Iterator[tuple[Kube, str, str, str]]:
    """(kube, Prometheus URL, run id, kubeconfig): namespace ``<rid>`` and node ``<rid>-node`` (4 CPU, 8Gi,
    tainted ``e2e-run=<rid>:NoSchedule``, in the service node group), both removed afterwards, whatever the
    test did."""
    kubeconfig = require_kubeconfig()
    kube = Kube(kubeconfig)
    prom = os.environ.get("PROMETHEUS_URL", "").rstrip("/")
    if not prom:
        pytest.fail("PROMETHEUS_URL is not set: export the KEY=VALUE lines hack/local-up.sh prints", pytrace=False)
    rid = f"{prefix}-{uuid.uuid4().hex[:6]}"
    kube.ensure_namespace(rid)
    node = f"{rid}-node"
    kube.create_node(
        {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": node,
                "annotations": {"kwok.x-k8s.io/node": "fake"},
                # a service node: co-located batch pods pass the extender's enforced node-group rule there
                "labels": {
                    "type": "kwok",
                    "e2e-run": rid,
                    "kubernetes.io/hostname": node,
                    "qos.kube-qos-extender.io/node-group": "service",
                },
            },
            "spec": {"taints": [{"key": "e2e-run", "value": rid, "effect": "NoSchedule"}]},
            "status": {
                "allocatable": {"cpu": "4", "memory": "8Gi", "pods": "110"},
                "capacity": {"cpu": "4", "memory": "8Gi", "pods": "110"},
            },
        }
    )
    try:
        yield kube, prom, rid, kubeconfig
    finally:
        kube.delete_namespace(rid)
        kube.delete_node(node)
        kube.close()


def service_pod(node: str) -> dict[str, Any]:
    """The service ``svc`` bound to ``node``: requests 2 CPU and 4Gi, kwok emulates a usage of 500m and 1Gi."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "svc",
            "annotations": {"kwok.x-k8s.io/usage-cpu": "500m", "kwok.x-k8s.io/usage-memory": "1Gi"},
        },
        "spec": {
            "nodeName": node,
            "tolerations": [{"operator": "Exists"}],
            "containers": [
                {
                    "name": "app",
                    "image": IMAGE,
                    "resources": {"requests": {"cpu": "2", "memory": "4Gi"}},
                }
            ],
        },
    }


def fixture_model() -> WorkloadModel:
    """A model fitted on two fixture services, a quarter and three quarters of a CPU all day (:data:`CFG`)."""
    slots = CFG.slots
    return fit_model(
        CFG,
        {
            "fixture/quarter": ServiceProfile(np.full(slots, 0.25), np.full(slots, 0.25), DAY_SECONDS),
            "fixture/three-quarters": ServiceProfile(np.full(slots, 0.75), np.full(slots, 0.75), DAY_SECONDS),
        },
        now=time.time(),
    )


def slack_test_settings(prom: str, model_path: Path, ns: str) -> dict[str, Any]:
    """The ``slack`` section the serve tests run with: the local Prometheus, a 30 s rate window, a refresh every
    2 s, the run's nodes only, and the fixture's characterisation (k = 2, one seed, 20 s observation)."""
    return {
        "prometheus_url": prom,
        "rate_window": "30s",
        "model_path": str(model_path),
        "refresh_seconds": 2,
        "history_seconds": 600,
        "classify_seconds": 600,
        "step_seconds": 5,
        "node_selector": f"e2e-run={ns}",
        "characterise": {"k": 2, "seeds": 1, "observation_seconds": 20},
        # the tests check paper 004's Eq. 3 on the fixture model to the byte; the correction by each service's
        # own level (on by default) is checked by test_slack_kwok.py's own-level test, tests/test_own_level.py
        # and the simulator
        "own_level": {"enabled": False},
    }


async def until_classified(ctl: SlackController, node: str, seconds: float = 150) -> dict[str, Amount]:
    """Steps ``ctl`` until it lends ``node`` something (0 until the service has been observed for p through
    Prometheus) and returns those amounts; fails the test after ``seconds``."""
    deadline = time.monotonic() + seconds
    amounts: dict[str, Amount] = {}
    while time.monotonic() < deadline:
        amounts = await ctl.step()
        if amounts[node] != Amount(0, 0):
            return amounts
        await asyncio.sleep(3)
    pytest.fail(f"the service was never classified; last published: {amounts}")


def controller_settings(model_path: Path, node_selector: str) -> SlackParams:
    """The slack controller as the live tests run it: the two-class model (CFG), ten minutes of history and of
    classification window sampled every 5 s, on the nodes ``node_selector`` picks."""
    return SlackParams(
        model_path=model_path,
        config=CFG,
        history_seconds=600.0,
        classify_seconds=600.0,
        step_seconds=5.0,
        node_selector=node_selector,
        own_level=None,  # Eq. 3 alone, as slack_test_settings (the tests' expected amounts are Eq. 3's)
    )
