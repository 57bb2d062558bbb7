"""The keeper's passes: read the authorities, leaves, webhooks and trust ConfigMaps, ask extender.core.certs what
to do, write only what must change.

Safe with more than one keeper and across restarts: an object is created with create (409: someone else was
first; the next pass reads theirs) and changed with a replace carrying the resourceVersion it read (409: it moved
meanwhile; the next pass decides again), so two keepers never leave a leaf signed by an authority that lost.
Every Secret and ConfigMap it writes carries ``MANAGED_BY``; one of a wanted name without it is the user's and
is never written (a Warning Event on it and a log line say so, once per process).
"""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, cast

from cryptography import x509
from cryptography.hazmat.primitives import serialization

from extender import pki
from extender.certs.settings import AuthoritySettings, CertificateSettings, CertsConfig, TrustConfigMap, WebhookSettings
from extender.core.certs import LeafAction, LeafSpec, authority_decision, leaf_action, trust_bundle
from extender.kube.client import ApiError, read_json
from extender.signals import every

__all__ = ["MANAGED_BY", "Authority", "Keeper", "Outcome"]

log = logging.getLogger("extender.certs")

MANAGED_BY = {"app.kubernetes.io/managed-by": "qos-certs"}
PART_OF = {"app.kubernetes.io/part-of": "kube-qos-extender"}
AUTHORITY_ANNOTATION = "qos.kube-qos-extender.io/authority"


@dataclass(frozen=True)
class Authority:
    """An authority as this pass uses it: what signs, and the bundle every verifier gets."""

    name: str
    cert: x509.Certificate
    key: Any  # None for an authority whose Secret is the user's and has no key we may use
    bundle: tuple[x509.Certificate, ...]  # newest first, current included

    @property
    def bundle_pem(self) -> bytes:
        return b"".join(pki.pem_of(c) for c in self.bundle)

    @property
    def fingerprint(self) -> str:
        return pki.fingerprint(self.cert)


@dataclass(frozen=True)
class Outcome:
    """What a pass did with one object (tests and logs read these)."""

    kind: str  # Authority, Secret, Webhook, ConfigMap
    key: str
    action: str
    why: str


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _data(obj: Mapping[str, Any] | None, key: str) -> bytes:
    raw = ((obj or {}).get("data") or {}).get(key)
    if not raw:
        return b""
    try:
        return base64.b64decode(raw)
    except ValueError:
        return b""


def _ours(obj: Mapping[str, Any]) -> bool:
    labels = (obj.get("metadata") or {}).get("labels") or {}
    return all(labels.get(k) == v for k, v in MANAGED_BY.items())


def service_names(services: tuple[str, ...], cluster_domain: str) -> tuple[str, ...]:
    out: list[str] = []
    for s in services:
        name, ns = s.split(".")
        out += [name, f"{name}.{ns}", f"{name}.{ns}.svc", f"{name}.{ns}.svc.{cluster_domain}"]
    return tuple(out)


