"""`qos-extender serve`: the extender webhook, which starts the QoS controller and the admission webhook."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import sys

from extender.config import ConfigError, load_config

__all__ = ["run_serve_command"]


def run_serve_command(args: argparse.Namespace) -> int:
    """`qos-extender serve`: the extender webhook (and the QoS controller, admission webhook, /metrics)."""
    from extender.logs import setup_logging
    from extender.webhook.serve import serve

    try:
        config = load_config(args.config)
    except ConfigError as exc:
        print(f"qos-extender serve: {exc}", file=sys.stderr)
        return 2
    overrides = {k: v for k, v in (("host", args.host), ("port", args.port)) if v is not None}
    if overrides:
        config = dataclasses.replace(config, server=dataclasses.replace(config.server, **overrides))
    setup_logging(config.log_level)
    try:
        asyncio.run(serve(config))
    except ConfigError as exc:
        print(f"qos-extender serve: {exc}", file=sys.stderr)
        return 2
    return 0
