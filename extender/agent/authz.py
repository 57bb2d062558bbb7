"""Who may call which agent route: a pure decision over (method, route, the client certificate's CNs).

Why: every certificate of the agents' CA passes the TLS handshake, and that CA signs several identities -- one
per node's agent, the controller that starts migrations, the Prometheus that scrapes. A certificate is an
identity, not a permission: each route names the roles it serves and everything else is a 403 with the reason,
counted (``qos_extender_agent_requests_refused_total``).

- controller (``authz.controllers``): starts a migration on a source agent, reads its record, discards an
  unused restore, sets test faults (only when the agent runs with test fault injection).
- agent (CN ``qos-agent:<node>``): the destination side of the protocol (archive upload, prepare, restore,
  commit, abort), and only for migrations it started itself: the first agent to upload an archive owns the
  migration on that destination (``owner_refusal``), so a peer on node Y cannot restore or abort node X's.
- prometheus (``authz.metrics_clients``): ``/metrics`` and nothing else.
- ``/healthz`` also answers this node's own agent identity: the readiness probe presents it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum

from extender.core.migration import node_of_agent

__all__ = ["ROUTES", "Caller", "Role", "classify", "owner_refusal", "refusal"]


class Role(StrEnum):
    CONTROLLER = "controller"
    AGENT = "agent"
    PROMETHEUS = "prometheus"
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class Caller:
    role: Role
    name: str  # the CN that gave the role ("" without a certificate)
    node: str | None = None  # an agent's node

    def __str__(self) -> str:
        return f"{self.role.value} {self.name!r}" if self.name else "a client without certificate"


_C, _A, _P = Role.CONTROLLER, Role.AGENT, Role.PROMETHEUS
# (method, aiohttp canonical route) -> roles allowed. A route missing here is refused to everyone: a new route
# must be placed in this table before anyone can call it.
ROUTES: dict[tuple[str, str], frozenset[Role]] = {
    ("POST", "/v1/migrations"): frozenset({_C}),
    ("GET", "/v1/migrations/{id}"): frozenset({_C, _A}),
    ("PUT", "/v1/migrations/{id}/archive/{stage}"): frozenset({_A}),
    ("POST", "/v1/migrations/{id}/prepare"): frozenset({_A}),
    ("POST", "/v1/migrations/{id}/restore"): frozenset({_A}),
    ("POST", "/v1/migrations/{id}/commit"): frozenset({_A}),
    ("POST", "/v1/migrations/{id}/abort"): frozenset({_A}),
    ("POST", "/v1/migrations/{id}/discard"): frozenset({_C}),
    ("GET", "/v1/info"): frozenset({_C, _A}),
    ("GET", "/healthz"): frozenset({_C, _A}),
    ("GET", "/metrics"): frozenset({_P}),
    ("PUT", "/v1/test/faults"): frozenset({_C}),
    ("GET", "/v1/test/faults"): frozenset({_C}),
}


def classify(names: Iterable[str], controllers: Iterable[str], metrics_clients: Iterable[str]) -> Caller:
    """The role a verified certificate's CNs give. Agents are recognised by their CN's form; the controller and
    Prometheus by the names configured (a name configured as both is the controller's)."""
    given = tuple(names)
    ctl, prom = set(controllers), set(metrics_clients)
    for n in given:
        if n in ctl:
            return Caller(Role.CONTROLLER, n)
    for n in given:
        node = node_of_agent(n)
        if node is not None:
            return Caller(Role.AGENT, n, node)
    for n in given:
        if n in prom:
            return Caller(Role.PROMETHEUS, n)
    return Caller(Role.UNKNOWN, given[0] if given else "")


def refusal(method: str, route: str, caller: Caller, this_node: str) -> str | None:
    """None when ``caller`` may call ``method route`` on the agent of ``this_node``, else the reason of the 403."""
    allowed = ROUTES.get((method, route))
    if allowed is None:
        return f"{method} {route} is served to nobody"
    if caller.role in allowed:
        if caller.role is Role.AGENT and route == "/healthz" and caller.node != this_node:
            return f"{caller} is not this node's agent ({this_node}): /healthz answers the probe of its own agent"
        return None
    roles = ", ".join(sorted(r.value for r in allowed))
    return f"{caller} may not call {method} {route} (allowed: {roles})"


def owner_refusal(owner: str | None, caller: Caller) -> str | None:
    """On a destination: the migration belongs to the agent that first uploaded to it (``owner``, a CN); any
    other caller is refused. None while nobody owns it yet (the caller becomes its owner)."""
    if owner is None or owner == caller.name:
        return None
    return f"migration belongs to {owner!r}, not to {caller}"
