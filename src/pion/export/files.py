"""The directory export files live in, and every file-system call made on it.

Safety rules, each enforced here:

- The directory is private: created mode 0700 (set so after ``mkdir``, whatever the
  umask). An existing one must be a real directory (not a symbolic link) owned by the
  server's user and already private (no group or other permission bits); a looser one
  is refused, naming its mode, and never changed: a directory the server did not create
  may be shared (``/tmp``, ``/dev/shm``), and tightening it would break its other users.
  Files are created 0600, exclusively (``O_EXCL``, ``O_NOFOLLOW``).
- Names are the server's own (``pion-<pid>-<serial>.safetensors``); nothing a client
  sends ever becomes part of a path, so no request can name a file outside it.
- Every call goes through one descriptor of the directory (``dir_fd``), so swapping
  the path for a symbolic link after it was checked changes nothing. If the directory
  is removed or replaced while we run, it is opened again (and checked again) before
  the next file is made.
- A file appears under its final name only once complete (written under a hidden
  temporary name, then renamed), and is never written again: it is only ever removed.
  A client that opens a path it was given sees the whole file or none.
- Files of processes that are gone (a crash, kill -9) are removed when the directory
  is first opened; files of a live process (another worker) are left alone.

Nothing is fsynced: the files are a cache of what the V-store holds, rebuilt on demand.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import logging
import os
import re
import stat
from pathlib import Path

from pion.errors import PionError

__all__ = ["SUFFIX", "ExportDir"]

log = logging.getLogger("pion.export")

SUFFIX = ".safetensors"
_MODE_DIR = 0o700
_MODE_FILE = 0o600
_SHARED_BITS = 0o077  # any permission for the group or for others
_OURS = re.compile(r"^\.?pion-(\d+)-(\d+)(?:\.safetensors|\.tmp)$")
_OPEN_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        return True
    return True


class ExportDir:
    """One export directory, opened lazily on first use."""

    def __init__(self, path: Path) -> None:
        self.path = Path(os.path.abspath(path))
        self._fd: int | None = None
        self._ident: tuple[int, int] | None = None
        self._serial = itertools.count(1)
        self._pid = os.getpid()

    # -- the directory ----------------------------------------------------------------

    def _descriptor(self) -> int:
        """The directory's descriptor, (re)opened and checked when needed."""
        if self._fd is not None:
            try:
                st = os.lstat(self.path)
                if (st.st_dev, st.st_ino) == self._ident:
                    return self._fd
            except FileNotFoundError:
                pass
            log.warning("export directory %s was removed or replaced; opening it again", self.path)
            self.close()
        self._open()
        if self._fd is None:  # _open sets it or raises
            raise PionError(f"V.EXPORT: cannot open the export directory {self.path}")
        return self._fd

    def _open(self) -> None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            created = False
            with contextlib.suppress(FileExistsError):
                os.mkdir(self.path, _MODE_DIR)
                created = True
            fd = os.open(self.path, _OPEN_DIR)
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                raise PionError(
                    f"V.EXPORT: the export directory {self.path} is not a directory "
                    "(a symbolic link or a file is in its place)"
                ) from None
            raise PionError(f"V.EXPORT: cannot open the export directory: {exc}") from None
        try:
            st = os.fstat(fd)
            if st.st_uid != os.geteuid():
                raise PionError(
                    f"V.EXPORT: the export directory {self.path} belongs to uid {st.st_uid}, "
                    f"not to this server's user (uid {os.geteuid()})"
                )
            mode = stat.S_IMODE(st.st_mode)
            if created and mode != _MODE_DIR:
                os.fchmod(fd, _MODE_DIR)  # ours, made just now: the umask narrowed it
            elif mode & _SHARED_BITS:
                raise PionError(
                    f"V.EXPORT: the export directory {self.path} has mode {mode:o}, open to "
                    "other users; it must be private to this server's user (no group or "
                    "other permissions, e.g. 700). The server never changes the mode of a "
                    "directory it did not create: chmod it yourself, or point --export-dir "
                    "at a path that does not exist yet (the server creates it 700)"
                )
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        self._ident = (st.st_dev, st.st_ino)
        self._sweep(fd)

    def _sweep(self, fd: int) -> None:
        """Remove the files of processes that are gone (and any of this pid: a
        previous process that had it)."""
        removed = 0
        with os.scandir(fd) as entries:
            for entry in entries:
                m = _OURS.match(entry.name)
                if m is None or not entry.is_file(follow_symlinks=False):
                    continue
                pid = int(m.group(1))
                if pid == self._pid or not _pid_alive(pid):
                    self._unlink(fd, entry.name)
                    removed += 1
        if removed:
            log.info("removed %d export file(s) left by stopped servers in %s", removed, self.path)

    def free_bytes(self) -> int:
        """Bytes an unprivileged writer may still use on the directory's file system."""
        st = os.fstatvfs(self._descriptor())
        return int(st.f_bavail) * int(st.f_frsize)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
            self._ident = None

    # -- files ------------------------------------------------------------------------

    def new_name(self) -> str:
        """A final name no file of this directory has had (pid and serial)."""
        return f"pion-{self._pid}-{next(self._serial)}{SUFFIX}"

    def create(self, name: str) -> tuple[int, str]:
        """A new, empty, 0600 temporary file for ``name``: ``(descriptor, temp name)``.
        Publish it with :meth:`publish`, or :meth:`discard` it."""
        dir_fd = self._descriptor()
        temp = f".{name[: -len(SUFFIX)]}.tmp"
        try:
            fd = os.open(temp, _CREATE, _MODE_FILE, dir_fd=dir_fd)
        except OSError as exc:
            raise PionError(f"V.EXPORT: cannot create a file in {self.path}: {exc}") from None
        return fd, temp

    def publish(self, temp: str, name: str) -> str:
        """Give a complete temporary file its final name; returns its absolute path."""
        dir_fd = self._descriptor()
        os.rename(temp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        return os.path.join(self.path, name)

    def discard(self, temp: str) -> None:
        if self._fd is not None:
            self._unlink(self._fd, temp)

    def remove(self, name: str) -> None:
        """Remove a published file (a client that mapped it keeps its mapping)."""
        if self._fd is not None:
            self._unlink(self._fd, name)

    def holds(self, name: str, size: int) -> bool:
        """True while ``name`` is still our regular file of ``size`` bytes."""
        try:
            st = os.stat(name, dir_fd=self._descriptor(), follow_symlinks=False)
        except (OSError, PionError):
            return False
        return stat.S_ISREG(st.st_mode) and st.st_size == size

    @staticmethod
    def _unlink(dir_fd: int, name: str) -> None:
        try:
            os.unlink(name, dir_fd=dir_fd)
        except FileNotFoundError:
            pass
        except OSError as exc:
            log.warning("could not remove export file %s: %s", name, exc)
