"""``qos-extender certs``: the certificate keeper's process (extender/certs). No port: what it did is in its
JSON log and in Events on the Secrets it writes."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

__all__ = ["add_certs_arguments", "run_certs_command"]


def add_certs_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", required=True, help="keeper YAML (keys of CertsConfig, optionally under 'certs:')")
    p.add_argument("--kubeconfig", help="kubeconfig (default: in-cluster)")
    p.add_argument("--once", action="store_true", help="one pass, print what it did, exit 1 if a step failed")


def run_certs_command(args: argparse.Namespace) -> int:
    import asyncio

    from extender.certs.settings import CertsConfig
    from extender.logs import setup_logging
    from extender.settings import SettingsError, load_settings
    from extender.settings.base import read_yaml

    try:
        raw = read_yaml(Path(args.config))
        if isinstance(raw, dict) and set(raw) == {"certs"}:
            raw = raw["certs"]
        if args.kubeconfig:
            raw = {**(raw or {}), "kubeconfig": args.kubeconfig}
        config = load_settings(CertsConfig, raw, args.config)
    except SettingsError as exc:
        print(f"qos-extender certs: {exc}", file=sys.stderr)
        return 2
    setup_logging(config.log_level)
    try:
        return asyncio.run(_run(config, once=args.once))
    except OSError as exc:
        print(f"qos-extender certs: {exc}", file=sys.stderr)
        return 2


async def _run(config: object, *, once: bool) -> int:
    from extender.certs.keeper import Keeper
    from extender.certs.settings import CertsConfig
    from extender.kube.client import new_api_client
    from extender.settings.sections import KubernetesConfig
    from extender.signals import stop_event

    assert isinstance(config, CertsConfig)
    api = await new_api_client(KubernetesConfig(kubeconfig=config.kubeconfig))
    try:
        keeper = Keeper(api, config)
        if once:
            outcomes = await keeper.run_once()
            for o in outcomes:
                print(f"{o.kind} {o.key}: {o.action} ({o.why})")
            return 1 if any(o.action == "error" for o in outcomes) else 0
        await keeper.run(stop_event())
        return 0
    finally:
        await api.close()
