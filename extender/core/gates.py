"""Our scheduling gate's two silent paths, decided (issue 31): pods that bypassed admission, and pods left gated.

1. **Fail-open made visible.** The ordering webhook runs with failurePolicy Ignore: while it does not answer
   (extender down, network policy, certificate), a qos-scheduler pod is created ungated and unannotated and is
   scheduled without the controller's order. Such a pod is still accounted by the controller (its namespace
   routes it to an instance), but nothing said that it bypassed admission. ``bypassed_admission`` picks the
   pods to count (a metric and a Warning Event on the pod), once each: the shell marks each counted pod with
   ``BYPASS_ANNOTATION``, so a restarted or newly elected controller does not count it again.
2. **Uninstall releases the gate.** A pod behind our gate is released only by the controller; once the
   controller is uninstalled (or turned off) nothing ever would. ``ungate_plan`` picks every pod that still
   carries the gate, for ``qos-extender ungate`` (the chart's pre-delete hook runs it).

Pure: plain values in, pod keys out; the shells read the pods and write the patches.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["BYPASS_ANNOTATION", "GateView", "bypassed_admission", "ungate_plan"]

# Set by the controller on a pod it counted as having bypassed admission (value: the controller instance).
BYPASS_ANNOTATION = "qos.kube-qos-extender.io/admission-bypassed"


@dataclass(frozen=True, slots=True)
class GateView:
    """What these decisions need of one qos-scheduler pod (the shells fill it from the Pod object)."""

    key: str  # namespace/name
    gated: bool  # carries our scheduling gate
    instance: str | None  # the controller instance the admission webhook annotated, None: not admitted by ours
    bypass_marked: bool  # already counted (BYPASS_ANNOTATION present)
    terminal: bool = False  # Succeeded / Failed
    deleting: bool = False  # deletionTimestamp set

    def __post_init__(self) -> None:
        if "/" not in self.key:
            raise ValueError(f"pod key must be namespace/name, got {self.key!r}")


def bypassed_admission(pods: Iterable[GateView]) -> list[str]:
    """The keys (sorted) of pods to count as having bypassed our admission webhook: created without the
    annotation every pod our webhook admits gets, not carrying our gate (a gated pod was admitted by some
    webhook of ours, e.g. a re-queued copy), and not counted before. A pod being deleted or finished is still
    counted (it did bypass; the Event explains it), except that nobody can annotate a pod being deleted, so
    those are left out rather than counted again by every controller term.

    The caller passes only the pods its controller instance manages (``patches.owner_instance``): a pod routed
    to another instance is that instance's to count."""
    return sorted(p.key for p in pods if p.instance is None and not p.gated and not p.bypass_marked and not p.deleting)


def ungate_plan(pods: Iterable[GateView]) -> list[str]:
    """The keys (sorted) of pods whose gate ``qos-extender ungate`` removes: every pod that carries it and is
    neither finished nor being deleted (the API server refuses spec changes to a terminal pod, and a deleted
    one needs no release). Whatever instance annotated them: with the controller gone, none would release."""
    return sorted(p.key for p in pods if p.gated and not p.terminal and not p.deleting)
