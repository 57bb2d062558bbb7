"""``qos-extender ungate``: release every pod our scheduling gate still holds, for an uninstall (issue 31).

A gated pod is released only by the QoS controller. Uninstall the controller (``helm uninstall``, ``kubectl delete
-k``, ``controller.enabled: false``) and every pod it held would stay SchedulingGated for ever. This command, run
before the controller goes (the chart's pre-delete hook Job runs it), first deletes the ordering admission webhook
so no new pod is gated, then removes the gate from every pod that has it (``core.gates.ungate_plan``) with the
controller's own guarded patch (``patches.release_patch``: the PATCH fails instead of removing another gate when
the pod changed), unpinned: kube-scheduler then places them as it would any pod. It lists again until a list
shows no gated pod (a pod admitted while the webhook was being deleted is caught by the next round).

Exit 0 when no pod is left gated; 1 when some still are after ``--rounds`` (each named on stderr); 2 on bad
arguments or no API server.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from dataclasses import dataclass, field
from typing import Any

__all__ = ["UngateResult", "add_ungate_arguments", "run_ungate_command", "ungate"]

DEFAULT_WEBHOOK = "qos-extender-ordering"


@dataclass
class UngateResult:
    released: list[str] = field(default_factory=list)  # pods whose gate this run removed
    left: list[str] = field(default_factory=list)  # pods still gated after the last round
    webhook_deleted: bool = False


def add_ungate_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--kubeconfig", help="kubeconfig (default: in-cluster)")
    p.add_argument("--gate", default=None, help="the scheduling gate to remove (default: controller.gate_name)")
    p.add_argument(
        "--webhook",
        default=DEFAULT_WEBHOOK,
        help=f"MutatingWebhookConfiguration deleted first, so no new pod is gated ('': keep it; {DEFAULT_WEBHOOK})",
    )
    p.add_argument("--namespace", help="only this namespace's pods (default: every namespace)")
    p.add_argument("--rounds", type=int, default=5, help="list-and-release rounds before giving up (default 5)")
    p.add_argument("--dry-run", action="store_true", help="print the pods that would be released; change nothing")


def run_ungate_command(args: argparse.Namespace) -> int:
    from extender.kube.client import ApiError
    from extender.settings.extender import ExtenderConfig

    if args.rounds < 1:
        print("qos-extender ungate: --rounds must be at least 1", file=sys.stderr)
        return 2
    gate = args.gate or ExtenderConfig().controller.gate_name
    try:
        result = asyncio.run(
            _run(args.kubeconfig, gate, args.webhook or None, args.rounds, args.dry_run, args.namespace or None)
        )
    except (OSError, ApiError) as exc:
        print(f"qos-extender ungate: {exc}", file=sys.stderr)
        return 2
    for key in result.released:
        print(f"{'would release' if args.dry_run else 'released'} {key}")
    if result.webhook_deleted:
        print(f"deleted MutatingWebhookConfiguration {args.webhook}")
    for key in result.left:
        print(f"qos-extender ungate: still gated: {key}", file=sys.stderr)
    return 1 if result.left and not args.dry_run else 0


async def _run(
    kubeconfig: str | None, gate: str, webhook: str | None, rounds: int, dry_run: bool, namespace: str | None
) -> UngateResult:
    from extender.kube.client import new_api_client
    from extender.settings.sections import KubernetesConfig

    api = await new_api_client(KubernetesConfig(kubeconfig=kubeconfig))
    try:
        return await ungate(api, gate, webhook=webhook, rounds=rounds, dry_run=dry_run, namespace=namespace)
    finally:
        await api.close()


async def _gated_pods(core: Any, gate: str, namespace: str | None) -> dict[str, dict[str, Any]]:
    """Every pod of the cluster (or of ``namespace``) that carries ``gate`` and may be released (``ungate_plan``),
    by key."""
    from extender.core.gates import GateView, ungate_plan
    from extender.kube.client import read_json

    pods: dict[str, dict[str, Any]] = {}
    views: list[GateView] = []
    token: str | None = None
    while True:
        kw: dict[str, Any] = {"limit": 500, "_preload_content": False}
        if token:
            kw["_continue"] = token
        if namespace is None:
            page = await read_json(await core.list_pod_for_all_namespaces(**kw))
        else:
            page = await read_json(await core.list_namespaced_pod(namespace, **kw))
        for pod in page.get("items") or []:
            meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
            key = f"{meta.get('namespace')}/{meta.get('name')}"
            pods[key] = pod
            gates = spec.get("schedulingGates") or []
            views.append(
                GateView(
                    key,
                    gated=any(isinstance(g, dict) and g.get("name") == gate for g in gates),
                    instance=None,  # every instance's pods: with the controller gone, none would be released
                    bypass_marked=False,
                    terminal=(pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"),
                    deleting=meta.get("deletionTimestamp") is not None,
                )
            )
        token = (page.get("metadata") or {}).get("continue")
        if not token:
            break
    return {k: pods[k] for k in ungate_plan(views)}


async def ungate(
    api: Any,
    gate: str,
    *,
    webhook: str | None = DEFAULT_WEBHOOK,
    rounds: int = 5,
    dry_run: bool = False,
    namespace: str | None = None,
) -> UngateResult:
    """Delete ``webhook`` (absent: fine), then release every pod ``gate`` holds, listing again until none is
    left or ``rounds`` lists were made. A pod changed meanwhile (the guarded PATCH refused) is tried again by the
    next round; one deleted meanwhile (404) needs nothing."""
    from kubernetes_asyncio import client as k8s

    from extender.controller.patches import release_patch
    from extender.kube.client import ApiError, read_json

    result = UngateResult()
    core = k8s.CoreV1Api(api)
    if webhook and not dry_run:
        admission = k8s.AdmissionregistrationV1Api(api)
        try:
            await read_json(await admission.delete_mutating_webhook_configuration(webhook, _preload_content=False))
            result.webhook_deleted = True
        except ApiError as exc:
            if exc.status != 404:
                raise
    for _ in range(rounds):
        gated = await _gated_pods(core, gate, namespace)
        if dry_run:
            result.released = sorted(gated)
            return result
        if not gated:
            return result
        for key, pod in gated.items():
            pod_namespace, name = key.split("/", 1)
            # this incarnation only (uid), and the gate still where the list saw it (release_patch's test)
            uid = (pod.get("metadata") or {}).get("uid")
            ops = [{"op": "test", "path": "/metadata/uid", "value": uid}, *release_patch(pod["spec"], gate, None)]
            try:
                await read_json(await core.patch_namespaced_pod(name, pod_namespace, ops, _preload_content=False))
            except ApiError as exc:
                if exc.status in (404, 409, 422):
                    continue  # gone, or changed since the list: the next round sees it as it is now
                raise
            result.released.append(key)
        await asyncio.sleep(0.5)  # pods admitted while the webhook was being deleted show up in the next list
    result.left = sorted(await _gated_pods(core, gate, namespace))
    return result
