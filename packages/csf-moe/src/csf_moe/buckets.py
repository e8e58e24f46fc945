"""The token-bucket lookup both plans share (:class:`csf_moe.plan.MoEPlan`, :class:`csf_moe.engine_plan.EnginePlan`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

__all__ = ["bucket_for"]

B = TypeVar("B")


def bucket_for(buckets: Sequence[B], tokens: int, max_tokens: int, name: str) -> B:
    """The first of ``buckets`` (ascending ``.tokens``) holding ``tokens``; an error past the plan's ``max_tokens``."""
    for b in buckets:
        if tokens <= b.tokens:
            return b
    raise ValueError(
        f"{tokens} tokens exceed the plan's max_tokens={max_tokens} ({name}); plan for more tokens or split the batch"
    )
