"""`qos-extender agent`: the per-node checkpoint/restore agent (nothing else runs in its process)."""

from __future__ import annotations

import argparse

__all__ = ["add_agent_arguments", "run_agent_command"]


def add_agent_arguments(parser: argparse.ArgumentParser) -> None:
    from extender.agent.main import add_agent_arguments as add

    add(parser)


def run_agent_command(args: argparse.Namespace) -> int:
    """`qos-extender agent`: the per-node checkpoint/restore agent."""
    from extender.agent.main import run_agent_command as run

    return run(args)
