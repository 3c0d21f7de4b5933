"""Atomic file writes: readers (and a crash or Ctrl-C mid-write) never see a partial file.

The data goes to a temporary file in the destination directory, is flushed to disk, given the permissions a
plain ``open`` would have, and moved into place with ``os.replace`` (atomic on POSIX); on any error the
temporary file is removed and the old file, if any, is left untouched.
"""
from __future__ import annotations

import os
import tempfile
from contextlib import contextmanager
from pathlib import Path

__all__ = ["atomic_path", "umask"]


def umask() -> int:
    """The process umask, read without changing it where /proc allows (os.umask is not thread-safe)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


@contextmanager
def atomic_path(path):
    """Yield a temporary path beside ``path`` to write to; on success it replaces ``path``.

    Raises: OSError when the directory cannot be created or written.
    """
    path = Path(path)
    directory = path.absolute().parent
    directory.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix="." + path.name + ".", suffix=".tmp", dir=directory)
    os.close(fd)
    try:
        yield tmp
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~umask())  # mkstemp creates 0600; give the file the usual permissions
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
