"""`qos-extender serve`: the extender webhook, which starts the QoS controller and the admission webhook, and
with ``slack.enabled`` the slack publisher (batch on the slack of long-running services, issue 16)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from collections.abc import Callable, Coroutine
from typing import Any

from extender.settings import SettingsError
from extender.settings.extender import ExtenderConfig, SlackConfig, load_config

__all__ = ["run_serve_command", "slack_term"]


def slack_term(
    config: ExtenderConfig, slack: SlackConfig, api_client: Any, registry: Any, stop: asyncio.Event
) -> Callable[[], Coroutine[Any, Any, None]]:
    """One leader term of the slack controller as a callable run once per term. Its metrics are created here,
    once, in ``registry``: every term reuses them (a registry refuses the same names twice, so a term that
    made its own would fail at once and the replica would hold the Lease without ever publishing)."""
    from extender.colocation.controller import SlackMetrics, run_slack_controller

    metrics = SlackMetrics(registry)

    async def publish() -> None:
        await run_slack_controller(
            slack,
            api_client,
            classes=config.policy.classes,
            defaults=config.pod_defaults,
            metrics=metrics,
            event_component=config.kubernetes.event_component if config.kubernetes.events else None,
            stop=stop,
            disruption=config.disruption,
        )

    return publish


async def _serve(config: ExtenderConfig) -> None:
    """webhook.serve.serve, plus the slack controller as one more task of the running extender (stopped with
    it, on its API client and in its /metrics registry). With ``controller.leader_election.enabled`` only the
    holder of the Lease ``<controller lease>-slack`` runs it, so replicas never evict the same pod twice or
    fight over node status; a replica that loses the Lease stops its refreshes at once."""
    from extender.controller.leader import Leadership
    from extender.processes.webhook import start
    from extender.signals import stop_event

    running = await start(config)
    stop = stop_event()
    slack = config.slack

    try:
        if slack.enabled:
            publish = slack_term(config, slack, running.api_client, running.metrics.registry, stop)
            election = config.controller.leader_election
            if election.enabled:
                leadership = Leadership(running.api_client, election, f"{config.controller.lease_name}-slack", publish)
                running.tasks.append(asyncio.create_task(leadership.run(), name="slack-controller-election"))
            else:
                running.tasks.append(asyncio.create_task(publish(), name="slack-controller"))
        await stop.wait()
    finally:
        logging.getLogger("extender.processes.webhook").info("stopping")
        await running.stop()


def run_serve_command(args: argparse.Namespace) -> int:
    """`qos-extender serve`: the extender webhook (and the QoS controller, admission webhook, /metrics)."""
    from extender.logs import setup_logging

    try:
        config = load_config(args.config or [])
    except SettingsError as exc:
        print(f"qos-extender serve: {exc}", file=sys.stderr)
        return 2
    overrides = {k: v for k, v in (("host", args.host), ("port", args.port)) if v is not None}
    if overrides:
        config = config.model_copy(update={"server": config.server.model_copy(update=overrides)})
    setup_logging(config.log_level)
    try:
        asyncio.run(_serve(config))
    except SettingsError as exc:
        print(f"qos-extender serve: {exc}", file=sys.stderr)
        return 2
    return 0
