"""What the sidecar needs from whoever creates and removes machines."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from extender.autoscaler.loop import ProvisionRequest

__all__ = ["Provider"]


class Provider(Protocol):
    """A node source. ``create`` only *requests* a node and returns at once; the node joins later (the
    acquisition lag), which the loop observes through the watch. ``cancel`` withdraws a request that never
    joined (provisioning timeout); ``delete`` removes a joined node. All must be idempotent."""

    name: str

    async def create(self, request: ProvisionRequest) -> None: ...

    async def create_all(self, requests: Sequence[ProvisionRequest]) -> None:
        """One scan's purchases together (a ProvisioningRequest carries every node of one flavour)."""
        ...

    async def fulfilled(self, node_names: Sequence[str]) -> None:
        """Planned nodes whose pods are all bound: only demand handed to cluster-autoscaler is told (its
        requests are then deleted); a provider that makes nodes itself saw them join."""
        ...

    async def cancel(self, node_name: str) -> None: ...

    async def delete(self, node_name: str) -> None: ...

    async def set_retiring(self, node_name: str, retiring: bool) -> None:
        """Cordon a node retired for capacity and label it so (or undo both): the loop's record, read back by a
        restarted sidecar (``loop.RETIRING_LABEL``)."""
        ...

    async def close(self) -> None: ...
