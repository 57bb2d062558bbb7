"""The certificate keeper's decisions (extender.core.certs), its PKI (extender.certs.pki) and its settings, without
a cluster: when a leaf is renewed, when an authority rotates and what the trust bundle holds, that a Secret we did
not make is never ours, and that the certificates made verify with Python's own TLS stack."""

from __future__ import annotations

import asyncio
import datetime as dt
import ssl
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from hypothesis import given
from hypothesis import strategies as st

from extender import pki
from extender.certs.keeper import service_names
from extender.certs.settings import CertsConfig
from extender.cli import main
from extender.core.certs import CertFacts, LeafAction, LeafSpec, authority_decision, leaf_action, trust_bundle
from extender.settings import SettingsError, load_settings

T0 = dt.datetime(2026, 11, 26, 12, 0, tzinfo=dt.UTC)
SPEC = LeafSpec("ns", "tls", "qos", "kube-qos-extender", dns_names=("svc.ns.svc",), ip_addresses=("127.0.0.1",))


def _facts(**kw: object) -> CertFacts:
    base: dict[str, object] = {
        "fingerprint": "leaf",
        "not_before": T0,
        "not_after": T0 + dt.timedelta(hours=90),
        "common_name": SPEC.common_name,
        "dns_names": SPEC.dns_names,
        "ip_addresses": SPEC.ip_addresses,
        "usages": SPEC.usages,
        "issuer_fingerprint": "ca",
    }
    base.update(kw)
    return CertFacts(**base)  # type: ignore[arg-type]


def _act(cert: CertFacts | None, *, now: dt.datetime = T0, exists: bool = True, ours: bool = True,
         bundle: bool = True) -> tuple[LeafAction, str]:  # fmt: skip
    return leaf_action(SPEC, exists=exists, ours=ours, cert=cert, bundle_current=bundle, authority_fingerprint="ca",
                       now=now, renew_fraction=1 / 3)  # fmt: skip


def test_leaf_actions() -> None:
    assert _act(None, exists=False)[0] is LeafAction.ISSUE
    # never ours: even an expired, wrongly signed certificate in a Secret without our label stays as it is
    assert _act(_facts(issuer_fingerprint="other"), ours=False, now=T0 + dt.timedelta(days=9))[0] is LeafAction.FOREIGN
    assert _act(None)[0] is LeafAction.REISSUE
    assert _act(_facts())[0] is LeafAction.KEEP
    assert _act(_facts(), bundle=False)[0] is LeafAction.UPDATE_BUNDLE
    assert _act(_facts(key_matches=False))[0] is LeafAction.REISSUE
    assert _act(_facts(issuer_fingerprint="old-ca"))[0] is LeafAction.REISSUE
    assert _act(_facts(common_name="x"))[0] is LeafAction.REISSUE
    assert _act(_facts(dns_names=("other",)))[0] is LeafAction.REISSUE
    assert _act(_facts(usages=frozenset({"client"})))[0] is LeafAction.REISSUE
    # the SAN order does not matter
    assert _act(_facts(dns_names=tuple(reversed(SPEC.dns_names))))[0] is LeafAction.KEEP


@given(st.floats(min_value=0, max_value=200))
def test_leaf_renewed_exactly_below_a_third_of_its_life(hours: float) -> None:
    now = T0 + dt.timedelta(hours=hours)
    action, why = _act(_facts(), now=now)
    left = max(0.0, (90 - hours) / 90)
    assert (action is LeafAction.REISSUE) == (left < 1 / 3), (hours, action, why)


def test_authority_create_keep_rotate() -> None:
    ca = _facts(not_after=T0 + dt.timedelta(hours=30))
    assert authority_decision(None, T0, 1 / 3).action == "create"
    assert authority_decision(ca, T0 + dt.timedelta(hours=19), 1 / 3).action == "keep"
    assert authority_decision(ca, T0 + dt.timedelta(hours=21), 1 / 3).action == "rotate"
    assert authority_decision(ca, T0 + dt.timedelta(hours=31), 1 / 3).action == "rotate"


