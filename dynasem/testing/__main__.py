"""``python -m dynasem.testing [--port P] [--port-file F] [--quiet]``: the embedded engine."""

from __future__ import annotations

import sys

from .embedded import main

sys.exit(main())
