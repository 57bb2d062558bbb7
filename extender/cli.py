"""`qos-extender` command line: one entry point for every shell around the core (the long-running processes are
assembled in ``extender.processes``)."""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson
import yaml

from extender.autoscaler.settings import AutoscalerSettings, parse_autoscaler_config
from extender.autoscaler.view import GATED_DEMAND_SECONDS
from extender.consolidation.settings import ConsolidationSettings, parse_consolidation_config
from extender.core.model import InvalidInputError
from extender.processes import agent as agent_process
from extender.processes import autoscaler as autoscaler_process
from extender.processes import certs as certs_process
from extender.processes import issuer as issuer_process
from extender.processes import serve as serve_process
from extender.processes import ungate as ungate_process
from extender.settings import SettingsError
from extender.settings.extender import ExtenderConfig, deep_merge, parse_config

if TYPE_CHECKING:
    from extender.sim.engine import SimConfig
    from extender.sim.product import ProductSettings


def product_settings(
    extender: ExtenderConfig, autoscaler: AutoscalerSettings, consolidation: ConsolidationSettings
) -> ProductSettings:
    """The simulator's `product` policy from the product's own config files, read by the loaders the processes
    use (tests/test_cli_simulate.py checks config/'s files give ``ProductSettings()``, the simulator's default)."""
    from extender.sim.product import ProductSettings

    pol, ctl = extender.policy, extender.controller
    return ProductSettings(
        classes=dict(pol.classes),
        alpha_seconds=pol.alpha_seconds,
        min_run_quantum_seconds=pol.min_run_quantum_seconds,
        q_hysteresis_seconds=pol.q_hysteresis_seconds,
        overhead_cap=pol.overhead_cap,
        relax_by_importance=pol.relax_by_importance,
        peer_rescue_only=pol.peer_rescue_only,
        peer_victim_wait_seconds=pol.peer_victim_wait_seconds,
        profile=extender.scheduling.profile,
        scaling_cycle_seconds=extender.scheduling.scaling_cycle_seconds,
        enforce_node_groups=extender.node_groups.enforce,
        watchdog_seconds=ctl.watchdog_seconds,
        max_gate_seconds=ctl.max_gate_seconds,
        host_score=ctl.host_score,
        pin_node=ctl.pin_node,
        scan_interval_seconds=autoscaler.scan_interval_seconds,
        batch_cycle_seconds=autoscaler.batch_cycle_seconds,
        idle_seconds=autoscaler.idle_seconds,
        provisioning_timeout_seconds=autoscaler.provisioning_timeout_seconds,
        underutil_threshold=autoscaler.underutil_threshold,
        underutil_sustain_seconds=autoscaler.underutil_sustain_seconds,
        batch_queue_quiet_seconds=(
            consolidation.batch_queue_quiet_seconds
            if consolidation.batch_queue_quiet_seconds is not None
            else autoscaler.batch_queue_quiet_seconds
        ),
        weights=autoscaler.weights,
        max_nodes_per_cycle=autoscaler.max_nodes_per_cycle,
        max_nodes=autoscaler.max_nodes,
        scale_down_provisioned_only=autoscaler.scale_down_provisioned_only,
        lag_default_seconds=autoscaler.lag_default_seconds,
        lag_window=autoscaler.lag_window,
        lag_quantile=autoscaler.lag_quantile,
        gated_demand_seconds=GATED_DEMAND_SECONDS,
        consolidation=consolidation.enabled,
        left_alone_seconds=consolidation.left_alone_seconds,
        consolidation_provisioned_only=consolidation.provisioned_only,
    )


def _yaml(path: Path) -> dict[str, Any]:
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise InvalidInputError(f"--product-config: cannot read {path}: {exc}") from exc
    if not isinstance(raw, dict):
        raise InvalidInputError(f"--product-config: {path} is not a YAML mapping")
    return raw