def test_trust_bundle_keeps_unexpired_predecessors_only() -> None:
    cur = _facts(fingerprint="new")
    old = _facts(fingerprint="old", not_after=T0 + dt.timedelta(hours=1))
    older = _facts(fingerprint="older", not_after=T0 - dt.timedelta(hours=1))
    assert trust_bundle(cur, [old, older, cur], T0) == ("new", "old")
    assert trust_bundle(cur, [old], T0 + dt.timedelta(hours=2)) == ("new",)


def test_pki_facts_round_trip() -> None:
    ca_pem, ca_key_pem = pki.new_authority("test-ca", now=T0, hours=100)
    ca = x509.load_pem_x509_certificate(ca_pem)
    ca_key = serialization.load_pem_private_key(ca_key_pem, password=None)
    cert_pem, key_pem = pki.issue_leaf(common_name="c", organizations=("o",), dns_names=("a.b",),
                                       ip_addresses=("127.0.0.1",), usages={"server", "client"}, ca_cert=ca,
                                       ca_key=ca_key, now=T0, hours=1000)  # fmt: skip
    f = pki.facts(cert_pem, key_pem, [ca])
    assert f is not None
    assert (f.common_name, f.organizations, f.dns_names, f.ip_addresses) == ("c", ("o",), ("a.b",), ("127.0.0.1",))
    assert f.usages == {"server", "client"} and f.key_matches and f.issuer_fingerprint == pki.fingerprint(ca)
    assert f.not_after == ca.not_valid_after_utc  # never outlives its authority
    other_key = pki.new_authority("x", now=T0, hours=2)[1]
    assert not pki.facts(cert_pem, other_key, [ca]).key_matches  # type: ignore[union-attr]
    assert pki.facts(cert_pem, key_pem, [x509.load_pem_x509_certificate(pki.new_authority("y", now=T0, hours=2)[0])])
    assert pki.facts(b"not a certificate") is None
    assert pki.load_bundle(b"-----BEGIN CERTIFICATE-----\ngarbage\n-----END CERTIFICATE-----\n") == []


