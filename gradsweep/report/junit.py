"""JUnit XML: one testcase per cell; red and error are failures, blocked and skipped are skipped."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import Sequence

from gradsweep.evidence.predicate import Predicate
from gradsweep.report.labels import detail


def render_junit(pred: Predicate, banners: Sequence[str] = ()) -> str:
    """Banners (UNVERIFIED, non-default code) go into the suites' name and each suite's properties."""
    flag = " (UNVERIFIED)" if any(b.startswith("UNVERIFIED") for b in banners) else ""
    suites = ET.Element("testsuites", name=f"gradsweep {pred.manifest.name}{flag}")
    by_profile: dict[str, list] = {}
    for rec in pred.cells:
        by_profile.setdefault(rec.result.key.profile, []).append(rec)
    for profile in sorted(by_profile):
        recs = by_profile[profile]
        failures = sum(1 for r in recs if r.result.status.is_red or r.result.status.value == "error")
        skipped = sum(1 for r in recs if r.result.status.is_blocked or r.result.status.value == "skipped")
        suite = ET.SubElement(suites, "testsuite", name=profile, tests=str(len(recs)), failures=str(failures),
                              errors="0", skipped=str(skipped),
                              time=f"{sum(r.result.duration_s for r in recs):.3f}")
        if banners:
            props = ET.SubElement(suite, "properties")
            for i, banner in enumerate(banners):
                ET.SubElement(props, "property", name=f"gradsweep.warning.{i}", value=banner)
        for rec in recs:
            key = rec.result.key
            case = ET.SubElement(suite, "testcase", classname=f"gradsweep.{profile}.{key.op}",
                                 name=key.layout, time=f"{rec.result.duration_s:.3f}")
            status = rec.result.status
            message = f"{status.value}: {detail(rec)}"
            if status.is_red:
                tag = "tracked" if rec.tracked is not None else "UNTRACKED"
                ET.SubElement(case, "failure", message=f"{tag} {message}", type=status.value).text = message
            elif status.value == "error":
                ET.SubElement(case, "failure", message=message, type="error").text = message
            elif status.is_blocked or status.value == "skipped":
                ET.SubElement(case, "skipped", message=message)
    ET.indent(suites)
    return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(suites, encoding="unicode") + "\n"
