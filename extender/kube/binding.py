"""What a bind is, independent of how it is made: arguments, failure, and the Binder interface."""

from __future__ import annotations

from typing import NamedTuple, Protocol

__all__ = ["BindArgs", "BindError", "Binder"]


class BindArgs(NamedTuple):
    """ExtenderBindingArgs. A NamedTuple: immutable like a frozen dataclass, built in half the time (one is
    built per bind, and the bind verb's whole decision is a few microseconds)."""

    namespace: str
    name: str
    uid: str
    node: str

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


class BindError(Exception):
    """The binding could not be made; the message goes to ExtenderBindingResult.Error.

    ``in_doubt``: an attempt timed out or broke off after the POST may have reached the API server, so the
    Binding may exist although we report failure. The caller keeps the pod assumed on the node until the
    watch says otherwise (or the ledger's TTL ends it) instead of offering its space again.
    """

    def __init__(self, message: str, retries: int = 0, in_doubt: bool = False) -> None:
        super().__init__(message)
        self.retries = retries
        self.in_doubt = in_doubt


class Binder(Protocol):
    async def bind(self, args: BindArgs) -> int:
        """Create the Binding (idempotent); returns the number of retries made; raises BindError."""
        ...
