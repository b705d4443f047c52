"""Report folders written atomically, that never destroy what they did not write.

`check_out_dir(path, force=...)` says (`OutDirError`, one line) why a folder cannot be a report
folder, before a command runs for minutes:

* it names the current folder, one of its ancestors, ``/`` or ``$HOME`` (or an ancestor of it):
  a report replaces its folder as a whole, so it needs a folder of its own (``--force`` does not
  change this);
* it is a file, is not writable, or cannot be created;
* it is a non-empty folder that holds no runnercheck report (no `MANIFEST` written by runnercheck),
  unless ``force``: then that folder is moved aside, never deleted.

`atomic_report_folder(path)` is the only way commands write one::

    with atomic_report_folder(out) as tmp:     # a fresh temporary sibling of ``out``
        (tmp / "summary.json").write_text(...)
    # here ``out`` holds exactly the files written to ``tmp``, plus ``manifest.json``

On a clean exit the block's files get a ``manifest.json`` naming every file (size and sha256) and
the temporary folder takes the place of ``out`` (an atomic exchange on Linux,
`renameat2(RENAME_EXCHANGE)`; elsewhere two renames).  What ``out`` held before -- an earlier
report, or with ``force`` the user's files -- is moved, whole, to ``<out>.prev-<UTC time>`` beside
it (`ReportFolder.moved_aside` says where; the command prints it); an empty folder is simply
replaced.  So a run never leaves another run's files beside its own and never deletes one.
When the block raises (an error, `KeyboardInterrupt`), the temporary folder is removed, ``out`` is
left exactly as it was, and `FolderNotReplaced` is raised from the original error so the command
can say so in one line.  A command that wants to keep what finished before an interrupt catches
it inside the block, writes an incomplete report and lets the block end normally.

Folders are created with `os.mkdir`'s default mode, so the umask decides their permissions, the
same for every command's report.

A command writes its folder through `write_command_report` (the folder, the one stderr line when it was not
replaced, the line saying where earlier contents went) and ends with `run_exit_status` (0 passed, 1 failed, 130
interrupted with the "incomplete report" line): the same words and statuses from every command.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import datetime as _dt
import errno
import hashlib
import json
import os
import secrets
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Callable, Generic, TypeVar

MANIFEST = "manifest.json"
MANIFEST_VERSION = 1
GENERATOR = "runnercheck"


class OutDirError(ValueError):
    """An ``--out`` folder that cannot hold a report (see the module docstring for the rules)."""


class FolderNotReplaced(RuntimeError):
    """A run stopped before its report was complete; the previous folder was left intact."""

    @property
    def exit_status(self) -> int:
        """The command's exit status: `EXIT_INTERRUPTED` (130) when an interrupt stopped the run, else 1."""
        from runnercheck.checks.interrupts import EXIT_INTERRUPTED

        return EXIT_INTERRUPTED if isinstance(self.__cause__, KeyboardInterrupt) else 1


def _refused_place(out: Path) -> str | None:
    """Why ``out`` is a place no report may replace, or None."""
    target = out.resolve()
    cwd = Path.cwd().resolve()
    if target == cwd:
        return "it is the current folder"
    if target in cwd.parents:
        return "it is an ancestor of the current folder"
    home = os.path.expanduser("~")
    if home != "~":
        home_path = Path(home).resolve()
        if target == home_path:
            return "it is your home folder"
        if target in home_path.parents:
            return "it is an ancestor of your home folder"
    if target == Path(target.anchor):
        return "it is the root folder"
    return None


def is_report(folder: str | os.PathLike) -> bool:
    """Whether ``folder`` holds a manifest that runnercheck wrote (this version's or an older one's)."""
    try:
        doc = json.loads((Path(folder) / MANIFEST).read_text())
    except (OSError, ValueError):
        return False
    if not isinstance(doc, dict) or not isinstance(doc.get("files"), list):
        return False
    if doc.get("generator") == GENERATOR:
        return True
    # Manifests written before the generator key: version 1, every entry a path with its sha256.
    return doc.get("version") == 1 and all(isinstance(e, dict) and {"path", "bytes", "sha256"} <= e.keys()
                                           for e in doc["files"])


def _is_empty_folder(path: Path) -> bool:
    try:
        with os.scandir(path) as entries:
            return next(entries, None) is None
    except OSError:
        return False