def load_product_settings(config_dir: str | Path) -> ProductSettings:
    """``--product-config DIR``: the product's files in a config/ tree (base/extender.yaml with
    controller/controller.yaml layered over it, autoscaler/autoscaler.yaml, autoscaler/consolidation/
    consolidation.yaml), validated by the processes' own parsers. The certificate paths (Secret mounts in a pod)
    are dropped first (and the sidecar's /metrics listener with them): a simulation opens no socket."""
    root = Path(config_dir)
    ext = deep_merge(_yaml(root / "base" / "extender.yaml"), _yaml(root / "controller" / "controller.yaml"))
    if isinstance(ext.get("server"), dict):
        ext["server"].pop("tls", None)
    scaler = _yaml(root / "autoscaler" / "autoscaler.yaml")
    section = scaler.get("autoscaler")
    if isinstance(section, dict):
        section.pop("metrics", None)
    if isinstance(section, dict) and section.get("provider") == "cluster-autoscaler":
        # The simulator buys nodes itself, as the sidecar's lab (kwok) mode does; under cluster-autoscaler the
        # same plans are carried out by CA (ProvisioningRequests), which the simulator does not model.
        section["provider"] = "kwok"
        section.pop("cluster_autoscaler", None)
    cons = _yaml(root / "autoscaler" / "consolidation" / "consolidation.yaml")
    if isinstance(cons.get("consolidation"), dict):
        cons["consolidation"].pop("agent", None)
        cons["consolidation"]["agent"] = {"scheme": "http"}
    try:
        extender = parse_config(ext)
        autoscaler = parse_autoscaler_config(scaler, extender)
        consolidation = parse_consolidation_config(cons)
    except SettingsError as exc:
        raise InvalidInputError(f"--product-config {root}: {exc}") from exc
    return product_settings(extender, autoscaler, consolidation)


def _simulate_colocation(args: argparse.Namespace) -> int:
    """`--workload services-batch`: product with co-location (class and naive predictors) vs without vs k8s,
    on SYNTHETIC service usage + Alibaba 2017 batch (extender/sim/colocation.py, usage_trace.py)."""
    from extender.sim.colocation import COLOCATE_POLICIES, simulate_colocation
    from extender.sim.engine import POLICIES, SimConfig
    from extender.sim.report import colocation_report, format_colocation_table
    from extender.sim.usage_trace import ServiceUsageParams, services_batch

    knobs: dict[str, Any] = {
        "days": args.days,
        "services": args.services,
        "batch_per_day": args.batch_per_day,
        "seed": args.seed,
        "alibaba_path": os.environ.get("QOS_ALIBABA_TRACE"),  # as bench/sim_speed.py: where batch_task.csv is
    }
    params = ServiceUsageParams(**{k: v for k, v in knobs.items() if v is not None})
    policies = args.policy or ["product-colocate", "product-colocate-eq3", "product-colocate-last", "product", "k8s"]
    known = (*COLOCATE_POLICIES, *POLICIES)
    unknown = [p for p in policies if p not in known]
    if unknown:
        raise InvalidInputError(f"unknown policy {unknown[0]!r} (known: {', '.join(known)})")
    workload, usage = services_batch(params)
    config = SimConfig(**({"seed": args.seed} if args.seed is not None else {}))
    runs = []
    for p in policies:
        run = simulate_colocation(workload, usage, p, config)
        runs.append((run.result, run.stats.to_json()))
    doc = {k: (list(v) if isinstance(v, tuple) else v) for k, v in dataclasses.asdict(params).items()}
    report = colocation_report(workload.name, workload.origin, runs, doc)
    print(format_colocation_table(report))
    if args.json:
        Path(args.json).write_bytes(orjson.dumps(report, option=orjson.OPT_INDENT_2))
        print(f"wrote {args.json}")
    return 0


