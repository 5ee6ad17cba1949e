#!/usr/bin/env python
"""Kill-point harness: SIGKILL an out-of-core fit at every write it makes, resume, compare.

The harness is ``tests/kill_points.py`` (the tests run a handful of its points); this
script runs the full sweep with the same options (``--help``; docs/reliability.md).
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import kill_points  # noqa: E402

if __name__ == "__main__":
    sys.exit(kill_points.main())
