"""Taints and tolerations, decided as kube-scheduler's TaintToleration filter decides them.

Why the core needs them: the QoS controller pins a released pod to the host it chose, and the autoscaler counts
the free room of existing nodes before it buys. Both read nodes from their own snapshot, and kube-scheduler,
not they, applies taints. A node whose taint the pod does not tolerate (kubeadm's and kind's control plane,
``node-role.kubernetes.io/control-plane:NoSchedule``) was therefore a host to them: on kind the controller
pinned every batch pod to the control plane (time-bin BFD prefers the fullest node), kube-scheduler could never
bind it there, and the controller re-queued it and pinned it there again, forever (found by ``make demo`` on
kind, issue 31). The autoscaler likewise counted the control plane's room as batch capacity and bought nothing.

Only NoSchedule and NoExecute taints keep a pod off a node (PreferNoSchedule is a score, never a filter).
Matching follows upstream's ``Toleration.ToleratesTaint``: an empty toleration effect matches every effect, an
empty key every key; ``Exists`` matches any value, ``Equal`` (or no operator) the same value; ``Lt`` / ``Gt``
compare integers (a value that is not one matches nothing); any other operator matches nothing.

Pure: plain values in, a decision out; the shells parse them from the API objects (``extender.kube.convert``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["FILTER_EFFECTS", "LIFECYCLE_TAINTS", "Taint", "Toleration", "blocking", "tolerates", "withholds"]

# The effects kube-scheduler's TaintToleration filter rejects a node for.
FILTER_EFFECTS = frozenset({"NoSchedule", "NoExecute"})
# The node lifecycle's own taints: a node briefly NotReady or unreachable, or cordoned (the cordon is the node's
# ``unschedulable`` already, which every policy reads). Capacity that comes back by itself, so the autoscaler
# does not buy around them (``withholds``).
LIFECYCLE_TAINTS = frozenset(
    {"node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable", "node.kubernetes.io/unschedulable"}
)


@dataclass(frozen=True, slots=True)
class Taint:
    key: str
    value: str = ""
    effect: str = ""


@dataclass(frozen=True, slots=True)
class Toleration:
    key: str = ""
    operator: str = ""
    value: str = ""
    effect: str = ""


def _int(text: str) -> int | None:
    try:
        return int(text)
    except ValueError:
        return None


def tolerates(toleration: Toleration, taint: Taint) -> bool:
    """Whether ``toleration`` matches ``taint`` (upstream's ``ToleratesTaint``)."""
    if toleration.effect and toleration.effect != taint.effect:
        return False
    if toleration.key and toleration.key != taint.key:
        return False
    op = toleration.operator
    if op == "Exists":
        return True
    if op in ("", "Equal"):
        return toleration.value == taint.value
    if op in ("Lt", "Gt"):
        mine, theirs = _int(toleration.value), _int(taint.value)
        if mine is None or theirs is None:
            return False
        return theirs < mine if op == "Lt" else theirs > mine
    return False


def blocking(taints: Iterable[Taint], tolerations: Iterable[Toleration]) -> Taint | None:
    """The first NoSchedule / NoExecute taint none of ``tolerations`` matches (the pod may not go there), else
    None."""
    tols = tuple(tolerations)
    for taint in taints:
        if taint.effect in FILTER_EFFECTS and not any(tolerates(t, taint) for t in tols):
            return taint
    return None


def withholds(taints: Iterable[Taint]) -> bool:
    """Whether a node with these taints is kept from ordinary pods (a NoSchedule / NoExecute taint that is not one
    of the node lifecycle's): the autoscaler's view, which plans for pods without reading their tolerations, so
    such a node's room is not capacity of any node group."""
    return any(t.effect in FILTER_EFFECTS and t.key not in LIFECYCLE_TAINTS for t in taints)