def test_issued_certificates_do_mutual_tls(tmp_path: Path) -> None:
    """What the keeper makes works where it is used: a server certificate and a client certificate of the same
    authority complete a real TLS 1.2+ handshake with client verification, host name checked."""
    now = dt.datetime.now(dt.UTC)
    ca_pem, ca_key_pem = pki.new_authority("ca", now=now, hours=10)
    ca = x509.load_pem_x509_certificate(ca_pem)
    ca_key = serialization.load_pem_private_key(ca_key_pem, password=None)
    (tmp_path / "ca.crt").write_bytes(ca_pem)
    for name, usages in (("server", {"server"}), ("client", {"client"})):
        crt, key = pki.issue_leaf(common_name=f"qos-{name}", organizations=(), dns_names=("localhost",),
                                  ip_addresses=("127.0.0.1",), usages=usages, ca_cert=ca, ca_key=ca_key, now=now,
                                  hours=1)  # fmt: skip
        (tmp_path / f"{name}.crt").write_bytes(crt)
        (tmp_path / f"{name}.key").write_bytes(key)

    async def handshake() -> str:
        server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        server.load_cert_chain(tmp_path / "server.crt", tmp_path / "server.key")
        server.load_verify_locations(tmp_path / "ca.crt")
        server.verify_mode = ssl.CERT_REQUIRED
        peers: list[str] = []

        async def on(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            peer = writer.get_extra_info("peercert")
            peers.append(dict(x[0] for x in peer["subject"])["commonName"])
            writer.close()

        srv = await asyncio.start_server(on, "127.0.0.1", 0, ssl=server)
        port = srv.sockets[0].getsockname()[1]
        client = ssl.create_default_context(cafile=str(tmp_path / "ca.crt"))
        client.load_cert_chain(tmp_path / "client.crt", tmp_path / "client.key")
        _, w = await asyncio.open_connection("127.0.0.1", port, ssl=client, server_hostname="localhost")
        w.close()
        await asyncio.sleep(0.05)
        srv.close()
        return peers[0]

    assert asyncio.run(handshake()) == "qos-client"


def test_service_names() -> None:
    assert service_names(("a.b",), "cluster.local") == ("a", "a.b", "a.b.svc", "a.b.svc.cluster.local")


def _config(**kw: object) -> dict[str, object]:
    base: dict[str, object] = {
        "authorities": [{"name": "qos", "namespace": "ns", "secret": "ca", "common_name": "ca"}],
        "certificates": [{"namespace": "ns", "secret": "tls", "authority": "qos", "common_name": "x"}],
    }
    base.update(kw)
    return base


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"certificates": [{"namespace": "ns", "secret": "t", "authority": "nope", "common_name": "x"}]},
         "names authority 'nope'"),
        ({"certificates": [{"namespace": "ns", "secret": "ca", "authority": "qos", "common_name": "x"}]},
         "a Secret is named twice"),
        ({"certificates": [{"namespace": "ns", "secret": "t", "authority": "qos", "common_name": "x",
                            "services": ["no-namespace"]}]}, "must be name.namespace"),
        ({"renew_fraction": 1.5}, "renew_fraction"),
        ({"authorities": []}, "authorities"),
        ({"trust_configmaps": [{"namespace": "ns", "name": "c", "authorities": {"k": "ghost"}}]}, "unknown authority"),
        ({"certificates": [{"namespace": "NS!", "secret": "t", "authority": "qos", "common_name": "x"}]}, "namespace"),
    ],
)  # fmt: skip
def test_bad_settings_are_named(change: dict[str, object], message: str) -> None:
    with pytest.raises(SettingsError, match=message):
        load_settings(CertsConfig, _config(**change), "certs.yaml")


def test_the_shipped_list_loads() -> None:
    import yaml

    root = Path(__file__).resolve().parent.parent
    raw = yaml.safe_load((root / "config" / "certs" / "certs.yaml").read_text())["certs"]
    cfg = load_settings(CertsConfig, raw, "config/certs/certs.yaml")
    assert {a.name for a in cfg.authorities} == {"qos", "agents"}


def test_certs_command_refuses_a_bad_file_clearly(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "certs.yaml"
    bad.write_text("certs:\n  authorities: []\n  poll_seconds: fast\n")
    assert main(["certs", "--config", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "qos-extender certs:" in err and "authorities" in err and "poll_seconds" in err


def test_the_agent_issuer_follows_a_rotated_ca_without_a_restart(tmp_path: Path) -> None:
    """qos-certs rotates the agents' CA in Secret qos-agent-issuer-ca; the issuer re-reads the mounted files on its
    next pass and signs with the successor, and a pair that does not match (a half-updated mount) keeps the old."""
    from kubernetes_asyncio import client as k8s

    from extender.agent.issuer import Issuer
    from extender.agent.settings import IssuerConfig

    crt, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    first = pki.new_authority("one", now=T0, hours=10)
    crt.write_bytes(first[0])
    key.write_bytes(first[1])
    cfg = IssuerConfig(ca_cert_file=str(crt), ca_key_file=str(key))

    async def run() -> None:
        api = k8s.ApiClient()
        try:
            issuer = Issuer(api, cfg)
            assert issuer.ca_cert == x509.load_pem_x509_certificate(first[0])
            second = pki.new_authority("two", now=T0, hours=10)
            crt.write_bytes(second[0])  # the key is still the first one's: mismatched
            issuer._load_ca()
            assert issuer.ca_cert == x509.load_pem_x509_certificate(first[0])
            key.write_bytes(second[1])
            issuer._load_ca()
            assert issuer.ca_cert == x509.load_pem_x509_certificate(second[0])
        finally:
            await api.close()

    asyncio.run(run())
