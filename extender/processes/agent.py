"""``qos-extender agent``: arguments and entry point (imports the agent lazily, so the CLI stays light)."""

from __future__ import annotations

import argparse
import sys

__all__ = ["add_agent_arguments", "run_agent_command"]


def add_agent_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", help="agent YAML (keys of AgentConfig, optionally under 'agent:')")
    p.add_argument("--host", help="listen address (tests: 127.0.0.x only)")
    p.add_argument("--port", type=int, help="listen port (0: any free port)")
    p.add_argument("--node-name", help="this node's name (default: hostname)")
    p.add_argument("--state-dir", help="journal and archives directory")
    p.add_argument("--backend", choices=("criu", "kubelet", "simulated"))
    p.add_argument(
        "--container-runtime",
        choices=("containerd", "cri-o"),
        help="kubelet backend: the node's runtime, into whose image store checkpoint images go (kubelet.runtime)",
    )
    p.add_argument("--criu", help="criu binary (default: $QOS_CRIU, hack/build-criu.sh cache, PATH)")
    p.add_argument("--tls-cert", help="this agent's certificate (mTLS)")
    p.add_argument("--tls-key", help="its key")
    p.add_argument("--tls-ca", help="CA that signs every agent's and controller's certificate")
    p.add_argument("--log-level", help="DEBUG, INFO, WARNING ...")
    p.add_argument(
        "--enable-test-fault-injection",
        action="store_true",
        default=None,
        help="TEST ONLY: accept PUT /v1/test/faults (never in a real cluster)",
    )


def run_agent_command(args: argparse.Namespace) -> int:
    import asyncio

    from extender.agent.backends.base import BackendError
    from extender.agent.server import run_agent
    from extender.agent.settings import AgentConfigError, load_agent_config
    from extender.logs import setup_logging

    overrides = {
        "host": args.host,
        "port": args.port,
        "node_name": args.node_name,
        "state_dir": args.state_dir,
        "backend": args.backend,
        "log_level": args.log_level,
        "test_fault_injection": args.enable_test_fault_injection,
    }
    if args.tls_cert or args.tls_key or args.tls_ca:
        given = {"cert_file": args.tls_cert, "key_file": args.tls_key, "ca_file": args.tls_ca}
        overrides["tls"] = {k: v for k, v in given.items() if v is not None}
    if args.criu:
        overrides["criu"] = {"path": args.criu}
    if args.container_runtime:
        overrides["kubelet"] = {"runtime": args.container_runtime}
    try:
        config = load_agent_config(args.config, **overrides)
    except AgentConfigError as exc:
        print(f"qos-extender agent: {exc}", file=sys.stderr)
        return 2
    setup_logging(config.log_level)
    try:
        asyncio.run(run_agent(config))
    except (BackendError, OSError) as exc:
        print(f"qos-extender agent: {exc}", file=sys.stderr)
        return 2
    return 0
