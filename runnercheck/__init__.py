"""runnercheck: a GPU model runner in the style of vLLM's Model Runner V2, and the suite that proves it right.

Every module is imported under this one name (``runnercheck.impl``, ``runnercheck.reference``,
``runnercheck.checks``, ``runnercheck.stress``, ``runnercheck.bench``), so a user's own ``checks``
or ``impl`` package can never shadow ours.

The repository keeps the wings as top-level folders (the layout DESIGN.md fixes).  An installed
wheel holds them under ``runnercheck/`` (``package-dir`` in pyproject.toml maps each folder);
in a source checkout this package holds only this file and extends its own search path to the
checkout's root, so ``runnercheck.impl`` is the checkout's ``impl/`` with nothing installed
(``PYTHONPATH=<checkout>``), as on a GPU machine that cannot pip-install.
"""
from __future__ import annotations

from pathlib import Path

WINGS = ("impl", "reference", "checks", "stress", "bench")

_here = Path(__file__).resolve().parent
_checkout = _here.parent
if not (_here / "impl").is_dir() and (_checkout / "pyproject.toml").is_file() \
        and all((_checkout / wing / "__init__.py").is_file() for wing in WINGS):
    __path__.append(str(_checkout))  # type: ignore[name-defined]  # the package's own search path