def check_out_dir(path: str | os.PathLike, *, force: bool = False) -> Path:
    """``path`` as a `Path` when it can become a report folder; `OutDirError` with the reason otherwise."""
    if str(path) == "":
        raise OutDirError("--out must name a folder")
    out = Path(path)
    refused = _refused_place(out)
    if refused is not None:
        raise OutDirError(f"--out {path}: refused, {refused} (a report replaces its folder as a whole); "
                          f"name a folder of its own, e.g. --out runnercheck-report")
    if out.exists() or out.is_symlink():
        if not out.is_dir():
            raise OutDirError(f"--out {out}: exists and is not a folder")
        if not os.access(out, os.W_OK | os.X_OK):
            raise OutDirError(f"--out {out}: folder is not writable")
        if not force and not _is_empty_folder(out) and not is_report(out):
            raise OutDirError(f"--out {out}: the folder is not empty and holds no runnercheck report (no {MANIFEST}); "
                              f"name another folder, or pass --force to move it aside to {out}.prev-<time> "
                              f"(nothing is deleted)")
    ancestor = out.absolute().parent
    while not ancestor.exists():
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise OutDirError(f"--out {out}: {ancestor} is not a folder, so {out} cannot be created")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise OutDirError(f"--out {out}: cannot create it ({ancestor} is not writable)")
    return out


def _file_entry(root: Path, f: Path) -> dict:
    digest = hashlib.sha256(f.read_bytes()).hexdigest()
    return {"path": f.relative_to(root).as_posix(), "bytes": f.stat().st_size, "sha256": digest}


def write_manifest(root: Path) -> Path:
    """``root/manifest.json`` naming every file under ``root`` (sorted)."""
    files = sorted(p for p in root.rglob("*") if p.is_file() and p != root / MANIFEST)
    doc = {"generator": GENERATOR, "version": MANIFEST_VERSION, "files": [_file_entry(root, f) for f in files]}
    path = root / MANIFEST
    path.write_text(json.dumps(doc, indent=1) + "\n")
    return path


def read_manifest(root: str | os.PathLike) -> list[str]:
    """The relative paths ``root/manifest.json`` names."""
    doc = json.loads((Path(root) / MANIFEST).read_text())
    return [entry["path"] for entry in doc["files"]]


_RENAME_NOREPLACE = 1
_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def _renameat2(a: Path, b: Path, flags: int) -> bool | None:
    """Linux renameat2: True when done, False when it failed (errno set), None when unavailable here."""
    libc_name = ctypes.util.find_library("c")
    if libc_name is None:
        return None
    libc = ctypes.CDLL(libc_name, use_errno=True)
    renameat2 = getattr(libc, "renameat2", None)
    if renameat2 is None:
        return None
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    if renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), flags) == 0:
        return True
    if ctypes.get_errno() in (errno.ENOSYS, errno.EINVAL):  # old kernel, or a file system without the flag
        return None
    return False


def _exchange(a: Path, b: Path) -> bool:
    """Atomically swap two paths (Linux renameat2); False when the platform cannot."""
    return bool(_renameat2(a, b, _RENAME_EXCHANGE))


def _rename_noreplace(src: Path, dst: Path) -> None:
    """Rename ``src`` to ``dst``, never replacing an existing ``dst`` (`FileExistsError`)."""
    done = _renameat2(src, dst, _RENAME_NOREPLACE)
    if done:
        return
    if done is False and ctypes.get_errno() == errno.EEXIST:
        raise FileExistsError(errno.EEXIST, "exists", str(dst))
    if os.path.lexists(dst):  # no atomic no-replace here: check, then rename (the window is tiny)
        raise FileExistsError(errno.EEXIST, "exists", str(dst))
    os.rename(src, dst)


def _move_aside(folder: Path, out: Path) -> Path:
    """Move ``folder`` (what ``out`` held) to a fresh ``<out>.prev-<UTC time>[-N]`` beside ``out``."""
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    for n in range(1, 1000):
        aside = out.with_name(f"{out.name}.prev-{stamp}" + (f"-{n}" if n > 1 else ""))
        try:
            _rename_noreplace(folder, aside)
            return aside
        except FileExistsError:
            continue
    raise FileExistsError(errno.EEXIST, "no free name to move the earlier folder aside", str(out))


def _make_temporary(out: Path) -> Path:
    """A fresh hidden sibling of ``out``; `os.mkdir`'s default mode, so the umask decides its permissions."""
    while True:
        tmp = out.with_name(f".{out.name}.tmp-{secrets.token_hex(4)}")
        try:
            os.mkdir(tmp)
            return tmp
        except FileExistsError:
            continue


