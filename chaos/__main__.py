"""``python -m chaos``: run the chaos scenario (or re-check a kept run directory)."""

from __future__ import annotations

import sys

from chaos.cli import main

sys.exit(main())
