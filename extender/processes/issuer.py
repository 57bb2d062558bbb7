"""``qos-extender agent-issuer``: the process that issues the agents' per-node identities
(extender/agent/issuer.py). No port: its decisions are on the CSRs (Approved/Denied with reason and message)
and in its JSON log."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

__all__ = ["add_issuer_arguments", "run_issuer_command"]


def add_issuer_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", help="issuer YAML (keys of IssuerConfig, optionally under 'issuer:')")
    p.add_argument("--kubeconfig", help="kubeconfig (default: in-cluster)")


def run_issuer_command(args: argparse.Namespace) -> int:
    import asyncio

    from extender.agent.settings import IssuerConfig
    from extender.logs import setup_logging
    from extender.settings import SettingsError, load_settings
    from extender.settings.base import read_yaml

    try:
        raw = read_yaml(Path(args.config)) if args.config else {}
        if isinstance(raw, dict) and set(raw) == {"issuer"}:
            raw = raw["issuer"]
        if args.kubeconfig:
            raw = {**(raw or {}), "kubeconfig": args.kubeconfig}
        config = load_settings(IssuerConfig, raw, args.config or "issuer")
    except SettingsError as exc:
        print(f"qos-extender agent-issuer: {exc}", file=sys.stderr)
        return 2
    setup_logging(config.log_level)
    try:
        asyncio.run(_run(config))
    except OSError as exc:
        print(f"qos-extender agent-issuer: {exc}", file=sys.stderr)
        return 2
    return 0


async def _run(config: object) -> None:
    from extender.agent.issuer import Issuer
    from extender.agent.settings import IssuerConfig
    from extender.kube.client import new_api_client
    from extender.settings.sections import KubernetesConfig
    from extender.signals import stop_event

    assert isinstance(config, IssuerConfig)
    api = await new_api_client(KubernetesConfig(kubeconfig=config.kubeconfig))
    try:
        await Issuer(api, config).run(stop_event())
    finally:
        await api.close()
