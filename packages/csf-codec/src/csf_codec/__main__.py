"""``python -m csf_codec``: the ``csf`` command."""

from __future__ import annotations

from .cli import main

raise SystemExit(main())