def _simulate_from_cluster(args: argparse.Namespace, config: Any) -> int:
    """`--from-cluster`: the cluster's last ``--since`` replayed under `product` (and any other --policy), against
    what the cluster actually did (extender/sim/from_cluster.py; the reading: extender/processes/history.py)."""
    import asyncio

    from extender.processes.history import read_history
    from extender.settings.sections import FLAVOURS_PATH, read_catalogue
    from extender.sim.engine import POLICIES, PREEMPTIVE, simulate
    from extender.sim.from_cluster import compare, format_comparison, parse_duration, replay_from_history
    from extender.sim.report import format_table, report_json

    since = parse_duration(args.since)
    policies = args.policy or ["product"]
    bad = [p for p in policies if p not in POLICIES or p in PREEMPTIVE]
    if bad:
        known = ", ".join(p for p in POLICIES if p not in PREEMPTIVE)
        raise InvalidInputError(f"--from-cluster replays autoscaled policies only: {bad[0]!r} (known: {known})")
    flavours_file = Path(args.product_config) / "flavours.yaml" if args.product_config else FLAVOURS_PATH
    try:
        flavours = read_catalogue(flavours_file if flavours_file.is_file() else FLAVOURS_PATH)
    except (OSError, yaml.YAMLError, ValueError) as exc:
        raise InvalidInputError(f"cannot read the flavour catalogue {flavours_file}: {exc}") from exc
    classes = dict(config.product.classes)
    history = asyncio.run(
        read_history(
            kubeconfig=args.kubeconfig,
            context=args.context,
            since_seconds=since,
            namespaces=tuple(args.namespace or ()),
            node_selector=args.node_selector,
            prometheus_url=args.prometheus,
            classes=classes,
        )
    )
    replay = replay_from_history(history, flavours, classes, since)
    if not replay.workload.requests:
        raise InvalidInputError(
            f"no pod in the window ({replay.end - replay.start:.0f} s): nothing to replay (--since, --namespace?)"
        )
    results = [simulate(replay.workload, p, config) for p in policies]
    report = report_json(replay.workload.name, results)
    report["actual"] = replay.actual
    report["vs_actual"] = {run["policy"]: compare(replay.actual, run) for run in report["runs"]}
    report["assumptions"] = list(replay.assumptions)
    print(format_table(report))
    print(format_comparison(replay.actual, report["vs_actual"][policies[0]], replay.assumptions))
    for name in policies[1:]:
        vs = report["vs_actual"][name]
        if vs["saving"] is not None:
            print(f"{name}: {-100 * vs['saving']:+.1f} % against the actual bill")
    _write_outputs(args, report, results)
    return 0


def _need_plots(args: argparse.Namespace) -> None:
    """matplotlib is the `plots` extra (not in the image): say so before minutes of simulation, not after."""
    if args.plots and importlib.util.find_spec("matplotlib") is None:
        raise InvalidInputError("--plots needs matplotlib: pip install 'kube-qos-extender[plots]'")


def _sim_config(args: argparse.Namespace) -> SimConfig:
    """The engine's SimConfig from --seed, --quantum, --alpha and --product-config, for a workload and a replay."""
    from extender.sim.engine import SimConfig

    overrides = {k: v for k, v in (("seed", args.seed), ("qos_quantum", args.quantum)) if v is not None}
    if args.alpha is not None:
        overrides["alpha_cold"] = overrides["alpha_hot"] = args.alpha
    config = SimConfig(**overrides)
    if args.product_config:
        config = dataclasses.replace(config, product=load_product_settings(args.product_config))
    return config


def _write_outputs(args: argparse.Namespace, report: Mapping[str, Any], results: Sequence[Any]) -> None:
    """--json and --plots of a simulation, the same for a built-in workload and a cluster's replay."""
    from extender.sim.report import write_plots

    if args.json:
        Path(args.json).write_bytes(orjson.dumps(report, option=orjson.OPT_INDENT_2))
        print(f"wrote {args.json}")
    if args.plots:
        for path in write_plots(report, results, args.plots):
            print(f"wrote {path}")


