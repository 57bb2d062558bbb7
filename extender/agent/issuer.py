"""The issuer of the agents' per-node identities (``qos-extender agent-issuer``): one Deployment that approves or
denies the agents' CertificateSigningRequests (``identity.csr_verdict``), signs their mTLS certificates with the
agents' CA, and keeps the per-node ClusterRoles of their kubelet credentials.

Why its own process: it is the one place that holds the agents' CA key and may approve kube-apiserver-client
certificates, so it runs apart from everything that handles workloads, with no port open at all (a refusal is
visible where the requester looks: the CSR's Denied condition, its reason and message).

Idempotent and restart-safe: every pass reads the pending CSRs again; an Approved CSR of our signer without a
certificate (an issuer that died between approving and signing) is signed on the next pass; the per-node roles
are applied with server-side apply, and the roles of nodes that are gone are deleted.
"""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import logging
import time
from pathlib import Path
from typing import Any, cast

from cryptography import x509
from cryptography.hazmat.primitives import serialization

from extender.agent.identity import (
    AGENT_SIGNER,
    KUBELET_SIGNER,
    NODE_LABEL,
    CsrRequest,
    csr_verdict,
    node_binding,
    node_role,
    sign,
)
from extender.agent.settings import IssuerConfig
from extender.kube.client import ApiError, read_json
from extender.signals import every
from extender.tls import fingerprint

__all__ = ["Issuer"]

log = logging.getLogger("extender.agent.issuer")


def _conditions(obj: dict[str, Any]) -> set[str]:
    return {str(c.get("type")) for c in (obj.get("status") or {}).get("conditions") or []}


