"""Report folders written atomically, and ``--out`` checked before any work.

`check_out_dir(path)` says (`OutDirError`) why a folder cannot be a report folder -- it is a
file, it is not writable, or it cannot be created -- so a command refuses it before it runs for
minutes.  `atomic_report_folder(path)` is the only way commands write one::

    with atomic_report_folder(out) as tmp:     # a fresh temporary sibling of ``out``
        (tmp / "summary.json").write_text(...)
    # here ``out`` holds exactly the files written to ``tmp``, plus ``manifest.json``

On a clean exit the block's files get a ``manifest.json`` naming every file (size and sha256) and
the temporary folder replaces ``out`` in one rename (an atomic exchange with the old folder on
Linux, `renameat2(RENAME_EXCHANGE)`; elsewhere the old folder is moved aside first).  A run
therefore never leaves another run's files beside its own.  When the block raises (an error, an
interrupt, `KeyboardInterrupt`), the temporary folder is removed, the previous ``out`` is left
exactly as it was, and `FolderNotReplaced` is raised from the original error so the command can
say so in one line.
"""
from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Iterator

MANIFEST = "manifest.json"
MANIFEST_VERSION = 1


class OutDirError(ValueError):
    """An ``--out`` folder that cannot hold a report (a file, not writable, not creatable)."""


class FolderNotReplaced(RuntimeError):
    """A run stopped before its report was complete; the previous folder was left intact."""


def check_out_dir(path: str | os.PathLike) -> Path:
    """``path`` as a `Path` when it can become a report folder; `OutDirError` with the reason otherwise."""
    out = Path(path)
    if str(path) == "":
        raise OutDirError("--out must name a folder")
    if out.exists() or out.is_symlink():
        if not out.is_dir():
            raise OutDirError(f"--out {out}: exists and is not a folder")
        if not os.access(out, os.W_OK | os.X_OK):
            raise OutDirError(f"--out {out}: folder is not writable")
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
    doc = {"version": MANIFEST_VERSION, "files": [_file_entry(root, f) for f in files]}
    path = root / MANIFEST
    path.write_text(json.dumps(doc, indent=1) + "\n")
    return path


def read_manifest(root: str | os.PathLike) -> list[str]:
    """The relative paths ``root/manifest.json`` names."""
    doc = json.loads((Path(root) / MANIFEST).read_text())
    return [entry["path"] for entry in doc["files"]]


_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def _exchange(a: Path, b: Path) -> bool:
    """Atomically swap two paths (Linux renameat2); False when the platform cannot."""
    libc_name = ctypes.util.find_library("c")
    if libc_name is None:
        return False
    libc = ctypes.CDLL(libc_name, use_errno=True)
    renameat2 = getattr(libc, "renameat2", None)
    if renameat2 is None:
        return False
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    return renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0


def _replace(tmp: Path, out: Path) -> None:
    """Make ``tmp`` be ``out``; the old ``out`` (if any) is removed afterwards."""
    if not out.exists():
        os.rename(tmp, out)
        return
    if _exchange(tmp, out):
        shutil.rmtree(tmp, ignore_errors=True)  # tmp now holds the old folder
        return
    aside = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=out.parent))
    os.rename(out, aside / out.name)
    os.rename(tmp, out)
    shutil.rmtree(aside, ignore_errors=True)


@contextlib.contextmanager
def atomic_report_folder(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary sibling of ``path`` to write the report into; see the module docstring."""
    out = check_out_dir(path)
    out.absolute().parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.absolute().parent))
    try:
        yield tmp
        write_manifest(tmp)
        _replace(tmp, out.absolute())
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)
        kept = "the previous report there is left intact" if out.exists() else "nothing was written there"
        raise FolderNotReplaced(f"{out}: the run stopped before its report was complete ({type(e).__name__}"
                                f"{': ' + str(e) if str(e) else ''}); {kept}") from e


__all__ = ["MANIFEST", "OutDirError", "FolderNotReplaced", "check_out_dir", "atomic_report_folder", "write_manifest",
           "read_manifest"]
