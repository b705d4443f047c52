"""JUnit XML for CI systems: one ``<testsuite>`` per run of a command, one ``<testcase>`` per check.

Renderers read findings; this module knows nothing about what produced them.  Each command
(`verify`, `mutants`, `chisq`) maps its own results to `JUnitCase` rows: a run, a mutant or a
statistical test becomes one case, its first divergence or rejection the failure message, and
seeds or repro paths its properties.  The XML follows the schema CI servers read (Jenkins,
GitLab, GitHub test reporters): ``tests``/``failures``/``skipped``/``time`` on the suite,
``<failure message=...>``, ``<skipped message=...>`` and ``<properties>`` on cases.
"""
from __future__ import annotations

import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Sequence


class JUnitError(ValueError):
    """A case that cannot be rendered (both failed and skipped, or an empty name)."""


@dataclass(frozen=True)
class JUnitCase:
    name: str
    classname: str
    time_s: float = 0.0  # the case's own measured wall time; 0 for a case that ran no work (a gate, a skip)
    failure: str | None = None
    failure_details: str = ""
    skipped: str | None = None
    properties: Mapping[str, object] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.name:
            raise JUnitError("a JUnit case needs a name")
        if self.failure is not None and self.skipped is not None:
            raise JUnitError(f"case {self.name!r} is both failed and skipped")


def suite_name(command: str) -> str:
    """The suite name of a command's results: the command that produced them (``runnercheck verify``)."""
    return f"runnercheck {command}"


def _properties(parent: ET.Element, props: Mapping[str, object]) -> None:
    if not props:
        return
    node = ET.SubElement(parent, "properties")
    for key, value in props.items():
        ET.SubElement(node, "property", name=str(key), value=str(value))


def junit_tree(suite_name: str, cases: Sequence[JUnitCase], properties: Mapping[str, object] | None = None,
               elapsed_s: float | None = None) -> ET.ElementTree:
    """The XML tree; the suite's time is ``elapsed_s`` (the command's wall time: cases may run side by
    side, or time go to work outside any case), else the sum of its cases' times."""
    failures = sum(c.failure is not None for c in cases)
    skipped = sum(c.skipped is not None for c in cases)
    total_time = max(elapsed_s, 0.0) if elapsed_s is not None else sum(max(c.time_s, 0.0) for c in cases)
    suites = ET.Element("testsuites", name=suite_name, tests=str(len(cases)), failures=str(failures),
                        errors="0", skipped=str(skipped), time=f"{total_time:.3f}")
    suite = ET.SubElement(suites, "testsuite", name=suite_name, tests=str(len(cases)), failures=str(failures),
                          errors="0", skipped=str(skipped), time=f"{total_time:.3f}")
    _properties(suite, properties or {})
    for case in cases:
        node = ET.SubElement(suite, "testcase", name=case.name, classname=case.classname, time=f"{max(case.time_s, 0.0):.3f}")
        _properties(node, case.properties)
        if case.failure is not None:
            # The first line is what CI lists; the whole text goes in the element body.
            failure = ET.SubElement(node, "failure", message=case.failure.splitlines()[0] if case.failure else "failed",
                                    type="runnercheck.Finding")
            failure.text = "\n".join(t for t in (case.failure, case.failure_details) if t)
        elif case.skipped is not None:
            ET.SubElement(node, "skipped", message=case.skipped)
    ET.indent(suites)
    return ET.ElementTree(suites)


def write_junit(path: str | Path, suite_name: str, cases: Sequence[JUnitCase],
                properties: Mapping[str, object] | None = None, elapsed_s: float | None = None) -> Path:
    """Write the cases as JUnit XML to `path` (parents created); returns the path (``elapsed_s``: `junit_tree`)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tree = junit_tree(suite_name, cases, properties, elapsed_s)
    tmp = path.with_name(path.name + ".tmp")
    tree.write(tmp, encoding="utf-8", xml_declaration=True)
    tmp.replace(path)
    return path
