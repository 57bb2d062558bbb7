"""The `product` policy's settings: the shipped defaults of config/, as one value the simulator runs with.

The product is what `config/default` (+ the consolidation Component) deploys: the QoS controller on
(config/base/extender.yaml with config/controller/controller.yaml: classes, alpha, anti-thrashing, host score =
the prioritize verb's), the
extender's filter and prioritize (node groups enforced, the `cost` profile), the autoscaler sidecar
(config/autoscaler/autoscaler.yaml) and the consolidation flow (config/autoscaler/consolidation/consolidation.yaml).
The defaults below are those files' values; ``qos-extender simulate`` reads nothing at run time (a wheel has no
config/ folder), and tests/test_cli_simulate.py loads the files with the project's own loaders and fails if
``ProductSettings()`` differs from them (``extender.cli.product_settings`` is that mapping).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from extender.core import autoscale, qos
from extender.core.model import DEFAULT_CLASSES, InvalidInputError, ServiceClass

__all__ = ["ProductSettings"]


@dataclass(frozen=True, slots=True)
class ProductSettings:
    """Every knob of the product the simulator models; each field names the config option it comes from."""

    # extender config (config/base/extender.yaml + config/controller/controller.yaml)
    classes: Mapping[str, ServiceClass] = field(default_factory=lambda: dict(DEFAULT_CLASSES))  # classes
    alpha_seconds: float = 2.0  # qos.alpha_seconds
    min_run_quantum_seconds: float = qos.RECOMMENDED_QUANTUM_SECONDS  # qos.min_run_quantum_seconds
    q_hysteresis_seconds: float = qos.RECOMMENDED_HYSTERESIS_SECONDS  # qos.q_hysteresis_seconds
    overhead_cap: bool = True  # qos.overhead_cap
    relax_by_importance: bool = True  # qos.relax_by_importance
    peer_rescue_only: bool = True  # qos.peer_rescue_only
    # qos.peer_victim_wait_seconds; the simulator runs it at 0 on fixed hosts (no autoscaler: see Simulator)
    peer_victim_wait_seconds: float = qos.RECOMMENDED_PEER_VICTIM_WAIT_SECONDS
    profile: str = "cost"  # scheduling.profile
    scaling_cycle_seconds: float = 300.0  # scheduling.scaling_cycle_seconds
    enforce_node_groups: bool = True  # node_groups.enforce
    watchdog_seconds: float = 10.0  # controller.watchdog_seconds
    max_gate_seconds: float = 3600.0  # controller.max_gate_seconds
    host_score: str = "profile"  # controller.host_score
    pin_node: bool = True  # controller.pin_node
    # autoscaler config (config/autoscaler/autoscaler.yaml)
    scan_interval_seconds: float = 30.0  # autoscaler.scan_interval_seconds
    batch_cycle_seconds: float = 300.0  # autoscaler.batch_cycle_seconds (default: scheduling.scaling_cycle_seconds)
    idle_seconds: float = 300.0  # autoscaler.idle_seconds
    provisioning_timeout_seconds: float = 900.0  # autoscaler.provisioning_timeout_seconds
    underutil_threshold: float = 0.5  # autoscaler.underutil_threshold
    underutil_sustain_seconds: float = 30.0  # autoscaler.underutil_sustain_seconds
    batch_queue_quiet_seconds: float = 30.0  # autoscaler.batch_queue_quiet_seconds
    weights: autoscale.ScoreWeights = field(default_factory=autoscale.ScoreWeights)  # autoscaler.score_weights
    max_nodes_per_cycle: int = 50  # autoscaler.limits.max_nodes_per_cycle
    max_nodes: int = 200  # autoscaler.limits.max_nodes
    retire_drain_seconds: float = 3600.0  # autoscaler.limits.retire_drain_seconds
    scale_down_provisioned_only: bool = True  # autoscaler.scale_down_provisioned_only
    lag_default_seconds: float = 120.0  # autoscaler.lag.default_seconds (expected node lag before any sample)
    lag_window: int = 20  # autoscaler.lag.window
    lag_quantile: float = 0.9  # autoscaler.lag.quantile
    gated_demand_seconds: float = 15.0  # extender.autoscaler.view.GATED_DEMAND_SECONDS (a gated pod is demand)
    # consolidation config (config/autoscaler/consolidation/consolidation.yaml)
    consolidation: bool = True  # consolidation.enabled
    left_alone_seconds: float = 3600.0  # consolidation.left_alone_seconds
    consolidation_provisioned_only: bool = True  # consolidation.provisioned_only

    def __post_init__(self) -> None:
        for name in (
            "watchdog_seconds",
            "scan_interval_seconds",
            "batch_cycle_seconds",
            "scaling_cycle_seconds",
            "max_gate_seconds",
        ):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and value > 0 and not math.isnan(value)):
                raise InvalidInputError(f"product setting {name} must be positive, got {value!r}")
        if self.host_score not in ("profile", "least-allocated"):
            raise InvalidInputError(
                f"product setting host_score must be profile or least-allocated, got {self.host_score!r}"
            )
        if self.max_nodes_per_cycle < 1 or self.max_nodes < 1:
            raise InvalidInputError("product settings max_nodes_per_cycle and max_nodes must be >= 1")

    def qos_policy(self) -> qos.QosPolicy:
        return qos.QosPolicy(
            classes=self.classes,
            alpha_seconds=self.alpha_seconds,
            min_run_quantum_seconds=self.min_run_quantum_seconds,
            q_hysteresis_seconds=self.q_hysteresis_seconds,
            overhead_cap=self.overhead_cap,
            relax_by_importance=self.relax_by_importance,
            peer_rescue_only=self.peer_rescue_only,
            peer_victim_wait_seconds=self.peer_victim_wait_seconds,
        )