class ReportFolder:
    """`atomic_report_folder`'s context: entering yields the temporary folder; after a clean exit
    `moved_aside` is where ``out``'s earlier contents went (None when there were none)."""

    def __init__(self, path: str | os.PathLike, *, force: bool = False) -> None:
        self.path = check_out_dir(path, force=force)
        self.tmp: Path | None = None
        self.moved_aside: Path | None = None
        self._tmp_holds_earlier = False  # after an exchange the temporary name holds what out held

    def __enter__(self) -> Path:
        parent = self.path.absolute().parent
        parent.mkdir(parents=True, exist_ok=True)
        self.tmp = _make_temporary(self.path.absolute())
        return self.tmp

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        assert self.tmp is not None
        out = self.path.absolute()
        try:
            if exc is None:
                write_manifest(self.tmp)
                self.moved_aside = self._install(self.tmp, out)
                return
        except BaseException as e:
            exc = e
        if self._tmp_holds_earlier:  # the report is in place; the earlier folder could not be moved aside
            raise FolderNotReplaced(f"{self.path}: the report was written, but the folder's earlier contents could not "
                                    f"be moved aside ({type(exc).__name__}: {exc}); they are in {self.tmp}") from exc
        shutil.rmtree(self.tmp, ignore_errors=True)
        kept = "the previous report there is left intact" if out.exists() else "nothing was written there"
        raise FolderNotReplaced(f"{self.path}: the run stopped before its report was complete ({type(exc).__name__}"
                                f"{': ' + str(exc) if str(exc) else ''}); {kept}") from exc

    def _install(self, tmp: Path, out: Path) -> Path | None:
        """Make ``tmp`` be ``out``; returns where ``out``'s earlier contents were moved (None: it had none)."""
        if not os.path.lexists(out):
            try:
                _rename_noreplace(tmp, out)
                return None
            except FileExistsError:
                pass  # created meanwhile: handled below, like any existing folder
        if _exchange(tmp, out):
            self._tmp_holds_earlier = True
            if _is_empty_folder(tmp):
                try:
                    os.rmdir(tmp)  # an empty folder holds nothing to keep
                    self._tmp_holds_earlier = False
                    return None
                except OSError:
                    pass  # something appeared in it meanwhile: keep it like any other
            aside = _move_aside(tmp, out)
            self._tmp_holds_earlier = False
            return aside
        if _is_empty_folder(out):
            try:
                os.rmdir(out)
                os.rename(tmp, out)
                return None
            except OSError:
                pass
        aside = _move_aside(out, out)
        os.rename(tmp, out)
        return aside

    def moved_aside_line(self) -> str | None:
        """One line for the command's output when ``out`` had contents that were moved aside."""
        if self.moved_aside is None:
            return None
        return f"the earlier contents of {self.path} were moved to {self.moved_aside} (nothing was deleted)"


def atomic_report_folder(path: str | os.PathLike, *, force: bool = False) -> ReportFolder:
    """A context whose block writes the report into a temporary sibling of ``path``; see the module docstring."""
    return ReportFolder(path, force=force)


# --------------------------------------------------------------------------- a command's report and exit status

T = TypeVar("T")


@dataclass(frozen=True)
class WrittenReport(Generic[T]):
    """What `write_command_report` did: ``value`` is what the fill returned (None when the folder was not replaced);
    ``exit_status`` None when the report is in place, else the status the command exits with (its line printed)."""

    value: T | None
    exit_status: int | None


def write_command_report(command: str, out: str | os.PathLike, fill: Callable[[Path], T], *, force: bool = False,
                         echo: Callable[[str], object] = print) -> WrittenReport[T]:
    """``runnercheck COMMAND``'s report folder ``out``, as every command writes it: ``fill(tmp)`` writes the files
    into `atomic_report_folder`'s temporary folder (and may run the command itself: what it returns comes back in
    ``value``).  When the folder was not replaced (`FolderNotReplaced`: the fill raised, or was interrupted) the
    reason goes to stderr as ``runnercheck COMMAND: ...`` and ``exit_status`` is its status (1, or 130 for an
    interrupt); else the line saying where the folder's earlier contents went, if anywhere, goes to ``echo``."""
    folder = atomic_report_folder(out, force=force)
    try:
        with folder as tmp:
            value = fill(tmp)
    except FolderNotReplaced as e:
        print(f"runnercheck {command}: {e}", file=sys.stderr)
        return WrittenReport(None, e.exit_status)
    moved = folder.moved_aside_line()
    if moved:
        echo(moved)
    return WrittenReport(value, None)


def run_exit_status(command: str, out: str | os.PathLike, passed: bool, interrupted: str | None = None, *,
                    say_incomplete: bool = True) -> int:
    """A finished command's exit status: `EXIT_INTERRUPTED` (130) when ``interrupted`` (why the run stopped early:
    its report is incomplete, which, with ``say_incomplete``, stderr says as ``runnercheck COMMAND: <why>; incomplete
    report in OUT``), else 0 when ``passed``, 1 when not."""
    from runnercheck.checks.interrupts import EXIT_INTERRUPTED

    if interrupted:
        if say_incomplete:
            print(f"runnercheck {command}: {interrupted}; incomplete report in {out}", file=sys.stderr)
        return EXIT_INTERRUPTED
    return 0 if passed else 1


__all__ = ["MANIFEST", "OutDirError", "FolderNotReplaced", "ReportFolder", "WrittenReport", "check_out_dir",
           "atomic_report_folder", "is_report", "write_manifest", "read_manifest", "run_exit_status", "write_command_report"]
