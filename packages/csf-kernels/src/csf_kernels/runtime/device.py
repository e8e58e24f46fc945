"""The device facts plans and heuristics read: the SM count, read off the GPU plans run on.

Plans are made without compiling and, in tests and the AOT build, without a GPU: there the facts are the build
target's (``TARGET_SMS``, an H100 or H200 SXM). :func:`set_num_sms` pins the count for everything planned after it,
as DeepGEMM's ``set_num_sms`` does (a server sharing its SMs with other work, or A/B timing).
"""

from __future__ import annotations

import torch

__all__ = ["TARGET_SMS", "num_sms", "set_num_sms"]

TARGET_SMS = 132  # sm_90a's SXM parts (H100 SXM, H200): the count plans use where no GPU is visible
_pinned: list[int] = []


def set_num_sms(count: int | None) -> None:
    """Plan for ``count`` SMs from now on (None: read the device again)."""
    if count is not None and count <= 0:
        raise ValueError(f"the SM count must be positive, got {count}")
    _pinned[:] = [] if count is None else [int(count)]


def num_sms(device: torch.device | int | None = None) -> int:
    """The pinned count, else the SM count of ``device`` (default: the current CUDA device), else ``TARGET_SMS``."""
    if _pinned:
        return _pinned[0]
    if not torch.cuda.is_available():
        return TARGET_SMS
    if device is None:
        device = torch.cuda.current_device()
    return torch.cuda.get_device_properties(device).multi_processor_count
