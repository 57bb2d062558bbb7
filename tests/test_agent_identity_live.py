"""Per-node agent identities against a real kube-apiserver and kube-controller-manager (issue #29): an agent pod's
bound ServiceAccount token obtains its node's certificates through the CSR API, the issuer refuses every CSR
that names another node, an IP that is not the node's, or a group, and the real RBAC authorizer lets the kubelet
credential of node A checkpoint on A and nowhere else.

Real parts: the API server records the token's node and pod in the CSR (``spec.extra``), kube-controller-manager
signs the kubelet client certificates with the cluster CA, RBAC answers SubjectAccessReviews. The nodes are
plain Node objects nobody runs (no kubelet is needed to prove who may call one: the kubelet asks the same
SubjectAccessReview, e2e/test_agent_identity_real.py shows it on real kubelets).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import datetime as dt
import subprocess
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.x509.oid import NameOID
from kubernetes_asyncio import client as k8s
from kubernetes_asyncio import config as k8s_config

from extender.agent.identity import AGENT_SIGNER, KUBELET_SIGNER, NODE_LABEL, Requester, make_csr
from extender.agent.issuer import Issuer
from extender.agent.settings import IssuerConfig
from extender.kube.client import new_api_client
from extender.settings.sections import KubernetesConfig
from tests.live import require_kubeconfig

pytestmark = [pytest.mark.live]
AGENT_LABELS = {"app.kubernetes.io/name": "qos-agent"}


@pytest.fixture
async def admin() -> AsyncIterator[Any]:
    api = await new_api_client(KubernetesConfig(kubeconfig=require_kubeconfig()))
    yield api
    await api.close()


def _ca(d: Path) -> tuple[Path, Path]:
    d.mkdir(parents=True, exist_ok=True)
    run = {"cwd": d, "check": True, "capture_output": True, "timeout": 60}
    subprocess.run(["openssl", "ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", "ca.key"], **run)  # type: ignore[call-overload]
    subprocess.run(["openssl", "req", "-x509", "-new", "-key", "ca.key", "-sha256", "-days", "2", "-subj",
                    "/CN=qos-agent-test-ca", "-addext", "basicConstraints=critical,CA:TRUE", "-addext",
                    "keyUsage=critical,keyCertSign,cRLSign", "-out", "ca.crt"], **run)  # type: ignore[call-overload]  # fmt: skip
    return d / "ca.crt", d / "ca.key"


async def _token_client(kubeconfig: str, token: str) -> Any:
    """An API client that authenticates with ``token`` only (the agent's view of the API server)."""
    cfg = k8s.Configuration()
    await k8s_config.load_kube_config(config_file=kubeconfig, client_configuration=cfg)
    cfg.cert_file = None
    cfg.key_file = None
    cfg.api_key = {"BearerToken": f"Bearer {token}"}
    return k8s.ApiClient(cfg)


class World:
    def __init__(self, admin: Any, run: str, tmp: Path) -> None:
        self.admin, self.run, self.tmp = admin, run, tmp
        self.core = k8s.CoreV1Api(admin)
        self.rbac = k8s.RbacAuthorizationV1Api(admin)
        self.ns = f"qos-ident-{run}"
        self.nodes = {x: f"qos-ident-{run}-{x}" for x in "ab"}
        self.ips = {"a": "10.77.0.1", "b": "10.77.0.2"}

    async def setup(self) -> None:
        await self.core.create_namespace({"metadata": {"name": self.ns}})
        await self.core.create_namespaced_service_account(self.ns, {"metadata": {"name": "qos-agent"}})
        role = f"qos-ident-{self.run}"
        await self.rbac.create_cluster_role({"metadata": {"name": role}, "rules": [
            {"apiGroups": ["certificates.k8s.io"], "resources": ["certificatesigningrequests"],
             "verbs": ["create", "get"]}]})  # fmt: skip
        await self.rbac.create_cluster_role_binding({
            "metadata": {"name": role},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
            "subjects": [{"kind": "ServiceAccount", "name": "qos-agent", "namespace": self.ns}]})  # fmt: skip
        for x, name in self.nodes.items():
            await self.core.create_node({"metadata": {"name": name, "labels": {"qos-ident": self.run}}})
            for _ in range(20):  # the node controllers write the status too: retry on a conflict
                node = await self.core.read_node(name)
                node.status.addresses = [{"type": "InternalIP", "address": self.ips[x]}]
                try:
                    await self.core.replace_node_status(name, node)
                    break
                except k8s.ApiException as exc:
                    if exc.status != 409:
                        raise
                    await asyncio.sleep(0.1)

    async def agent_pod(self, x: str, labels: dict[str, str] | None = None) -> tuple[str, str]:
        name = f"qos-agent-{x}-{uuid.uuid4().hex[:4]}"
        pod = await self.core.create_namespaced_pod(self.ns, {
            "metadata": {"name": name, "labels": labels if labels is not None else AGENT_LABELS},
            "spec": {"nodeName": self.nodes[x], "serviceAccountName": "qos-agent",
                     "automountServiceAccountToken": False,
                     "containers": [{"name": "agent", "image": "kube-qos-extender:dev"}]}})  # fmt: skip
        tok = await self.core.create_namespaced_service_account_token("qos-agent", self.ns, {
            "spec": {"boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": name, "uid": pod.metadata.uid},
                     "expirationSeconds": 3600}})  # fmt: skip
        return name, tok.status.token

    async def teardown(self) -> None:
        role = f"qos-ident-{self.run}"
        for fn, arg in ((self.rbac.delete_cluster_role_binding, role), (self.rbac.delete_cluster_role, role),
                        (self.core.delete_namespace, self.ns)):  # fmt: skip
            with contextlib.suppress(k8s.ApiException):
                await fn(arg)
        for name in self.nodes.values():
            with contextlib.suppress(k8s.ApiException):
                await self.core.delete_node(name)


