"""One writer per store: an advisory lock with stale-lock recovery.

A fit (or the resume of an unfinished fit) holds the store's **writer lock** for as
long as it writes tables or state; a second writer, in this or any other process, is
refused at once with :class:`StoreLockedError` naming the holder (pid, host, since
when).  Readers of a finished fit take the lock **shared** for the moment they read
the state, so they never see a store that a writer is rebuilding.

The lock is ``STORE/fsll.lock``, held with ``flock(2)``: the kernel releases it when the
holding process dies, however it dies (``SIGKILL`` included), so a lock left by a
killed fit is recovered automatically by the next writer, which reports it as
``StoreLock.recovered`` (the dead holder's record).  The file itself stays; its
content (JSON) records the current or last writer.

Filesystems without ``flock`` (some FUSE/network mounts) fall back to a lock directory
``STORE/fsll.lock.d`` created atomically with ``mkdir``; there a lock is stale when its
recorded holder is on this host and no longer runs (pid gone, or reused by a process
started later).  A lock held from another host cannot be checked and is never broken
automatically: remove ``fsll.lock.d`` by hand once you know that fit is gone.

>>> import tempfile
>>> d = tempfile.mkdtemp()
>>> with StoreLock(d, purpose="fit") as lk:
...     try:
...         StoreLock(d).acquire()
...     except StoreLockedError as e:
...         print("refused:", "held by pid" in str(e))
refused: True
"""
from __future__ import annotations

import errno
import json
import os
import socket
import threading
import time
import uuid
from pathlib import Path

from .files import open_nofollow

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX
    fcntl = None

__all__ = ["StoreLock", "StoreLockedError", "LOCK_FILE", "read_holder", "pid_alive"]

LOCK_FILE = "fsll.lock"
LOCK_DIR = "fsll.lock.d"
#: Use flock(2) when the filesystem supports it (tests switch this off to exercise the fallback).
USE_FLOCK = fcntl is not None
#: A writer refused only because readers hold the lock retries for this long (seconds).
READER_WAIT = 5.0


class StoreLockedError(RuntimeError):
    """Another process (or another fit in this process) is using the store."""

    def __init__(self, store, holder: dict | None, shared: bool, detail: str = ""):
        self.store = str(store)
        self.holder = holder
        if holder and holder.get("state") == "held":
            who = (f"held by pid {holder.get('pid')} on {holder.get('host')} "
                   f"({holder.get('purpose', 'fit')} since {holder.get('since', '?')})")
        else:
            who = "in use by another process (reading)"
        what = "read" if shared else "write"
        msg = f"store {self.store} is locked: {who}; cannot {what} it now"
        if not shared:
            msg += " (one writer per store; wait for it to finish or use another store)"
        if detail:
            msg += f" {detail}"
        super().__init__(msg)