class Keeper:
    def __init__(
        self, api: Any, config: CertsConfig, clock: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC)
    ) -> None:
        from kubernetes_asyncio import client as k8s

        self.config = config
        self.core = k8s.CoreV1Api(api)
        self.admission = k8s.AdmissionregistrationV1Api(api)
        self.clock = clock
        self._reported: set[tuple[str, str]] = set()  # (key, why) already evented: once per process

    # ------------------------------------------------------------------ API helpers (raw JSON)
    async def _call(self, fn: Any, *args: Any) -> dict[str, Any] | None:
        """The call's JSON body; None on 404."""
        try:
            return cast(
                dict[str, Any],
                await read_json(
                    await fn(*args, _preload_content=False, _request_timeout=self.config.request_timeout_seconds)
                ),
            )
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise

    async def _write_secret(self, live: dict[str, Any] | None, ns: str, name: str, body: dict[str, Any]) -> bool:
        """Create (live None) or replace at live's resourceVersion; False when someone else moved first (409)."""
        body["metadata"] = {
            "name": name,
            "namespace": ns,
            "labels": {**MANAGED_BY, **PART_OF},
            "annotations": body.get("metadata", {}).get("annotations", {}),
        }
        try:
            if live is None:
                await self._call(self.core.create_namespaced_secret, ns, body)
            else:
                body["metadata"]["resourceVersion"] = live["metadata"]["resourceVersion"]
                await self._call(self.core.replace_namespaced_secret, name, ns, body)
        except ApiError as exc:
            if exc.status == 409:
                return False
            raise
        return True

    async def _event(self, ns: str, kind: str, name: str, reason: str, message: str, warning: bool) -> None:
        if not self.config.events:
            return
        now = self.clock().strftime("%Y-%m-%dT%H:%M:%SZ")
        body = {
            "metadata": {"generateName": f"{name}.", "namespace": ns},
            "involvedObject": {"apiVersion": "v1", "kind": kind, "namespace": ns, "name": name},
            "reason": reason,
            "message": message[:1000],
            "type": "Warning" if warning else "Normal",
            "source": {"component": "qos-certs"},
            "reportingComponent": "qos-certs",
            "reportingInstance": "qos-certs",
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        try:
            await self._call(self.core.create_namespaced_event, ns, body)
        except ApiError as exc:  # an Event is a courtesy: never the reason a pass fails
            log.warning("event not written", extra={"decision": reason, "error": str(exc)})

    async def _foreign(self, ns: str, kind: str, name: str, why: str) -> None:
        if (f"{ns}/{name}", why) in self._reported:
            return
        self._reported.add((f"{ns}/{name}", why))
        log.warning("not ours: left alone", extra={"decision": {"object": f"{kind} {ns}/{name}", "why": why}})
        await self._event(ns, kind, name, "QosCertificateNotOurs", why, warning=True)

    # ------------------------------------------------------------------ authorities
    async def _authority(self, spec: AuthoritySettings, now: dt.datetime, out: list[Outcome]) -> Authority | None:
        live = await self._call(self.core.read_namespaced_secret, spec.secret, spec.namespace)
        key = f"{spec.namespace}/{spec.secret}"
        if live is not None and not _ours(live):
            # The user's own CA: used to sign (when its key is there), never rotated or rewritten.
            certs = pki.load_bundle(_data(live, "tls.crt"))
            try:
                ca_key = serialization.load_pem_private_key(_data(live, "tls.key"), password=None)
            except (ValueError, TypeError):
                ca_key = None
            if not certs or ca_key is None:
                why = f"Secret {key} is not ours and has no readable tls.crt + tls.key: its leaves are not issued"
                await self._foreign(spec.namespace, "Secret", spec.secret, why)
                out.append(Outcome("Authority", key, "foreign", why))
                return None
            bundle = tuple(pki.load_bundle(_data(live, "ca.crt"))) or (certs[0],)
            out.append(Outcome("Authority", key, "foreign", "the user's authority: used as it is"))
            return Authority(spec.name, certs[0], ca_key, bundle)
        current = pki.load_bundle(_data(live, "tls.crt"))
        try:
            ca_key = serialization.load_pem_private_key(_data(live, "tls.key"), password=None) if current else None
        except (ValueError, TypeError):
            ca_key = None
        facts = pki.facts(pki.pem_of(current[0])) if current and ca_key is not None else None
        previous = [c for c in pki.load_bundle(_data(live, "ca.crt")) if current and c != current[0]]
        decision = authority_decision(facts, now, self.config.renew_fraction)
        if decision.action == "keep" and facts is not None:
            assert current
            cert = current[0]
        else:
            if decision.action == "rotate" and current:
                previous = [current[0], *previous]
            cert_pem, key_pem = pki.new_authority(spec.common_name, now=now, hours=spec.lifetime_hours)
            cert = x509.load_pem_x509_certificate(cert_pem)
            ca_key = serialization.load_pem_private_key(key_pem, password=None)
        prev_facts = [f for f in (pki.facts(pki.pem_of(p)) for p in previous) if f is not None]
        cur_facts = pki.facts(pki.pem_of(cert))
        assert cur_facts is not None  # made or read just above
        keep = set(trust_bundle(cur_facts, prev_facts, now))
        bundle = (cert, *(p for p in previous if pki.fingerprint(p) in keep))
        state = Authority(spec.name, cert, ca_key, bundle)
        if decision.action == "keep" and _data(live, "ca.crt") == state.bundle_pem:
            out.append(Outcome("Authority", key, "keep", decision.why))
            return state
        key_pem_out = cast(Any, ca_key).private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
        body = {
            "type": "Opaque",
            "metadata": {"annotations": {AUTHORITY_ANNOTATION: spec.name}},
            "data": {"tls.crt": _b64(pki.pem_of(cert)), "tls.key": _b64(key_pem_out), "ca.crt": _b64(state.bundle_pem)},
        }
        action = decision.action if decision.action != "keep" else "update-bundle"
        if not await self._write_secret(live, spec.namespace, spec.secret, body):
            out.append(Outcome("Authority", key, "conflict", "changed meanwhile: decided again next pass"))
            return None
        log.info("authority written", extra={"decision": {"authority": key, "action": action, "why": decision.why}})
        if action != "update-bundle":
            await self._event(
                spec.namespace, "Secret", spec.secret, f"QosCertificateAuthority{action.title()}", decision.why, False
            )
        out.append(Outcome("Authority", key, action, decision.why))
        return state

    # ------------------------------------------------------------------ leaves
    def _spec(self, c: CertificateSettings) -> LeafSpec:
        return LeafSpec(
            namespace=c.namespace,
            secret=c.secret,
            authority=c.authority,
            common_name=c.common_name,
            organizations=c.organizations,
            dns_names=(*service_names(c.services, self.config.cluster_domain), *c.dns_names),
            ip_addresses=c.ip_addresses,
            usages=frozenset(c.usages),
        )

    async def _leaf(self, c: CertificateSettings, auth: Authority, now: dt.datetime, out: list[Outcome]) -> None:
        spec = self._spec(c)
        live = await self._call(self.core.read_namespaced_secret, c.secret, c.namespace)
        ours = live is not None and _ours(live)
        facts = pki.facts(_data(live, "tls.crt"), _data(live, "tls.key"), auth.bundle) if ours else None
        action, why = leaf_action(
            spec,
            exists=live is not None,
            ours=ours,
            cert=facts,
            bundle_current=_data(live, "ca.crt") == auth.bundle_pem,
            authority_fingerprint=auth.fingerprint,
            now=now,
            renew_fraction=self.config.renew_fraction,
        )
        if action is LeafAction.KEEP:
            out.append(Outcome("Secret", c.key, action.value, why))
            return
        if action is LeafAction.FOREIGN:
            await self._foreign(c.namespace, "Secret", c.secret, why)
            out.append(Outcome("Secret", c.key, action.value, why))
            return
        assert live is None or ours
        if action is LeafAction.UPDATE_BUNDLE:
            assert live is not None
            data = {**(live.get("data") or {}), "ca.crt": _b64(auth.bundle_pem)}
        else:
            cert_pem, key_pem = pki.issue_leaf(
                common_name=spec.common_name,
                organizations=spec.organizations,
                dns_names=spec.dns_names,
                ip_addresses=spec.ip_addresses,
                usages=spec.usages,
                ca_cert=auth.cert,
                ca_key=auth.key,
                now=now,
                hours=self.config.leaf_lifetime_hours,
            )
            data = {"tls.crt": _b64(cert_pem), "tls.key": _b64(key_pem), "ca.crt": _b64(auth.bundle_pem)}
        body = {
            "type": "kubernetes.io/tls",
            "metadata": {"annotations": {AUTHORITY_ANNOTATION: auth.name}},
            "data": data,
        }
        if not await self._write_secret(live, c.namespace, c.secret, body):
            out.append(Outcome("Secret", c.key, "conflict", "changed meanwhile: decided again next pass"))
            return
        log.info("certificate written", extra={"decision": {"secret": c.key, "action": action.value, "why": why}})
        if action is not LeafAction.UPDATE_BUNDLE:
            reason = "QosCertificateIssued" if action is LeafAction.ISSUE else "QosCertificateRenewed"
            await self._event(c.namespace, "Secret", c.secret, reason, why, False)
        out.append(Outcome("Secret", c.key, action.value, why))

    # ------------------------------------------------------------------ webhooks and trust ConfigMaps
    async def _webhook(self, w: WebhookSettings, out: list[Outcome]) -> None:
        live = await self._call(self.admission.read_mutating_webhook_configuration, w.name)
        if live is None:
            out.append(Outcome("Webhook", w.name, "absent", "no such configuration (that part is not installed)"))
            return
        ns, name = w.ca_from.split("/")
        source = await self._call(self.core.read_namespaced_secret, name, ns)
        bundle = _data(source, "ca.crt")
        if not bundle:
            out.append(Outcome("Webhook", w.name, "waiting", f"no ca.crt in Secret {w.ca_from} yet"))
            return
        want = _b64(bundle)
        changed = False
        for hook in live.get("webhooks") or []:
            cc = hook.setdefault("clientConfig", {})
            if "service" in cc and cc.get("caBundle") != want:
                cc["caBundle"] = want
                changed = True
        if not changed:
            out.append(Outcome("Webhook", w.name, "keep", f"caBundle is Secret {w.ca_from}'s ca.crt"))
            return
        try:
            await self._call(self.admission.replace_mutating_webhook_configuration, w.name, live)
        except ApiError as exc:
            if exc.status == 409:
                out.append(Outcome("Webhook", w.name, "conflict", "changed meanwhile: injected next pass"))
                return
            raise
        log.info("caBundle injected", extra={"decision": {"webhook": w.name, "from": w.ca_from}})
        out.append(Outcome("Webhook", w.name, "inject", f"caBundle set from Secret {w.ca_from}"))

    async def _trust(self, cm: TrustConfigMap, auths: Mapping[str, Authority | None], out: list[Outcome]) -> None:
        key = f"{cm.namespace}/{cm.name}"
        data: dict[str, str] = {}
        for k, name in cm.authorities.items():
            auth = auths.get(name)
            if auth is None:
                out.append(Outcome("ConfigMap", key, "waiting", f"authority {name} not available this pass"))
                return
            data[k] = auth.bundle_pem.decode()
        if cm.cluster_ca_key:
            root = await self._call(self.core.read_namespaced_config_map, "kube-root-ca.crt", cm.namespace)
            ca = ((root or {}).get("data") or {}).get("ca.crt")
            if not ca:
                out.append(Outcome("ConfigMap", key, "waiting", f"no kube-root-ca.crt in {cm.namespace} yet"))
                return
            data[cm.cluster_ca_key] = ca
        live = await self._call(self.core.read_namespaced_config_map, cm.name, cm.namespace)
        if live is not None and not _ours(live):
            why = f"ConfigMap {key} exists without our managed-by label: left as it is"
            await self._foreign(cm.namespace, "ConfigMap", cm.name, why)
            out.append(Outcome("ConfigMap", key, "foreign", why))
            return
        if live is not None and (live.get("data") or {}) == data:
            out.append(Outcome("ConfigMap", key, "keep", "current"))
            return
        body: dict[str, Any] = {
            "metadata": {"name": cm.name, "namespace": cm.namespace, "labels": {**MANAGED_BY, **PART_OF}},
            "data": data,
        }
        try:
            if live is None:
                await self._call(self.core.create_namespaced_config_map, cm.namespace, body)
            else:
                body["metadata"]["resourceVersion"] = live["metadata"]["resourceVersion"]
                await self._call(self.core.replace_namespaced_config_map, cm.name, cm.namespace, body)
        except ApiError as exc:
            if exc.status == 409:
                out.append(Outcome("ConfigMap", key, "conflict", "changed meanwhile: written next pass"))
                return
            raise
        out.append(Outcome("ConfigMap", key, "write", "trust bundle published"))

    # ------------------------------------------------------------------ passes
    async def run_once(self) -> list[Outcome]:
        """One pass over everything configured. A failure on one object is logged and counted in the outcome
        ("error"), and the others still go (a Secret the keeper may not read must not stop the webhook's
        caBundle)."""
        now = self.clock()
        out: list[Outcome] = []
        auths: dict[str, Authority | None] = {}
        for a in self.config.authorities:
            try:
                auths[a.name] = await self._authority(a, now, out)
            except Exception as exc:
                auths[a.name] = None
                out.append(Outcome("Authority", f"{a.namespace}/{a.secret}", "error", str(exc)))
        for c in self.config.certificates:
            auth = auths.get(c.authority)
            if auth is None or auth.key is None:
                out.append(Outcome("Secret", c.key, "waiting", f"authority {c.authority} not available this pass"))
                continue
            try:
                await self._leaf(c, auth, now, out)
            except Exception as exc:
                out.append(Outcome("Secret", c.key, "error", str(exc)))
        for w in self.config.webhooks:
            try:
                await self._webhook(w, out)
            except Exception as exc:
                out.append(Outcome("Webhook", w.name, "error", str(exc)))
        for cm in self.config.trust_configmaps:
            try:
                await self._trust(cm, auths, out)
            except Exception as exc:
                out.append(Outcome("ConfigMap", f"{cm.namespace}/{cm.name}", "error", str(exc)))
        for o in out:
            if o.action == "error":
                log.warning("certificate pass step failed", extra={"decision": {"object": o.key, "error": o.why}})
        return out

    async def run(self, stop: asyncio.Event) -> None:
        await every(self.config.poll_seconds, self.run_once, stop, log=log, failed="certificate pass failed")