@pytest.fixture
async def world(admin: Any, tmp_path: Path) -> AsyncIterator[World]:
    w = World(admin, uuid.uuid4().hex[:6], tmp_path)
    await w.setup()
    yield w
    await w.teardown()


async def _sar(admin: Any, user: str, node: str) -> bool:
    review = await k8s.AuthorizationV1Api(admin).create_subject_access_review({
        "spec": {"user": user, "resourceAttributes": {"verb": "create", "resource": "nodes",
                                                       "subresource": "checkpoint", "name": node}}})  # fmt: skip
    return bool(review.status.allowed)


async def _raw_csr(api: Any, name: str, pem: bytes, signer: str, usages: list[str]) -> None:
    await k8s.CertificatesV1Api(api).create_certificate_signing_request({
        "metadata": {"name": name},
        "spec": {"signerName": signer, "request": base64.b64encode(pem).decode(), "usages": usages,
                 "expirationSeconds": 3600}})  # fmt: skip


async def _condition(admin: Any, name: str) -> tuple[str, str]:
    for _ in range(100):
        csr = await k8s.CertificatesV1Api(admin).read_certificate_signing_request(name)
        for c in csr.status.conditions or []:
            if c.type in ("Approved", "Denied"):
                return c.type, c.message or ""
        await asyncio.sleep(0.2)
    raise AssertionError(f"CSR {name} never decided")