def _start_time(pid: int) -> float | None:
    """Start time of ``pid`` (seconds since boot, Linux), to tell a reused pid apart."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            rest = fh.read().rsplit(")", 1)[1].split()
        return int(rest[19]) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def pid_alive(pid: int, start: float | None = None) -> bool:
    """Is process ``pid`` (started at ``start``, if known) running on this host?"""
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    except (OverflowError, ValueError):
        return False
    if start is not None:
        now = _start_time(int(pid))
        if now is not None and abs(now - float(start)) > 1.0:
            return False  # the pid was reused by a later process
    return True


def read_holder(store) -> dict | None:
    """The record of the current or last writer of ``store`` (None if there is none)."""
    for p in (Path(store) / LOCK_FILE, Path(store) / LOCK_DIR / "holder.json"):
        try:
            obj = json.loads(p.read_text() or "null")
        except (OSError, ValueError):
            continue
        if isinstance(obj, dict):
            return obj
    return None


class StoreLock:
    """The writer (or shared reader) lock of one store directory.

    ``acquire()`` never blocks on a writer: it raises :class:`StoreLockedError`.  Use as a
    context manager, or call :meth:`release`.
    """

    def __init__(self, store, purpose: str = "fit"):
        self.store = Path(store)
        self.purpose = purpose
        self.shared = False
        self.recovered: dict | None = None  # record of a dead holder whose lock was taken over
        self._fd: int | None = None
        self._dir: Path | None = None
        self._token = uuid.uuid4().hex
        self._mutex = threading.Lock()
        self._pid = os.getpid()
        self._tried = False

    # ------------------------------------------------------------------ public
    @property
    def held(self) -> bool:
        return self._fd is not None or self._dir is not None

    def acquire(self, shared: bool = False, create: bool = True) -> "StoreLock":
        """Take the lock (exclusive by default); raise :class:`StoreLockedError` if another holds it."""
        with self._mutex:
            if self.held:
                raise RuntimeError("this StoreLock is already held")
            self._tried = True
            if create:
                self.store.mkdir(parents=True, exist_ok=True)
            self.shared = shared
            self._pid = os.getpid()
            if USE_FLOCK:
                try:
                    return self._acquire_flock(shared)
                except _NoFlock:
                    pass
            return self._acquire_dir(shared)

    def release(self) -> None:
        with self._mutex:
            if self._fd is not None and os.getpid() != self._pid:  # a forked child: the lock is the parent's
                os.close(self._fd)
                self._fd = None
            if self._fd is not None:
                fd, self._fd = self._fd, None
                try:
                    if not self.shared:
                        self._write_record(fd, "released")
                finally:
                    try:
                        fcntl.flock(fd, fcntl.LOCK_UN)
                    finally:
                        os.close(fd)
            if self._dir is not None:
                d, self._dir = self._dir, None
                if not self.shared:
                    try:
                        holder = json.loads((d / "holder.json").read_text())
                    except (OSError, ValueError):
                        holder = None
                    if holder and holder.get("token") == self._token:
                        for f in d.iterdir():
                            f.unlink()
                        d.rmdir()

    def __enter__(self) -> "StoreLock":
        if not self._tried:
            self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()

    def __del__(self):  # a forgotten lock must not outlive its object
        try:
            if self.held:
                self.release()
        except Exception:  # noqa: BLE001
            pass

    # ------------------------------------------------------------------ flock
    def _record(self, state: str) -> dict:
        return {"pid": os.getpid(), "host": socket.gethostname(), "purpose": self.purpose,
                "since": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "start": _start_time(os.getpid()),
                "token": self._token, "state": state}

    def _write_record(self, fd: int, state: str) -> None:
        data = json.dumps(self._record(state)).encode()
        os.ftruncate(fd, 0)
        os.pwrite(fd, data, 0)
        try:
            os.fsync(fd)
        except OSError:
            pass

    def _acquire_flock(self, shared: bool) -> "StoreLock":
        path = self.store / LOCK_FILE
        try:
            fd = open_nofollow(path, os.O_RDWR | os.O_CREAT)
        except OSError as e:
            if not shared or e.errno not in (errno.EACCES, errno.EROFS, errno.EPERM):
                raise
            try:  # a reader on a read-only store
                fd = open_nofollow(path, os.O_RDONLY)
            except FileNotFoundError:
                self._fd = None
                return self  # nothing to share a lock with: no writer ever used this store
        deadline = time.monotonic() + READER_WAIT
        while True:
            try:
                fcntl.flock(fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                holder = read_holder(self.store)
                writer = holder is not None and holder.get("state") == "held"
                if writer or shared or time.monotonic() > deadline:
                    os.close(fd)
                    raise StoreLockedError(self.store, holder, shared) from None
                time.sleep(0.05)  # only readers hold it, and only for a moment
            except OSError as e:
                os.close(fd)
                if e.errno in (errno.ENOLCK, errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
                    raise _NoFlock() from None
                raise
        self._fd = fd
        if not shared:
            prev = read_holder(self.store)
            if prev is not None and prev.get("state") == "held":
                self.recovered = prev  # its holder died without releasing: the kernel freed the flock
            try:
                self._write_record(fd, "held")
            except OSError:
                self.release()
                raise
        return self

    # ------------------------------------------------------------------ fallback: lock directory
    def _acquire_dir(self, shared: bool) -> "StoreLock":
        d = self.store / LOCK_DIR
        if shared:  # readers only check that no live writer holds it
            holder = read_holder(self.store) if d.exists() else None
            if holder is not None and not self._is_stale(holder):
                raise StoreLockedError(self.store, holder, shared)
            return self
        for _ in range(3):
            try:
                d.mkdir()
            except FileExistsError:
                try:
                    holder = json.loads((d / "holder.json").read_text())
                except (OSError, ValueError):
                    holder = None
                if holder is None:
                    # being created right now, or its creator died before writing: give it a moment
                    time.sleep(0.2)
                    try:
                        holder = json.loads((d / "holder.json").read_text())
                    except (OSError, ValueError):
                        age = time.time() - d.stat().st_mtime if d.exists() else 0
                        if age < 10:
                            raise StoreLockedError(self.store, None, shared) from None
                        holder = {"state": "held", "pid": None, "host": socket.gethostname(), "start": None}
                if not self._is_stale(holder):
                    raise StoreLockedError(self.store, holder, shared) from None
                # stale: move it aside atomically (only one recoverer's rename succeeds) and retry
                aside = self.store / f"{LOCK_DIR}.stale-{self._token}"
                try:
                    os.rename(d, aside)
                except OSError:
                    continue
                self.recovered = holder
                for f in aside.iterdir():
                    f.unlink()
                aside.rmdir()
                continue
            tmp = d / f".holder.{self._token}"
            tmp.write_text(json.dumps(self._record("held")))
            os.replace(tmp, d / "holder.json")
            self._dir = d
            return self
        raise StoreLockedError(self.store, read_holder(self.store), shared, "(lock changed hands repeatedly)")

    @staticmethod
    def _is_stale(holder: dict) -> bool:
        if holder.get("host") != socket.gethostname():
            return False  # cannot check another host's processes
        pid = holder.get("pid")
        if pid is None:
            return True
        return not pid_alive(pid, holder.get("start"))


class _NoFlock(Exception):
    pass
