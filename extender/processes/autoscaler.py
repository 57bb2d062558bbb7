"""`qos-extender autoscaler`: the autoscaler sidecar and, when enabled, the consolidation flow as its hand-off.

``consolidation`` depends on the autoscaler (``consolidation.flow.AutoscalerRuntime``), never the reverse, so the
two are combined here, above both.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import TYPE_CHECKING

from extender.settings import SettingsError
from extender.settings.extender import ConfigError, ExtenderConfig, load_config
from extender.signals import stop_event

if TYPE_CHECKING:
    from extender.autoscaler.settings import AutoscalerSettings
    from extender.consolidation.settings import ConsolidationSettings

__all__ = ["add_autoscaler_arguments", "run_autoscaler_command"]


async def _autoscaler_process(
    config: ExtenderConfig, settings: AutoscalerSettings, consolidation: ConsolidationSettings | None = None
) -> None:
    """The autoscaler sidecar, with the agent-driven consolidation flow (issue #8) as its hand-off when enabled."""
    from extender.consolidation.flow import ConsolidationFlow
    from extender.processes.sidecar import start_autoscaler

    flow: ConsolidationFlow | None = None
    if consolidation is not None and consolidation.enabled:
        flow = ConsolidationFlow(consolidation)
    # The flow acts (cordons, migrates, deletes): it runs only within the sidecar's leader terms.
    running = await start_autoscaler(config, settings, handoff=flow, term_services=[flow] if flow is not None else [])
    if flow is not None and running.provider is None:  # refused at start (exit 2), not in every term
        await running.stop()
        raise ConfigError(
            "consolidation needs a provider: kwok (it deletes the emptied node) or cluster-autoscaler with "
            "provisioning_requests (the emptied node is left to CA's scale-down)"
        )
    stop = stop_event()
    try:
        await stop.wait()
    finally:
        if flow is not None:
            await flow.stop()
        await running.stop()


def add_autoscaler_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config",
        action="append",
        help="extender YAML (Kubernetes access, node groups, classes, flavours); repeat to layer files; "
        "none: every default (docs/settings/extender.yaml)",
    )
    parser.add_argument(
        "--autoscaler-config", help="autoscaler YAML (every option: docs/settings/autoscaler.yaml; none: the defaults)"
    )
    parser.add_argument("--metrics-port", type=int, help="override autoscaler.metrics.port (0: any free port)")
    parser.add_argument(
        "--consolidation-config",
        help="consolidation YAML (issue #8; docs/settings/consolidation.yaml): with `enabled: true` the "
        "autoscaler empties under-utilised batch nodes through the node agents and deletes them",
    )
    parser.add_argument("--check-config", action="store_true", help="validate both files, print the catalogue, exit")


def run_autoscaler_command(args: argparse.Namespace) -> int:
    """`qos-extender autoscaler`: validate the files (``--check-config`` prints the catalogue), then run."""
    from extender.autoscaler.settings import load_autoscaler_config
    from extender.logs import setup_logging

    try:
        config = load_config(args.config or [])
        settings = load_autoscaler_config(args.autoscaler_config, config)
        consolidation = None
        if getattr(args, "consolidation_config", None):
            from extender.consolidation.settings import load_consolidation_config

            consolidation = load_consolidation_config(args.consolidation_config)
    except SettingsError as exc:
        print(f"qos-extender autoscaler: {exc}", file=sys.stderr)
        return 2
    if args.metrics_port is not None:
        settings = settings.model_copy(
            update={"metrics": settings.metrics.model_copy(update={"port": args.metrics_port})}
        )
    if args.check_config:
        for f in settings.flavours:
            c = f.capacity
            print(f"{f.name}: cpu={c.cpu_milli}m memory={c.memory_bytes}B pods={c.pods} ${f.price_per_hour}/h")
        print(
            f"provider={settings.provider} scan={settings.scan_interval_seconds}s cycle={settings.batch_cycle_seconds}s"
        )
        cp = settings.expander.cloud_provider
        if cp is not None:
            groups = len(cp.groups) * len(settings.flavours)
            print(
                f"externalgrpc cloud provider on {cp.listen} (mTLS): {groups} node groups "
                f"({'/'.join(g.value for g in cp.groups)} x flavours), size {cp.min_size}..{cp.max_size}, "
                f"backend {cp.backend}"
            )
        return 0
    setup_logging(config.log_level)
    try:
        asyncio.run(_autoscaler_process(config, settings, consolidation))
    except SettingsError as exc:
        print(f"qos-extender autoscaler: {exc}", file=sys.stderr)
        return 2
    return 0
