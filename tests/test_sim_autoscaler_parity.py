"""The simulator's `htas` policy and the autoscaler sidecar decide alike (issue 14: each decision exists once).

Both call ``extender.core.autoscale_scan.scan``: the simulator from its own state (``Simulator._htas_scan``), the
sidecar from the cluster's snapshot (``AutoscalerLoop.step``). These tests replay an HTAS workload and, at every
scan of the simulator, write the simulator's state as the Kubernetes objects the sidecar would list (nodes with
their group and flavour labels, bound pods, pending pods marked Unschedulable, the nodes being provisioned as the
ledger), step one sidecar loop kept alongside the whole run on them, and require the same effects: the same
nodes bought (group, flavour, the pods each is for, in order), the same nodes deleted as idle, the same
consolidation plans executed. They fail if either side grows a decision of its own, or if the simulator stops
feeding the scan what its state says.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from extender.autoscaler.loop import PROVISIONED_BY_LABEL, PROVISIONED_BY_VALUE, AutoscalerLoop, Decisions
from extender.autoscaler.view import AutoscalerSnapshot
from extender.core import autoscale, reschedule
from extender.core.autoscale_scan import ScanState
from extender.core.model import NodeGroup, WorkloadKind
from extender.settings.extender import ExtenderConfig
from extender.sim import engine
from extender.sim.engine import Simulator, State
from extender.sim.workloads import load_workload
from tests.autoscaler_settings import make_settings

CONFIG = ExtenderConfig()
SCHEDULER = "qos-scheduler"


def _stamp(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _sidecar(sim: Simulator) -> AutoscalerLoop:
    """The sidecar with the simulator's knobs, and no limit the simulator does not have."""
    cfg = sim.cfg
    settings = make_settings(
        scheduler_names=(SCHEDULER,),
        flavours=tuple(sim.w.flavours),
        weights=cfg.weights,
        batch_cycle_seconds=cfg.autoscale_cycle,
        idle_seconds=cfg.idle_seconds,
        underutil_threshold=cfg.underutil_threshold,
        underutil_sustain_seconds=cfg.underutil_sustain,
        batch_queue_quiet_seconds=cfg.batch_queue_quiet,
        provisioning_timeout_seconds=1e9,
        max_nodes_per_cycle=10**6,
        max_nodes=10**6,
        max_attempts_per_pod=10**6,
    )
    names = iter(range(10**9))
    return AutoscalerLoop(settings, CONFIG.node_groups, name_suffix=lambda: f"{next(names):06d}")


def _cluster(sim: Simulator) -> AutoscalerSnapshot:
    """The simulator's state as the objects the sidecar lists (every node ours, labelled with its group)."""
    now = sim.now
    nodes = []
    for n in sim.nodes.values():
        alloc = n.allocatable
        res = {"cpu": f"{alloc.cpu_milli}m", "memory": str(alloc.memory_bytes), "pods": str(alloc.pods)}
        labels = {
            "qos.kube-qos-extender.io/node-group": n.group.value,
            CONFIG.node_groups.flavour_label: n.flavour or "host",
            PROVISIONED_BY_LABEL: PROVISIONED_BY_VALUE,
        }
        nodes.append(
            {
                "metadata": {"name": n.name, "labels": labels, "creationTimestamp": _stamp(n.ready_at)},
                "spec": {"unschedulable": True} if n.cordoned else {},
                "status": {"allocatable": res, "capacity": res},
            }
        )
    pods = []
    for r in sim.reqs.values():
        if r.state in (State.WAITING, State.DONE):
            continue
        pod = sim._pod(r)
        annotations = {"qos.kube-qos-extender.io/kind": pod.kind.value}
        if pod.kind is WorkloadKind.BATCH:
            # the work left now, as a run starting now: the remaining runtime every core decision reads
            annotations["qos.kube-qos-extender.io/runtime-seconds"] = repr(pod.remaining_runtime(now))
        status: dict[str, Any] = {"phase": "Running" if r.node else "Pending"}
        if r.node is None:
            status["conditions"] = [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]
        else:
            status["startTime"] = _stamp(now)
        req = pod.requests
        pods.append(
            {
                "metadata": {"name": pod.name, "namespace": "default", "uid": pod.uid, "annotations": annotations},
                "spec": {
                    "schedulerName": SCHEDULER,
                    "nodeName": r.node,
                    "containers": [
                        {
                            "name": "c",
                            "resources": {"requests": {"cpu": f"{req.cpu_milli}m", "memory": str(req.memory_bytes)}},
                        }
                    ],
                },
                "status": status,
            }
        )
    snap = AutoscalerSnapshot(CONFIG)
    snap.replace_nodes(nodes, "1", now=now)
    snap.replace_pods(pods, "1", now=now)
    return snap


