"""Testing code that uses dynasem, with nothing but pip: an embedded DynamoDB engine."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .embedded import EmbeddedDynamoDB

__all__ = ["EmbeddedDynamoDB"]


def __getattr__(name: str) -> Any:
    # moto is imported only when the engine is wanted.
    if name == "EmbeddedDynamoDB":
        from .embedded import EmbeddedDynamoDB

        return EmbeddedDynamoDB
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
