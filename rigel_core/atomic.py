"""Atomic file writes: readers (and a crash or Ctrl-C mid-write) never see a partial file.

The data goes to a temporary file in the destination directory, is flushed to disk, given the permissions a
plain ``open`` would have, and moved into place with ``os.replace`` (atomic on POSIX), the directory fsync'ed
after; on any error the temporary file is removed and the old file, if any, is left untouched. Only a kill -9
(or a power loss) between the temporary file's creation and the rename leaves it behind, named
``.<name>.<8 random characters>.tmp`` (:func:`temp_name_pattern`); :func:`remove_stale_temp_files` clears
those (``rigel-train`` does at start, holding its run lock).
"""
from __future__ import annotations

import os
import re
import tempfile
from contextlib import contextmanager
from pathlib import Path

__all__ = ["atomic_path", "umask", "temp_name_pattern", "remove_stale_temp_files"]

# atomic_path's temporary names: "." + the destination's name + "." + tempfile.mkstemp's 8 random characters
# (lower-case letters, digits, "_") + ".tmp". A kill -9 between mkstemp and os.replace leaves one behind.
_TEMP_PREFIX = "."
_TEMP_SUFFIX = ".tmp"
_TEMP_RANDOM = r"[a-z0-9_]{8}"


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


def _fsync_dir(directory) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some filesystems refuse fsync on a directory; the rename is still atomic
    finally:
        os.close(fd)


@contextmanager
def atomic_path(path):
    """Yield a temporary path beside ``path`` to write to; on success it replaces ``path``.

    Raises: OSError when the directory cannot be created or written.
    """
    path = Path(path)
    directory = path.absolute().parent
    directory.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=_TEMP_PREFIX + path.name + ".", suffix=_TEMP_SUFFIX, dir=directory)
    os.close(fd)
    try:
        yield tmp
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~umask())  # mkstemp creates 0600; give the file the usual permissions
        os.replace(tmp, path)
        _fsync_dir(directory)  # make the rename itself durable (a power loss after it keeps the new file)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def temp_name_pattern(name: str) -> "re.Pattern":
    """The regular expression matching exactly the temporary names :func:`atomic_path` uses for a file ``name``."""
    return re.compile(re.escape(_TEMP_PREFIX + name + ".") + _TEMP_RANDOM + re.escape(_TEMP_SUFFIX) + r"\Z")


def remove_stale_temp_files(directory, names) -> list[Path]:
    """Delete the temporary files that interrupted :func:`atomic_path` writes of the files ``names`` left in
    ``directory`` (regular files whose whole name matches :func:`temp_name_pattern`; nothing else, no
    recursion, symlinks left alone). Call it only while no other process writes there (rigel-train holds the
    run lock). Returns the removed paths.

    Raises: OSError when ``directory`` cannot be listed or a match cannot be removed.
    """
    directory = Path(directory)
    patterns = [temp_name_pattern(n) for n in names]
    removed = []
    for entry in sorted(os.scandir(directory), key=lambda e: e.name):
        if not entry.is_file(follow_symlinks=False) or not any(p.match(entry.name) for p in patterns):
            continue
        os.unlink(entry.path)
        removed.append(Path(entry.path))
    return removed