def _adopt(loop: AutoscalerLoop, state: ScanState) -> None:
    """The nodes the simulator is provisioning are the sidecar's ledger (what it bought and is waiting for)."""
    entries = state.provisioning
    loop.adopt_ledger(autoscale.ProvisioningLedger(tuple(e for _, e in entries)), {e.node_name: g for g, e in entries})


Bought = list[tuple[NodeGroup, str, tuple[str, ...]]]


def _sidecar_effects(d: Decisions) -> tuple[Bought, list[str], list[reschedule.MigrationPlan]]:
    bought = [(r.group, r.flavour.name, r.pods) for r in d.provision]
    plans = list(d.consolidation.plans) if d.consolidation is not None else []
    return bought, sorted(d.delete), plans


@pytest.mark.parametrize("pattern", ["stable", "growing", "cycle"])
def test_every_htas_scan_of_the_simulator_is_the_sidecars_decision_on_the_same_cluster(
    pattern: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    w = load_workload(f"htas-{pattern}")
    sidecar: dict[str, AutoscalerLoop] = {}
    migrated: list[reschedule.MigrationPlan] = []
    original_scan, original_migrate = Simulator._htas_scan, Simulator._migrate
    totals = {"scans": 0, "bought": 0, "groups": set(), "deleted": 0, "plans": 0}

    def migrate(self: Simulator, plan: reschedule.MigrationPlan) -> None:
        migrated.append(plan)
        original_migrate(self, plan)

    def checked_scan(self: Simulator) -> None:
        loop = sidecar.setdefault("loop", _sidecar(self))
        cluster = _cluster(self)
        _adopt(loop, self.scan_state)
        before_nodes, before_prov = set(self.nodes), set(self.provisioning)
        migrated.clear()
        original_scan(self)
        ledger = {e.node_name: (g, e) for g, e in self.scan_state.provisioning}
        bought = [
            (ledger[name][0], ledger[name][1].flavour.name, ledger[name][1].pods)
            for name in self.provisioning
            if name not in before_prov
        ]
        deleted = sorted(before_nodes - set(self.nodes))
        expected = _sidecar_effects(loop.step(cluster, self.now))
        assert (bought, deleted, migrated) == expected, f"t={self.now}"
        totals["scans"] += 1
        totals["bought"] += len(bought)
        totals["groups"] |= {g for g, _, _ in bought}
        totals["deleted"] += len(deleted)
        totals["plans"] += len(migrated)

    monkeypatch.setattr(Simulator, "_htas_scan", checked_scan)
    monkeypatch.setattr(Simulator, "_migrate", migrate)
    result = engine.simulate(w, "htas")
    # not vacuous: every run bought nodes (growing in both groups), deleted idle ones and consolidated by migration
    assert totals["scans"] > 100
    assert totals["bought"] == result.counters.nodes_added > 0
    assert totals["deleted"] > 0 and totals["plans"] > 0 and result.counters.migrations > 0
    if pattern == "growing":
        assert totals["groups"] == {NodeGroup.SERVICE, NodeGroup.BATCH}
