"""Leader election on a coordination.k8s.io/v1 Lease: one replica acts, the others stand by, never two at once.

Why: the verbs and the admission webhook are stateless and every replica serves them, but two controllers (or
two autoscaler sidecars) would each release gates, evict victims or buy nodes for the same room. A Lease picks
one. A standby keeps its snapshot warm (the reflectors run in every replica) and, when it takes over, starts a
fresh term that rebuilds its state from the cluster, exactly as after a restart: a leader change loses nothing
that a restart would not.

Why our own elector and not kubernetes-asyncio's ``LeaderElection`` (used until issue 29): its Lease calls carry
no timeout, and it measures its renew deadline only between calls, so a leader whose renewal hangs (API server
partitioned, a stalled TCP connection) keeps acting after its lease expired and a standby took it: two leaders.
Bounding the library's calls from outside would still leave its deadline arithmetic (taken after the call
returns, not when the write was sent) and its acquire path unbounded. The algorithm is small, so it is written
here with the safety argument next to it:

* A leader's authority runs from the moment it **sent** its last successful write (acquire or renew) for
  ``renew_deadline_seconds``. The API server committed that write no earlier than it was sent, so any standby saw
  it no earlier either.
* A standby may take a Lease held by another identity only ``lease_duration_seconds`` after it **first saw** the
  Lease's current resourceVersion (its own monotonic clock; no remote timestamp is trusted, so clock skew
  between nodes does not matter), and only through an update carrying that resourceVersion (optimistic
  concurrency: if the leader renewed meanwhile, the write is refused with 409).
* ``renew_deadline < lease_duration`` (settings-validated), so the leader's authority ends at least
  ``lease_duration - renew_deadline`` before any standby's begins: the margin for clock-rate drift and for the
  leader's term to unwind after it is cancelled.
* Every Lease call runs under ``asyncio.timeout`` (and ``_request_timeout``) ending no later than the leader's
  authority, so no hung call keeps it past its deadline; the renew loop wakes at the deadline itself, not one
  retry period later, and cancels the term there.

The decisions are pure functions over what was observed (``may_acquire``, ``may_act``, ``call_budget``,
``observe``), tested with hypothesis (tests/test_leader.py); the class below only performs the calls.
tests/test_leader_live.py partitions a real leader from a real API server (traffic paused, then refused) and
checks from both replicas' logs that they never act within overlapping time.

Identity defaults to ``$POD_NAME`` (the Downward API in config/base), else the hostname: a container restarted
inside the same pod keeps its identity and takes its own lease back at once (the old container is gone);
another replica waits ``lease_duration_seconds`` after the last renewal it saw. On a clean stop the leader
ends its term first and then releases the Lease (empty holder), so a standby takes over without waiting.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import socket
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from kubernetes_asyncio import client as k8s
from kubernetes_asyncio.client.exceptions import ApiException

from extender.settings.sections import LeaderElectionConfig

__all__ = [
    "Leadership",
    "LeaseRecord",
    "Observed",
    "call_budget",
    "default_identity",
    "may_acquire",
    "may_act",
    "observe",
    "own_namespace",
]

log = logging.getLogger("extender.controller.leader")


def default_identity() -> str:
    """``$POD_NAME`` in a cluster (stable across container restarts), else the host name."""
    return os.environ.get("POD_NAME") or socket.gethostname()


SERVICE_ACCOUNT_NAMESPACE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"


def own_namespace(fallback: str = "kube-system") -> str:
    """The namespace this pod runs in (``$POD_NAMESPACE``, else its service account's), else ``fallback``: a
    Lease beside the Deployment needs a Role in that namespace only."""
    if ns := os.environ.get("POD_NAMESPACE"):
        return ns
    try:
        with open(SERVICE_ACCOUNT_NAMESPACE, encoding="utf-8") as f:
            return f.read().strip() or fallback
    except OSError:
        return fallback


# ----------------------------------------------------------------------------------------------- pure decisions


@dataclass(frozen=True)
class LeaseRecord:
    """What the Lease says: its holder ("" when released or never held) and the duration the holder promised."""

    holder: str
    duration_seconds: float
    transitions: int = 0


@dataclass(frozen=True)
class Observed:
    """A Lease version as this replica saw it: ``at`` is the local monotonic time it first saw ``version``."""

    record: LeaseRecord
    version: str
    at: float


def observe(previous: Observed | None, record: LeaseRecord, version: str, now: float) -> Observed:
    """The same resourceVersion keeps the time it was first seen (a standby's wait runs from there); any new
    version restarts it, since the holder may have renewed."""
    if previous is not None and previous.version == version:
        return previous
    return Observed(record, version, now)


def may_acquire(seen: Observed | None, me: str, now: float, lease_duration: float) -> bool:
    """May this replica try to write itself as holder now? Always when there is no Lease, no holder or it is the
    holder (a restarted container of the same pod); otherwise only once the holder's version is older, by this
    replica's clock, than the longer of our lease duration and the one the holder wrote (a holder configured
    with a longer lease is waited for accordingly)."""
    if seen is None or not seen.record.holder or seen.record.holder == me:
        return True
    return now - seen.at >= max(lease_duration, seen.record.duration_seconds)


def may_act(renewed_at: float | None, now: float, renew_deadline: float) -> bool:
    """A leader acts only within ``renew_deadline`` of when it sent its last successful write."""
    return renewed_at is not None and 0 <= now - renewed_at < renew_deadline


def call_budget(renewed_at: float | None, now: float, renew_deadline: float) -> float:
    """How long one Lease call may take: a leader's ends with its authority; a standby's is one renew deadline
    (it has no authority to lose, but a hung call must not stop it from contending)."""
    if renewed_at is None:
        return renew_deadline
    # from the same elapsed time as may_act, so rounding cannot give "may act" with a budget of 0 (hypothesis
    # found renewed_at=1.1e-16, now=1.0, deadline=1.0: 1.0 + 1.1e-16 rounds to 1.0)
    return max(0.0, renew_deadline - (now - renewed_at))


# ----------------------------------------------------------------------------------------------- the elector


class LeaseLost(Exception):
    """Another identity holds the Lease now."""


def _micro_time(wall: float) -> str:
    return datetime.fromtimestamp(wall, tz=UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _record(lease: Any) -> LeaseRecord:
    spec = lease.spec
    return LeaseRecord(
        holder=(spec.holder_identity or "") if spec is not None else "",
        duration_seconds=float((spec.lease_duration_seconds or 0) if spec is not None else 0),
        transitions=int((spec.lease_transitions or 0) if spec is not None else 0),
    )


class Leadership:
    """Contend for the Lease forever; run ``lead`` while holding it, cancel it when its authority ends.

    ``on_change(True/False)`` reports transitions (the leader gauge and /readyz detail). ``acting()`` says
    whether this replica may act at this instant (a guard for effects outside the term's task).
    ``clock`` is monotonic time (injected only by tests of the arithmetic)."""

    def __init__(
        self,
        api_client: Any,
        cfg: LeaderElectionConfig,
        lease_name: str,
        lead: Callable[[], Awaitable[None]],
        on_change: Callable[[bool], None] | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.cfg = cfg
        self.identity = cfg.identity or default_identity()
        self.lease_name = lease_name
        self.namespace = cfg.lease_namespace
        self._leases = k8s.CoordinationV1Api(api_client)
        self.lead = lead
        self.on_change = on_change
        self.clock = clock
        self.leading = False
        self.terms = 0
        self.renewed_at: float | None = None  # when the last successful write of this term was sent
        self._seen: Observed | None = None
        self._term: asyncio.Task[Any] | None = None
        self._acquire_time: str | None = None  # the Lease's acquireTime of this holder (MicroTime)

    # ---- what the rest of the process asks

    def acting(self) -> bool:
        return self.leading and may_act(self.renewed_at, self.clock(), self.cfg.renew_deadline_seconds)

    def _set(self, leading: bool) -> None:
        self.leading = leading
        if self.on_change is not None:
            self.on_change(leading)

    # ---- Lease calls, each bounded

    async def _bounded(self, call: Callable[..., Awaitable[Any]], *args: Any, **kwargs: Any) -> Any:
        budget = call_budget(self.renewed_at, self.clock(), self.cfg.renew_deadline_seconds)
        if budget <= 0:
            raise TimeoutError("no time left before the renew deadline")
        async with asyncio.timeout(budget):
            return await call(*args, _request_timeout=budget, **kwargs)

    def _body(self, version: str | None, transitions: int, acquired: bool, old: Any = None) -> dict[str, Any]:
        now = _micro_time(time.time())
        spec: dict[str, Any] = {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": self.cfg.lease_duration_seconds,
            "leaseTransitions": transitions,
            "renewTime": now,
        }
        if acquired:
            self._acquire_time = now
        elif old is not None and old.spec is not None and old.spec.acquire_time is not None:
            self._acquire_time = _micro_time(old.spec.acquire_time.timestamp())
        if self._acquire_time is not None:  # an update replaces the spec: carry it over every renewal
            spec["acquireTime"] = self._acquire_time
        meta: dict[str, Any] = {"name": self.lease_name, "namespace": self.namespace}
        if version is not None:
            meta["resourceVersion"] = version
        return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": meta, "spec": spec}

    async def _get(self) -> Any | None:
        try:
            lease = await self._bounded(self._leases.read_namespaced_lease, self.lease_name, self.namespace)
        except ApiException as exc:
            if exc.status == 404:
                self._seen = None
                return None
            raise
        self._seen = observe(self._seen, _record(lease), lease.metadata.resource_version, self.clock())
        return lease

    async def _try_acquire(self) -> bool:
        """One attempt: read the Lease, and write ourselves as holder if ``may_acquire`` allows it."""
        lease = await self._get()
        if lease is None:
            sent = self.clock()
            try:
                created = await self._bounded(
                    self._leases.create_namespaced_lease, self.namespace, self._body(None, 0, acquired=True)
                )
            except ApiException as exc:
                if exc.status == 409:  # another replica created it first
                    return False
                raise
            self.renewed_at = sent
            self._seen = observe(None, _record(created), created.metadata.resource_version, self.clock())
            return True
        assert self._seen is not None
        if not may_acquire(self._seen, self.identity, self.clock(), self.cfg.lease_duration_seconds):
            return False
        record = self._seen.record
        ours = record.holder == self.identity
        body = self._body(
            self._seen.version, record.transitions + (0 if ours else 1), acquired=not ours, old=lease if ours else None
        )
        sent = self.clock()
        try:
            written = await self._bounded(self._leases.replace_namespaced_lease, self.lease_name, self.namespace, body)
        except ApiException as exc:
            if exc.status == 409:  # the holder renewed (or another standby won) since we read it
                return False
            raise
        self.renewed_at = sent
        self._seen = observe(self._seen, _record(written), written.metadata.resource_version, self.clock())
        return True

    async def _renew(self) -> None:
        """Write the renewal over the version we last wrote; on 409 read it back: still ours (an update of our
        own we did not see, e.g. one that timed out here but was committed) is renewed over, another holder's
        is lost (``LeaseLost``)."""
        assert self._seen is not None
        for _ in range(2):
            record = self._seen.record
            if record.holder != self.identity:
                raise LeaseLost(record.holder)
            body = self._body(self._seen.version, record.transitions, acquired=False)
            sent = self.clock()
            try:
                written = await self._bounded(
                    self._leases.replace_namespaced_lease, self.lease_name, self.namespace, body
                )
            except ApiException as exc:
                if exc.status == 409:
                    if await self._get() is None:
                        raise LeaseLost("") from None
                    continue
                if exc.status == 404:
                    raise LeaseLost("") from None
                raise
            self.renewed_at = sent
            self._seen = observe(self._seen, _record(written), written.metadata.resource_version, self.clock())
            return
        raise TimeoutError("the Lease kept changing under the renewal")

    async def _release(self) -> None:
        """After the term ended: clear the holder so a standby takes over at once (only if still ours)."""
        if self._seen is None or self._seen.record.holder != self.identity:
            return
        body = self._body(self._seen.version, self._seen.record.transitions, acquired=False)
        body["spec"]["holderIdentity"] = ""
        body["spec"]["leaseDurationSeconds"] = 1
        self.renewed_at = None  # a standby's budget: one renew deadline
        try:
            await self._bounded(self._leases.replace_namespaced_lease, self.lease_name, self.namespace, body)
        except Exception as exc:  # a standby takes over after the lease duration anyway
            log.warning("could not release the Lease", extra={"error": repr(exc)})
        else:
            log.info("released the Lease", extra={"decision": {"identity": self.identity, "lease": self.lease_name}})

    # ---- the loops

    async def _contend(self) -> None:
        while True:
            try:
                if await self._try_acquire():
                    return
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # API error, timeout, connection refused: contend again
                log.warning("Lease acquire attempt failed", extra={"error": repr(exc)})
            self.renewed_at = None
            await asyncio.sleep(self.cfg.retry_period_seconds)

    async def _hold(self) -> None:
        """Renew every retry period until the authority ends; returns the moment it does (never later: the
        sleep and every call end at the deadline)."""
        next_at = self.clock() + self.cfg.retry_period_seconds
        while True:
            deadline = (self.renewed_at if self.renewed_at is not None else -math.inf) + self.cfg.renew_deadline_seconds
            now = self.clock()
            if now >= deadline:
                log.warning(
                    "renew deadline passed: stopping",
                    extra={"decision": {"identity": self.identity, "lease": self.lease_name, "term": self.terms}},
                )
                return
            await asyncio.sleep(max(0.0, min(next_at, deadline) - now))
            if self.clock() >= deadline:
                continue
            try:
                await self._renew()
            except LeaseLost as lost:
                log.warning(
                    "lost the Lease",
                    extra={"decision": {"identity": self.identity, "lease": self.lease_name, "holder": str(lost)}},
                )
                return
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # retry soon, still within the deadline (the loop's sleep is capped by it)
                log.warning("Lease renewal failed", extra={"error": repr(exc)})
                next_at = self.clock() + self.cfg.retry_period_seconds / 4
            else:
                next_at = self.clock() + self.cfg.retry_period_seconds

    async def _run_term(self) -> None:
        await self.lead()

    async def _end_term(self) -> None:
        """Cancel the term and wait until it has unwound (``asyncio.wait``: the term's own cancellation is not
        ours; a second cancel of this task still propagates), then report the transition."""
        term, self._term = self._term, None
        if term is not None:
            if not term.done():
                term.cancel()
            await asyncio.wait({term})
            if not term.cancelled() and term.exception() is not None:
                log.error("the leader's term failed", exc_info=term.exception())
        if self.leading:
            self._set(False)
            log.warning("stopped acting", extra={"decision": {"identity": self.identity, "lease": self.lease_name}})

    async def run(self) -> None:
        try:
            while True:
                await self._contend()
                self.terms += 1
                self._set(True)
                log.info(
                    "leading",
                    extra={"decision": {"identity": self.identity, "lease": self.lease_name, "term": self.terms}},
                )
                self._term = asyncio.create_task(self._run_term(), name=f"lease-term-{self.lease_name}")
                holding = asyncio.create_task(self._hold(), name=f"lease-renew-{self.lease_name}")
                try:
                    # a term that ends by itself (a crash) gives the Lease up as well
                    await asyncio.wait({self._term, holding}, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    holding.cancel()
                    await asyncio.wait({holding})
                    await self._end_term()
                self.renewed_at = None
                await asyncio.sleep(self.cfg.retry_period_seconds)
        finally:
            await self._end_term()
            await self._release()
