"""Progress in bytes of the current phase, on stderr, only when someone is watching."""

from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator

__all__ = ["Progress", "counted"]


class Progress:
    """One phase's byte counter (``with Progress(total, "csf verify", enabled) as bar: bar.update(n)``).

    It draws only when ``enabled`` and stderr is a terminal; otherwise it counts silently, so callers never
    branch on it.
    """

    def __init__(self, total: int, desc: str, enabled: bool):
        self.total, self.done = total, 0
        self._bar = None
        if enabled and sys.stderr.isatty():
            from tqdm.auto import tqdm

            self._bar = tqdm(total=total, desc=desc, unit="B", unit_scale=True, unit_divisor=1024, leave=False)

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.close()

    def update(self, n: int) -> None:
        self.done += n
        if self._bar is not None:
            self._bar.update(n)

    def note(self, what: str) -> None:
        """Name the tensor being worked on."""
        if self._bar is not None:
            self._bar.set_postfix_str(what, refresh=False)


def counted(chunks: Iterable[bytes | memoryview], bar: Progress) -> Iterator[bytes | memoryview]:
    for c in chunks:
        bar.update(len(memoryview(c).cast("B")))
        yield c