async def test_identity_each_agent_gets_its_nodes_certificates_and_nothing_more(world: World) -> None:
    kubeconfig = require_kubeconfig()
    ca_crt, ca_key = _ca(world.tmp / "ca")
    cfg = IssuerConfig(ca_cert_file=str(ca_crt), ca_key_file=str(ca_key), agent_namespace=world.ns,
                       max_expiration_seconds=3600, poll_seconds=0.3, role_grace_seconds=3.0)  # fmt: skip
    issuer = Issuer(world.admin, cfg)
    stop = asyncio.Event()
    task = asyncio.create_task(issuer.run(stop))
    _, token_a = await world.agent_pod("a")
    api_a = await _token_client(kubeconfig, token_a)
    try:
        d = world.tmp / "a"
        agent_req = Requester(api_a, node=world.nodes["a"], signer=AGENT_SIGNER,
                              usages=("digital signature", "server auth", "client auth"), ips=(world.ips["a"],),
                              cert_file=d / "tls.crt", key_file=d / "tls.key", expiration_seconds=3600,
                              timeout_seconds=60)  # fmt: skip
        kubelet_req = Requester(api_a, node=world.nodes["a"], signer=KUBELET_SIGNER,
                                usages=("digital signature", "client auth"), ips=(),
                                cert_file=d / "kubelet.crt", key_file=d / "kubelet.key", expiration_seconds=3600,
                                timeout_seconds=60)  # fmt: skip
        await agent_req.obtain()
        await kubelet_req.obtain()

        # the agents' certificate: CN qos-agent:<node A>, only A's IP, signed by the agents' CA, a day at most
        cert = x509.load_pem_x509_certificate((d / "tls.crt").read_bytes())
        ca = x509.load_pem_x509_certificate(ca_crt.read_bytes())
        cert.verify_directly_issued_by(ca)
        assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == f"qos-agent:{world.nodes['a']}"
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        assert [str(ip) for ip in sans.get_values_for_type(x509.IPAddress)] == [world.ips["a"]]
        life = cert.not_valid_after_utc - cert.not_valid_before_utc
        assert life <= dt.timedelta(seconds=3600 + 60)
        assert not agent_req.needs_renewal(dt.datetime.now(dt.UTC))
        # the kubelet credential: signed by kube-controller-manager (the cluster CA), user qos-agent:<A>, no group
        kcert = x509.load_pem_x509_certificate((d / "kubelet.crt").read_bytes())
        assert kcert.subject.rfc4514_string() == f"CN=qos-agent:{world.nodes['a']}"
        assert kcert.issuer != ca.subject

        # the real authorizer: node A's credential may checkpoint on A, not on B
        assert await _sar(world.admin, f"qos-agent:{world.nodes['a']}", world.nodes["a"])
        assert not await _sar(world.admin, f"qos-agent:{world.nodes['a']}", world.nodes["b"])
        roles = await world.rbac.list_cluster_role(label_selector=f"{NODE_LABEL}={world.nodes['a']}")
        assert len(roles.items) == 1

        # A's token asking for B's identity, for an IP that is not A's, for a group, or from a pod that is not an
        # agent's: denied, with the reason on the CSR
        _, csr_b = make_csr(world.nodes["b"], [world.ips["b"]])
        _, csr_ip = make_csr(world.nodes["a"], ["10.77.9.9"])
        from cryptography.hazmat.primitives import hashes
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.hazmat.primitives.serialization import Encoding

        k = ec.generate_private_key(ec.SECP256R1())
        grouped = (
            x509.CertificateSigningRequestBuilder()
            .subject_name(
                x509.Name(
                    [
                        x509.NameAttribute(NameOID.ORGANIZATION_NAME, "system:nodes"),
                        x509.NameAttribute(NameOID.COMMON_NAME, f"qos-agent:{world.nodes['a']}"),
                    ]
                )
            )
            .sign(k, hashes.SHA256())
            .public_bytes(Encoding.PEM)
        )
        bad = [
            ("other-node", csr_b, AGENT_SIGNER, ["digital signature", "server auth", "client auth"],
             f"subject must be exactly CN=qos-agent:{world.nodes['a']}"),
            ("other-ip", csr_ip, AGENT_SIGNER, ["digital signature", "server auth", "client auth"],
             "must be among node"),
            ("group", grouped, KUBELET_SIGNER, ["digital signature", "client auth"], "subject must be exactly"),
            ("usage", csr_ip, KUBELET_SIGNER, ["digital signature", "server auth"], "usages"),
        ]  # fmt: skip
        for tag, pem, signer, usages, why in bad:
            name = f"qos-ident-{world.run}-{tag}"
            await _raw_csr(api_a, name, pem, signer, usages)
            kind, message = await _condition(world.admin, name)
            assert kind == "Denied" and why in message, (tag, kind, message)
            await k8s.CertificatesV1Api(world.admin).delete_certificate_signing_request(name)
        # a pod of the agents' ServiceAccount that is not an agent pod (no DaemonSet labels)
        _, token_x = await world.agent_pod("b", labels={"app": "impostor"})
        api_x = await _token_client(kubeconfig, token_x)
        try:
            _, csr_x = make_csr(world.nodes["b"], [world.ips["b"]])
            name = f"qos-ident-{world.run}-impostor"
            await _raw_csr(api_x, name, csr_x, AGENT_SIGNER, ["digital signature", "server auth", "client auth"])
            kind, message = await _condition(world.admin, name)
            assert kind == "Denied" and "is not an agent pod" in message, message
            await k8s.CertificatesV1Api(world.admin).delete_certificate_signing_request(name)
        finally:
            await api_x.close()
        assert not await _sar(world.admin, f"qos-agent:{world.nodes['b']}", world.nodes["b"]), "B got no role"

        # the node goes and its kubelet registers it again within the grace: the role stays (its agent pod, never
        # asked to enrol again, keeps its right to checkpoint)
        node_a = await world.core.read_node(world.nodes["a"])
        await world.core.delete_node(world.nodes["a"])
        await asyncio.sleep(1.5)  # a few issuer passes see it gone
        await world.core.create_node({"metadata": {"name": world.nodes["a"], "labels": node_a.metadata.labels}})
        await asyncio.sleep(3.0)  # past the grace counted from when it went
        assert await _sar(world.admin, f"qos-agent:{world.nodes['a']}", world.nodes["a"]), "a re-registered node's role"
        # the node goes for longer than the grace: its role goes with it
        await world.core.delete_node(world.nodes["a"])
        for _ in range(50):
            roles = await world.rbac.list_cluster_role(label_selector=f"{NODE_LABEL}={world.nodes['a']}")
            if not roles.items:
                break
            await asyncio.sleep(0.2)
        assert not roles.items, "the role of a deleted node is removed"
        assert not await _sar(world.admin, f"qos-agent:{world.nodes['a']}", world.nodes["a"])
    finally:
        stop.set()
        await task
        await api_a.close()
        for csr in (await k8s.CertificatesV1Api(world.admin).list_certificate_signing_request()).items:
            if csr.metadata.name.startswith(("qos-agent-qos-ident-", f"qos-ident-{world.run}")):
                await k8s.CertificatesV1Api(world.admin).delete_certificate_signing_request(csr.metadata.name)
