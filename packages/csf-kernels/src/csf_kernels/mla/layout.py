"""The FP8 sparse-MLA KV record (DeepSeek-V3.2 style): one place for its byte layout.

A record is 656 bytes: 512 E4M3 latent bytes (four groups of 128, each with its own scale), the four
float32 group scales (powers of two), then the 64 bf16 rope values. Records sit in pages of 64; a
candidate index is ``page * 64 + offset``, -1 = skip. The latent doubles as the value (dimension 512);
the query is 576 wide (512 latent + 64 rope).
"""

from __future__ import annotations

__all__ = [
    "CHUNK",
    "GROUP",
    "GROUPS",
    "HEAD_DIM",
    "LATENT",
    "PAGE_SIZE",
    "RECORD_BYTES",
    "ROPE",
    "ROPE_OFFSET",
    "SCALE_OFFSET",
    "VALUE_DIM",
]

LATENT = 512  # E4M3 latent bytes per record (also the value / output dimension)
ROPE = 64  # bf16 rope values per record
GROUP = 128  # latent values per scale
GROUPS = LATENT // GROUP
SCALE_OFFSET = LATENT  # float32 scales [GROUPS]
ROPE_OFFSET = SCALE_OFFSET + 4 * GROUPS  # bf16 rope [ROPE]
RECORD_BYTES = ROPE_OFFSET + 2 * ROPE  # 656: a multiple of 16, so every record is 16-byte aligned
HEAD_DIM = LATENT + ROPE  # 576: query width
VALUE_DIM = LATENT
PAGE_SIZE = 64
CHUNK = 64  # candidates per decode step (one chunk of the top-k list)

assert RECORD_BYTES == 656 and RECORD_BYTES % 16 == 0
