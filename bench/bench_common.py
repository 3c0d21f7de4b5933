"""What several bench/ scripts share (they run as scripts: ``python bench/X.py``, so bench/ is on sys.path)."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def commit() -> str | None:
    """The commit the figures belong to: ``$RIGEL_COMMIT`` (the device copy has no .git), else ``git rev-parse
    --short HEAD`` of this checkout, else None."""
    if os.environ.get("RIGEL_COMMIT"):
        return os.environ["RIGEL_COMMIT"]
    try:
        return subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, timeout=5).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None
