"""What the sidecar needs from whoever creates and removes machines."""

from __future__ import annotations

from typing import Protocol

from extender.autoscaler.loop import ProvisionRequest

__all__ = ["Provider"]


class Provider(Protocol):
    """A node source. ``create`` only *requests* a node and returns at once; the node joins later (the
    acquisition lag), which the loop observes through the watch. ``cancel`` withdraws a request that never
    joined (provisioning timeout); ``delete`` removes a joined node. All must be idempotent."""

    name: str

    async def create(self, request: ProvisionRequest) -> None: ...

    async def cancel(self, node_name: str) -> None: ...

    async def delete(self, node_name: str) -> None: ...

    async def set_retiring(self, node_name: str, retiring: bool) -> None:
        """Cordon a node retired for capacity and label it so (or undo both): the loop's record, read back by a
        restarted sidecar (``loop.RETIRING_LABEL``)."""
        ...

    async def close(self) -> None: ...
