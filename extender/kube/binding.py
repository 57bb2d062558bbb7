"""What a bind is, independent of how it is made: arguments, failure, and the Binder interface."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

__all__ = ["BindArgs", "BindError", "Binder"]


@dataclass(frozen=True, slots=True)
class BindArgs:
    namespace: str
    name: str
    uid: str
    node: str

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


class BindError(Exception):
    """The binding could not be made; the message goes to ExtenderBindingResult.Error."""

    def __init__(self, message: str, retries: int = 0) -> None:
        super().__init__(message)
        self.retries = retries


class Binder(Protocol):
    async def bind(self, args: BindArgs) -> int:
        """Create the Binding (idempotent); returns the number of retries made; raises BindError."""
        ...