class Issuer:
    def __init__(self, api: Any, config: IssuerConfig) -> None:
        from kubernetes_asyncio import client as k8s

        self.api = api
        self.config = config
        self.certs = k8s.CertificatesV1Api(api)
        self.core = k8s.CoreV1Api(api)
        self.rbac = k8s.RbacAuthorizationV1Api(api)
        self._ca_seen = ""
        self._load_ca()
        self.agent_user = f"system:serviceaccount:{config.agent_namespace}:{config.agent_service_account}"
        self.decisions: list[tuple[str, bool, str]] = []  # (csr, approved, why): what a pass decided (tests read it)
        self._missing_since: dict[str, float] = {}  # node -> when a pass first found its Node gone

    def _load_ca(self) -> None:
        """(Re)read the CA when its files changed: qos-certs rotates the agents' CA in its Secret and the kubelet
        updates the mount in place, so the next certificate is signed by the successor without a restart. A
        half-written pair keeps the old CA until the next pass."""
        paths = (self.config.ca_cert_file, self.config.ca_key_file)
        seen = fingerprint(paths)
        if seen == self._ca_seen:
            return
        cert = x509.load_pem_x509_certificate(Path(paths[0]).read_bytes())
        key = serialization.load_pem_private_key(Path(paths[1]).read_bytes(), password=None)
        if key.public_key() != cert.public_key():
            if self._ca_seen:
                log.warning("CA files do not match: the old CA stays", extra={"decision": "kept"})
                return
            raise ValueError(f"{paths[1]} is not the key of {paths[0]}")
        self.ca_cert, self.ca_key, self._ca_seen = cert, key, seen

    async def _json(self, coro: Any) -> dict[str, Any]:
        return cast(dict[str, Any], await read_json(await coro))

    async def _get(self, fn: Any, *args: Any) -> dict[str, Any] | None:
        try:
            return await self._json(
                fn(*args, _preload_content=False, _request_timeout=self.config.request_timeout_seconds)
            )
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise

    async def run_once(self) -> None:
        try:
            self._load_ca()
        except (OSError, ValueError) as exc:
            log.warning("CA reload failed: the old CA stays", extra={"error": str(exc)})
        t = self.config.request_timeout_seconds
        listed = await self._json(
            self.certs.list_certificate_signing_request(_preload_content=False, _request_timeout=t)
        )
        for obj in listed.get("items") or []:
            spec = obj.get("spec") or {}
            if spec.get("signerName") not in (AGENT_SIGNER, KUBELET_SIGNER) or spec.get("username") != self.agent_user:
                continue
            conds = _conditions(obj)
            if "Denied" in conds or "Failed" in conds:
                continue
            approved = "Approved" in conds
            if approved and (spec.get("signerName") == KUBELET_SIGNER or (obj.get("status") or {}).get("certificate")):
                continue  # done (kube-controller-manager signs the kubelet's)
            try:
                await self._decide(obj, approved)
            except Exception as exc:  # one bad CSR or a failed call must not stop the others
                log.warning("csr not handled", extra={"decision": obj["metadata"]["name"], "error": str(exc)})
        await self._collect_roles()

    async def _decide(self, obj: dict[str, Any], approved: bool) -> None:
        csr = CsrRequest.from_object(obj)
        node_name = next(iter(csr.extra.get("authentication.kubernetes.io/node-name") or ()), None)
        pod_name = next(iter(csr.extra.get("authentication.kubernetes.io/pod-name") or ()), None)
        pod = (
            await self._get(self.core.read_namespaced_pod, pod_name, self.config.agent_namespace) if pod_name else None
        )
        node = await self._get(self.core.read_node, node_name) if node_name else None
        ok, why = csr_verdict(
            csr,
            agent_user=self.agent_user,
            agent_pod_labels=self.config.agent_pod_labels,
            pod=pod,
            node=node,
            max_expiration_seconds=self.config.max_expiration_seconds,
            allowed_dns=frozenset(self.config.agent_dns_names),
        )
        self.decisions.append((csr.name, ok, why))
        log.info(
            "csr decided",
            extra={"node": node_name, "pod": pod_name, "decision": {"csr": csr.name, "approved": ok, "why": why}},
        )
        if not ok:
            await self._condition(obj, "Denied", "QosAgentIdentityRefused", why)
            return
        assert node_name is not None
        if csr.signer == KUBELET_SIGNER:
            await self._ensure_role(node_name)  # before the approval: the certificate works the moment it exists
        if not approved:
            await self._condition(obj, "Approved", "QosAgentIdentity", why)
        if csr.signer == AGENT_SIGNER:
            seconds = min(
                csr.expiration_seconds or self.config.max_expiration_seconds, self.config.max_expiration_seconds
            )
            pem = sign(csr.pem, self.ca_cert, self.ca_key, seconds=seconds, now=dt.datetime.now(dt.UTC))
            fresh = await self._get(self.certs.read_certificate_signing_request, csr.name)
            if fresh is None:
                return
            fresh.setdefault("status", {})["certificate"] = base64.b64encode(pem).decode()
            await self.certs.replace_certificate_signing_request_status(
                csr.name, cast(Any, fresh), _request_timeout=self.config.request_timeout_seconds
            )

    async def _condition(self, obj: dict[str, Any], kind: str, reason: str, message: str) -> None:
        fresh = await self._get(self.certs.read_certificate_signing_request, obj["metadata"]["name"])
        if fresh is None:
            return
        now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        status = fresh.setdefault("status", {})
        status.setdefault("conditions", []).append(
            {"type": kind, "status": "True", "reason": reason, "message": message[:1000], "lastUpdateTime": now}
        )
        await self.certs.replace_certificate_signing_request_approval(
            fresh["metadata"]["name"], cast(Any, fresh), _request_timeout=self.config.request_timeout_seconds
        )

    async def _ensure_role(self, node: str) -> None:
        """Create the node's ClusterRole and its binding, or put them back as they must be (someone edited them)."""
        from kubernetes_asyncio.client.exceptions import ApiException

        t = self.config.request_timeout_seconds
        rbac: Any = self.rbac
        pairs: tuple[tuple[dict[str, Any], Any, Any, Any], ...] = (
            (
                node_role(node),
                rbac.create_cluster_role,
                rbac.read_cluster_role,
                rbac.replace_cluster_role,
            ),
            (
                node_binding(node),
                rbac.create_cluster_role_binding,
                rbac.read_cluster_role_binding,
                rbac.replace_cluster_role_binding,
            ),
        )
        for body, create, read, replace in pairs:
            name = body["metadata"]["name"]
            try:
                await create(body, _request_timeout=t)
                continue
            except ApiException as exc:
                if exc.status != 409:
                    raise
            live = await self._get(read, name)
            if live is None:
                continue
            keys = ("rules",) if body["kind"] == "ClusterRole" else ("roleRef", "subjects")
            labels = (live.get("metadata") or {}).get("labels") or {}
            if all(live.get(k) == body[k] for k in keys) and labels.get(NODE_LABEL) == node:
                continue
            body["metadata"]["resourceVersion"] = live["metadata"]["resourceVersion"]
            if body["kind"] == "ClusterRoleBinding" and live.get("roleRef") != body["roleRef"]:
                await self.rbac.delete_cluster_role_binding(name, _request_timeout=t)  # roleRef is immutable
                del body["metadata"]["resourceVersion"]
                await create(body, _request_timeout=t)
            else:
                await replace(name, body, _request_timeout=t)

    async def _collect_roles(self) -> None:
        """The kubelet roles of nodes gone for ``role_grace_seconds`` go with them (a node name reused after
        that starts unbound). Found by bench/migration_faults.py: a Node deleted and re-registered by its kubelet
        within seconds kept its agent pod, which never enrols again, and every later checkpoint there was 403."""
        t = self.config.request_timeout_seconds
        roles = await self._json(
            self.rbac.list_cluster_role(label_selector=NODE_LABEL, _preload_content=False, _request_timeout=t)
        )
        now = time.monotonic()
        for role in roles.get("items") or []:
            node = role["metadata"]["labels"][NODE_LABEL]
            if await self._get(self.core.read_node, node) is not None:
                self._missing_since.pop(node, None)
                continue
            since = self._missing_since.setdefault(node, now)
            if now - since >= self.config.role_grace_seconds:
                self._missing_since.pop(node, None)
                name = role["metadata"]["name"]
                log.info("node gone: kubelet role removed", extra={"node": node, "decision": name})
                await self.rbac.delete_cluster_role_binding(name, _request_timeout=t)
                await self.rbac.delete_cluster_role(name, _request_timeout=t)

    async def run(self, stop: asyncio.Event) -> None:
        await every(self.config.poll_seconds, self.run_once, stop, log=log, failed="issuer pass failed")
