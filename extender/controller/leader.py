"""Leader election for the QoS controller: one extender replica releases gates and evicts, the others stand by.

Why: the verbs and the admission webhook are stateless and every replica serves them, but two controllers
would each release gates and evict victims for the same room. A coordination.k8s.io Lease (kubernetes-asyncio's
``LeaderElection`` with ``LeaseLock``, the client-go algorithm) picks one. A standby keeps its snapshot warm
(the reflectors run in every replica) and, when it takes over, starts a fresh ``QosController`` that rebuilds
every account from the owners' annotations, exactly as after a restart: a leader change loses nothing that a
restart would not.

Identity defaults to ``$POD_NAME`` (the Downward API in config/base), else the hostname: a container restarted
inside the same pod keeps its identity and takes its own lease back at once instead of waiting for it to
expire; another replica waits ``lease_duration_seconds`` after the last renewal it saw.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections.abc import Awaitable, Callable
from typing import Any

from kubernetes_asyncio.leaderelection.electionconfig import Config as ElectionConfig
from kubernetes_asyncio.leaderelection.leaderelection import LeaderElection
from kubernetes_asyncio.leaderelection.resourcelock.leaselock import LeaseLock

from extender.settings.sections import LeaderElectionConfig

__all__ = ["Leadership", "default_identity"]

log = logging.getLogger("extender.controller.leader")


def default_identity() -> str:
    """``$POD_NAME`` in a cluster (stable across container restarts), else the host name."""
    return os.environ.get("POD_NAME") or socket.gethostname()


class Leadership:
    """Contend for the Lease forever; run ``lead`` while holding it, cancel it the moment a renewal fails.

    ``on_change(True/False)`` reports transitions (the metric and /readyz detail)."""

    def __init__(
        self,
        api_client: Any,
        cfg: LeaderElectionConfig,
        lease_name: str,
        lead: Callable[[], Awaitable[None]],
        on_change: Callable[[bool], None] | None = None,
    ) -> None:
        self.cfg = cfg
        self.identity = cfg.identity or default_identity()
        self.lease_name = lease_name
        self.lock = LeaseLock(lease_name, cfg.lease_namespace, self.identity, api_client)
        self.lead = lead
        self.on_change = on_change
        self.leading = False
        self.terms = 0
        self._term: asyncio.Task[Any] | None = None

    def _set(self, leading: bool) -> None:
        self.leading = leading
        if self.on_change is not None:
            self.on_change(leading)

    async def _started(self) -> None:
        # The library runs this as its own task and cancels it when a renewal fails; remember it so that
        # cancelling ``run`` (shutdown) cancels the term too.
        self._term = asyncio.current_task()
        self.terms += 1
        self._set(True)
        log.info(
            "leading",
            extra={"decision": {"identity": self.identity, "lease": self.lease_name, "term": self.terms}},
        )
        await self.lead()

    async def _stopped(self) -> None:
        self._set(False)
        log.warning("lost the lease: controller stopped", extra={"decision": {"identity": self.identity}})

    async def run(self) -> None:
        while True:
            election = LeaderElection(
                ElectionConfig(
                    self.lock,
                    lease_duration=self.cfg.lease_duration_seconds,
                    renew_deadline=self.cfg.renew_deadline_seconds,
                    retry_period=self.cfg.retry_period_seconds,
                    onstarted_leading=self._started,
                    onstopped_leading=self._stopped,
                )
            )
            try:
                await election.run()
            except asyncio.CancelledError:
                raise
            except Exception:  # an API error outside the library's own handling: contend again
                log.exception("leader election failed; retrying")
            finally:
                if self._term is not None and not self._term.done():
                    self._term.cancel()  # never act without the lease
                if self.leading:
                    self._set(False)
            await asyncio.sleep(self.cfg.retry_period_seconds)
