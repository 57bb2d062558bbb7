"""The certificate keeper against a real kube-apiserver (hack/local-up.sh; issue 31): a first pass makes the
authority, the leaves, the webhook's caBundle and the trust ConfigMap; a second writes nothing; a Secret we did
not make is left alone and evented; leaves are renewed at a third of their life left; the authority rotates with
an overlap in which old and new leaves both verify; a damaged leaf is reissued. Time moves by the keeper's clock
(certificates are made at that time; the API server does not care), so a year of rotation takes seconds.
FAILS without KUBECONFIG."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import datetime as dt
import uuid
from typing import Any

import pytest
from cryptography import x509
from kubernetes_asyncio import client as k8s

from extender.certs.keeper import MANAGED_BY, Keeper, Outcome
from extender.certs.settings import CertsConfig
from extender.kube.client import ApiError, new_api_client, read_json
from extender.settings import load_settings
from extender.settings.sections import KubernetesConfig
from tests.live import require_kubeconfig

pytestmark = [pytest.mark.live]


class Clock:
    def __init__(self) -> None:
        self.now = dt.datetime.now(dt.UTC)

    def __call__(self) -> dt.datetime:
        return self.now


def _config(ns: str, hook: str) -> CertsConfig:
    raw = {
        "authorities": [
            {"name": "qos", "namespace": ns, "secret": "ca", "common_name": "test-ca", "lifetime_hours": 10}
        ],
        "certificates": [
            {"namespace": ns, "secret": "serving", "authority": "qos", "common_name": "kube-qos-extender",
             "services": [f"qos-extender.{ns}"], "ip_addresses": ["127.0.0.1"]},
            {"namespace": ns, "secret": "client", "authority": "qos", "common_name": "prometheus-extender-client",
             "usages": ["client"]},
            {"namespace": ns, "secret": "users-own", "authority": "qos", "common_name": "x"},
        ],
        "webhooks": [{"name": hook, "ca_from": f"{ns}/serving"}],
        "trust_configmaps": [{"namespace": ns, "name": "trust", "authorities": {"qos.crt": "qos"},
                              "cluster_ca_key": "cluster.crt"}],
        "leaf_lifetime_hours": 1,
    }  # fmt: skip
    return load_settings(CertsConfig, raw, "test")


def _by_key(outcomes: list[Outcome]) -> dict[str, str]:
    return {o.key: o.action for o in outcomes}


async def test_keeper_makes_renews_rotates_and_never_takes_a_users_secret() -> None:
    kubeconfig = require_kubeconfig()
    ns = f"certs-{uuid.uuid4().hex[:6]}"
    hook = f"qos-certs-test-{ns}"
    api = await new_api_client(KubernetesConfig(kubeconfig=kubeconfig))
    core = k8s.CoreV1Api(api)
    adm = k8s.AdmissionregistrationV1Api(api)

    async def secret(name: str) -> dict[str, Any]:
        return dict(await read_json(await core.read_namespaced_secret(name, ns, _preload_content=False)))

    def cert(s: dict[str, Any], key: str = "tls.crt") -> list[x509.Certificate]:
        return x509.load_pem_x509_certificates(base64.b64decode(s["data"][key]))

    try:
        await read_json(await core.create_namespace({"metadata": {"name": ns}}, _preload_content=False))
        # the user's own Secret under a wanted name, made before the keeper runs
        users = {"metadata": {"name": "users-own"}, "type": "Opaque", "data": {"k": base64.b64encode(b"v").decode()}}
        await read_json(await core.create_namespaced_secret(ns, users, _preload_content=False))
        webhook = {
            "metadata": {"name": hook},
            "webhooks": [{
                "name": "test.certs.kube-qos-extender.io", "admissionReviewVersions": ["v1"], "sideEffects": "None",
                "failurePolicy": "Ignore",
                "clientConfig": {"service": {"namespace": ns, "name": "qos-extender", "path": "/x", "port": 8443}},
                "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"]}],
                # matches no object at all: this test's webhook must never be called
                "objectSelector": {"matchLabels": {"qos-certs-test": ns}},
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": f"{ns}-none"}},
            }],
        }  # fmt: skip
        await read_json(await adm.create_mutating_webhook_configuration(webhook, _preload_content=False))

        # kube-controller-manager publishes kube-root-ca.crt into a new namespace on its own time (CI saw it
        # late on a loaded machine): until then the keeper rightly answers "waiting" for the trust ConfigMap
        for _ in range(600):
            with contextlib.suppress(ApiError):
                await read_json(await core.read_namespaced_config_map("kube-root-ca.crt", ns, _preload_content=False))
                break
            await asyncio.sleep(0.1)
        clock = Clock()
        keeper = Keeper(api, _config(ns, hook), clock=clock)
        first = _by_key(await keeper.run_once())
        assert first == {
            f"{ns}/ca": "create", f"{ns}/serving": "issue", f"{ns}/client": "issue", f"{ns}/users-own": "foreign",
            hook: "inject", f"{ns}/trust": "write",
        }, first  # fmt: skip
        ca_secret, serving = await secret("ca"), await secret("serving")
        (ca,) = cert(ca_secret)
        assert serving["type"] == "kubernetes.io/tls"
        assert all(serving["metadata"]["labels"].get(k) == v for k, v in MANAGED_BY.items())
        cert(serving)[0].verify_directly_issued_by(ca)
        assert serving["data"]["ca.crt"] == ca_secret["data"]["ca.crt"]
        # the user's Secret: untouched, and told so
        assert (await secret("users-own"))["data"] == users["data"]
        events = await read_json(await core.list_namespaced_event(ns, _preload_content=False))
        assert any(
            e["reason"] == "QosCertificateNotOurs" and e["involvedObject"]["name"] == "users-own"
            for e in events["items"]
        )
        # the webhook's caBundle is the serving Secret's ca.crt; the trust ConfigMap has the cluster CA too
        live_hook = await read_json(await adm.read_mutating_webhook_configuration(hook, _preload_content=False))
        assert live_hook["webhooks"][0]["clientConfig"]["caBundle"] == serving["data"]["ca.crt"]
        trust = await read_json(await core.read_namespaced_config_map("trust", ns, _preload_content=False))
        root = await read_json(await core.read_namespaced_config_map("kube-root-ca.crt", ns, _preload_content=False))
        assert trust["data"] == {
            "qos.crt": base64.b64decode(ca_secret["data"]["ca.crt"]).decode(),
            "cluster.crt": root["data"]["ca.crt"],
        }

        # a second pass writes nothing
        versions = {n: (await secret(n))["metadata"]["resourceVersion"] for n in ("ca", "serving", "client")}
        again = _by_key(await keeper.run_once())
        assert set(again.values()) == {"keep", "foreign"}, again
        assert versions == {n: (await secret(n))["metadata"]["resourceVersion"] for n in versions}

        # 45 min into a 1 h life: renewed (new key), same authority
        clock.now += dt.timedelta(minutes=45)
        renewed = _by_key(await keeper.run_once())
        assert renewed[f"{ns}/serving"] == "reissue" and renewed[f"{ns}/ca"] == "keep", renewed
        assert cert(await secret("serving"))[0].serial_number != cert(serving)[0].serial_number
        old_leaf = cert(await secret("serving"))[0]

        # 7 h into a 10 h authority: a successor, the bundle holds both, the leaves move to it, and a leaf of the
        # old authority still verifies against the bundle every verifier now has (the overlap)
        clock.now += dt.timedelta(hours=6, minutes=15)
        rotated = _by_key(await keeper.run_once())
        assert rotated[f"{ns}/ca"] == "rotate" and rotated[f"{ns}/serving"] == "reissue", rotated
        ca2 = cert(await secret("ca"))[0]
        bundle = cert(await secret("serving"), "ca.crt")
        assert bundle[0] == ca2 and ca in bundle and len(bundle) == 2
        cert(await secret("serving"))[0].verify_directly_issued_by(ca2)
        old_leaf.verify_directly_issued_by(bundle[1])
        live_hook = await read_json(await adm.read_mutating_webhook_configuration(hook, _preload_content=False))
        assert live_hook["webhooks"][0]["clientConfig"]["caBundle"] == (await secret("serving"))["data"]["ca.crt"]

        # once the old authority has expired, the bundle drops it
        clock.now += dt.timedelta(hours=3, minutes=30)
        await keeper.run_once()
        assert cert(await secret("serving"), "ca.crt") == [ca2]

        # a damaged leaf of ours is reissued, not served
        s = await secret("client")
        s["data"]["tls.crt"] = base64.b64encode(b"garbage").decode()
        await read_json(await core.replace_namespaced_secret("client", ns, s, _preload_content=False))
        assert _by_key(await keeper.run_once())[f"{ns}/client"] == "reissue"
        cert(await secret("client"))[0].verify_directly_issued_by(ca2)
    finally:
        for fn, args in (
            (adm.delete_mutating_webhook_configuration, (hook,)),
            (core.delete_namespace, (ns,)),
        ):
            with contextlib.suppress(ApiError):
                await read_json(await fn(*args, _preload_content=False))
        await api.close()