def _simulate(args: argparse.Namespace) -> int:
    from extender.sim.engine import POLICIES, simulate
    from extender.sim.report import format_table, report_json
    from extender.sim.workloads import load_workload

    cluster_only = ("since", "namespace", "node_selector", "prometheus", "kubeconfig", "context")
    if args.from_cluster:
        if args.workload or args.hosts or any(v is not None for v in (args.days, args.services, args.batch_per_day)):
            raise InvalidInputError(
                "--from-cluster replays the cluster: no --workload, --hosts or services-batch knobs"
            )
        _need_plots(args)
        return _simulate_from_cluster(args, _sim_config(args))
    if not args.workload:
        raise InvalidInputError("simulate needs --workload NAME_OR_PATH or --from-cluster")
    if any(getattr(args, k) not in (None, [], "3h") for k in cluster_only):
        raise InvalidInputError(
            "--since, --namespace, --node-selector, --prometheus, --kubeconfig and --context "
            "are for --from-cluster only"
        )
    if args.workload == "services-batch":
        return _simulate_colocation(args)
    if any(v is not None for v in (args.days, args.services, args.batch_per_day)):
        raise InvalidInputError("--days, --services and --batch-per-day are for --workload services-batch only")
    _need_plots(args)
    workload = load_workload(args.workload, args.hosts)
    config = _sim_config(args)
    default = ["qos-driven", "priority"] if workload.hosts else ["product", "htas", "k8s"]
    policies = args.policy or default
    unknown = [p for p in policies if p not in POLICIES]
    if unknown:
        raise InvalidInputError(f"unknown policy {unknown[0]!r} (known: {', '.join(POLICIES)})")
    results = [simulate(workload, p, config) for p in policies]
    report = report_json(workload.name, results)
    print(format_table(report))
    _write_outputs(args, report, results)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="qos-extender", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    sim = sub.add_parser("simulate", help="replay a workload through the policy core and report SLIs and cost")
    sim.add_argument("--workload", help="built-in name or a broker CSV path (or --from-cluster)")
    sim.add_argument(
        "--from-cluster",
        action="store_true",
        help="replay the live cluster's last --since (KUBECONFIG) under product, against what it actually did",
    )
    sim.add_argument("--since", default="3h", help="--from-cluster: the window (3h, 90m, 600s; default 3h)")
    sim.add_argument(
        "--namespace",
        action="append",
        help="--from-cluster: only this namespace's pods (repeat; default all but kube-system)",
    )
    sim.add_argument("--node-selector", help="--from-cluster: only the nodes with these labels (k=v,...)")
    sim.add_argument(
        "--prometheus", help="--from-cluster: Prometheus URL (kube-state-metrics' series of deleted nodes/pods)"
    )
    sim.add_argument("--kubeconfig", help="--from-cluster: kubeconfig (default $KUBECONFIG, ~/.kube/config)")
    sim.add_argument("--context", help="--from-cluster: kubeconfig context")
    sim.add_argument("--hosts", help="host list (paper-002 infrastructure format) for a CSV workload")
    sim.add_argument(
        "--policy",
        action="append",
        help="qos-driven | qos-paper | priority | htas | k8s | product (repeat); services-batch also"
        " product-colocate | product-colocate-eq3 | product-colocate-last",
    )
    sim.add_argument(
        "--product-config",
        help="config/ folder whose controller, autoscaler and consolidation files define `product` "
        "(default: the shipped values, compiled in)",
    )
    sim.add_argument("--json", help="write the report JSON here")
    sim.add_argument("--plots", help="write PNG plots into this directory")
    sim.add_argument("--seed", type=int)
    sim.add_argument("--quantum", type=float, help="qos-driven minimum run quantum in seconds")
    sim.add_argument("--alpha", type=float, help="allocation overhead per (re)start in seconds")
    sim.add_argument("--days", type=int, help="services-batch: simulated days (day 1 = observation)")
    sim.add_argument("--services", type=int, help="services-batch: long-running services")
    sim.add_argument("--batch-per-day", type=int, help="services-batch: Alibaba 2017 batch tasks per day")
    sim.set_defaults(func=_simulate)

    srv = sub.add_parser("serve", help="run the kube-scheduler extender webhook (filter/prioritize/preempt/bind)")
    srv.add_argument(
        "--config",
        action="append",
        help="YAML settings; repeat to layer files (deep-merged in order). Every option and its default: "
        "docs/settings/extender.yaml; none: every default",
    )
    srv.add_argument("--host", help="override server.host")
    srv.add_argument("--port", type=int, help="override server.port (0: any free port)")
    srv.set_defaults(func=serve_process.run_serve_command)

    agent = sub.add_parser("agent", help="run the per-node checkpoint/restore agent (criu | kubelet | simulated)")
    agent_process.add_agent_arguments(agent)
    agent.set_defaults(func=agent_process.run_agent_command)

    issuer = sub.add_parser("agent-issuer", help="issue the agents' per-node certificates (CSR approver and signer)")
    issuer_process.add_issuer_arguments(issuer)
    issuer.set_defaults(func=issuer_process.run_issuer_command)

    certs = sub.add_parser(
        "certs", help="keep the certificates the parts mount: authorities, leaves, webhook caBundle (no port)"
    )
    certs_process.add_certs_arguments(certs)
    certs.set_defaults(func=certs_process.run_certs_command)

    scaler = sub.add_parser("autoscaler", help="run the autoscaler sidecar (kwok | cluster-autoscaler expander)")
    autoscaler_process.add_autoscaler_arguments(scaler)
    scaler.set_defaults(func=autoscaler_process.run_autoscaler_command)

    ungate = sub.add_parser(
        "ungate",
        help="uninstall: delete the ordering webhook, then release every pod our scheduling gate holds",
    )
    ungate_process.add_ungate_arguments(ungate)
    ungate.set_defaults(func=ungate_process.run_ungate_command)

    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        rc: int = args.func(args)
    except InvalidInputError as exc:
        print(f"qos-extender: error: {exc}", file=sys.stderr)
        return 2
    return rc


if __name__ == "__main__":
    sys.exit(main())
