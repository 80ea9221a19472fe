"""Bench evidence for people: the rich table of ratios, markdown (the README's performance table, a CI step
summary), JUnit, and what ``verify`` says about it. Readers verify first, as for sweep evidence."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console
from rich.table import Table
from rich.text import Text

from gradsweep.bench.predicate import BenchPredicate, CaseRecord, FamilyResult, TargetResult, backward_text
from gradsweep.evidence.verify import EvidenceError
from gradsweep.report.readers import Opened, open_signed

SMOKE = "SMOKE RUN (--quick or no GPU): the machinery ran on tiny shapes; these numbers are not figures"


def open_bench(path: Path, trusted_keys: list[Path] | None, trust_file: Path | None,
               allow_unverified: bool) -> Opened[BenchPredicate]:
    """Bench evidence, verified first (EvidenceError unless ``allow_unverified``, which reads and flags)."""
    from gradsweep.bench.evidence import BenchEvidenceError, check_bench_signature, read_bench

    def read(p: Path) -> BenchPredicate:
        try:
            return read_bench(p)
        except BenchEvidenceError as bad:
            raise EvidenceError(str(bad)) from None

    return open_signed(path, trusted_keys, trust_file, allow_unverified, check_bench_signature, read)


# ------------------------------------------------------------------------------------------------ formatting
def fmt_metric(metric: str, value: float | None) -> str:
    if value is None:
        return "-"
    if metric.startswith(("copy_fraction", "gemm_fraction")):
        return f"{100 * value:.0f}%"
    if metric == "peak_extra_gib":
        return f"{value:.2f} GiB"
    if metric == "host_us":
        return f"{value:.0f} us"
    return f"{value:.2f}x"


def fmt_ms(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.3f}" if value < 10 else f"{value:.1f}"


def target_text(t: TargetResult) -> str:
    op = "<=" if t.sense == "max" else ">="
    state = "met" if t.met else "MISSED" if t.met is False else f"not measured: {t.reason}" if t.reason else "-"
    return f"{t.metric} {op} {fmt_metric(t.metric, t.bound)}: {fmt_metric(t.metric, t.value)} {state} (#{t.issue})"


def twins(metric: str) -> tuple[str | None, str | None]:
    """(end-to-end metric, kernels-only metric) of a metric's pair (None where the pair has no such side)."""
    if metric.startswith("kernels_vs_"):
        return "e2e_vs_" + metric.removeprefix("kernels_vs_"), metric
    if metric.startswith("e2e_vs_") and metric != "e2e_vs_kernels":
        return metric, "kernels_vs_" + metric.removeprefix("e2e_vs_")
    if metric.startswith("copy_fraction"):
        return "copy_fraction", "copy_fraction_kernels"
    return metric, None


def _other(case: CaseRecord, fam: FamilyResult) -> str:
    shown = []
    for name in case.references:
        if name == "stock":
            continue
        ref = case.references[name]
        value = fam.metrics.get(f"e2e_vs_{name}")
        shown.append(f"vs {name} {fmt_metric('x', value)}" if ref.status == "ok" else f"{name} {ref.status}")
    for metric in ("copy_fraction", "gemm_fraction", "e2e_vs_kernels", "host_vs_e2e", "peak_extra_gib", "host_us"):
        if metric in fam.metrics:
            label = {"e2e_vs_kernels": "e2e/kernels", "host_vs_e2e": "host/e2e"}.get(
                metric, metric.replace("_fraction", ""))
            shown.append(f"{label} {fmt_metric(metric, fam.metrics[metric])}")
    return ", ".join(shown)


def _status_text(fam: FamilyResult) -> Text:
    styles = {"ok": ("ok", "green"), "check_failed": ("FAIL", "bold red"), "error": ("ERROR", "bold red"),
              "blocked": ("blocked", "dim")}
    text, style = styles[fam.status]
    return Text(text, style=style)


def _targets_text(fam: FamilyResult) -> Text:
    out = Text()
    for i, t in enumerate(fam.targets):
        style = "green" if t.met else "bold red" if t.met is False else "yellow"
        out.append(("\n" if i else "") + target_text(t), style=style)
    return out


def bench_table(pred: BenchPredicate) -> Table:
    gpu = pred.runs[0].provenance.gpu_name or "no GPU"
    title = f"gradsweep bench: {pred.manifest.name} on {gpu}"
    if pred.ceilings is not None:
        title += (f" (copy {pred.ceilings.copy_gbps:.0f} GB/s, cuBLAS bf16 {pred.ceilings.gemm_tflops:.0f} "
                  f"TFLOP/s{pred.ceilings.host_text()}, same run)")
    table = Table(title=title, show_lines=False)
    for col in ("op", "case", "family", "e2e ms", "stock ms", "e2e/stock", "kernels/stock", "other", "targets",
                "check"):
        table.add_column(col, justify="right" if col.endswith(("ms", "stock")) else "left")
    for case in pred.cases:
        stock = case.references.get("stock")
        for name, fam in case.families.items():
            m = fam.measured
            table.add_row(case.op, case.title, name, fmt_ms(m.e2e_ms if m else None),
                          fmt_ms(stock.e2e_ms if stock else None),
                          fmt_metric("x", fam.metrics.get("e2e_vs_stock")),
                          fmt_metric("x", fam.metrics.get("kernels_vs_stock")),
                          fam.reason if fam.status in ("blocked", "error") else _other(case, fam),
                          _targets_text(fam), _status_text(fam))
    return table


def render_bench(pred: BenchPredicate, console: Console, banners: Sequence[str] = (), note: str | None = None) -> None:
    """Banners, the table, failures in full, the summary; banners again at the end."""
    shown = [*banners, *([] if pred.claims_figures else [SMOKE])]
    for banner in shown:
        console.print(Text(banner, style="bold white on red"))
    if note:
        console.print(Text(note, style="dim"))
    console.print(bench_table(pred))
    console.print(Text(backward_text(pred.runs[0].backward_thread), style="dim"))
    for case in pred.cases:
        for name, fam in case.families.items():
            for c in fam.checks:
                if not c.passed:
                    console.print(Text(f"FAILED {case.id} [{name}] {c.name}: {c.detail}", style="bold red"))
            if fam.status == "error":
                console.print(Text(f"ERROR {case.id} [{name}]: {fam.reason}", style="bold red"))
        for ref in case.references.values():
            if ref.status == "error":
                console.print(Text(f"ERROR {case.id} [{ref.label}]: {ref.reason}", style="red"))
    absent = [a for a in pred.anchors if not a.installed]
    if absent:
        console.print(Text("anchors absent: " + "; ".join(f"{a.name}: {a.reason}" for a in absent), style="dim"))
    style = "bold green" if pred.verdict.exit_code == 0 else "bold red"
    console.print(Text(pred.verdict.summary, style=style))
    for banner in shown:
        console.print(Text(banner, style="bold white on red"))


def _esc(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _untargeted_metric(fam: FamilyResult) -> str:
    """The row of a family with no target: its ratio to stock, else its first other same-run ratio (e.g. to
    SDPA), else its first figure (e.g. host microseconds): a measured figure is never shown as "-"."""
    if "e2e_vs_stock" in fam.metrics or not fam.metrics:
        return "e2e_vs_stock"
    ratios = [m for m in fam.metrics if m.startswith("e2e_vs_") and m != "e2e_vs_kernels"]
    return ratios[0] if ratios else next(iter(fam.metrics))


TABLE_HEAD = "| op | case | family | metric | end to end | kernels only | host / e2e | target | |"
TABLE_RULE = "|---|---|---|---|---|---|---|---|---|"
HOST_NOTE = ("host / e2e: the family's host time issuing the timed calls over their end-to-end time (same samples); "
             "near 1.00x the step is host-bound (the device waited for Python), well under it device-bound.")


def _md_rows(pred: BenchPredicate) -> list[str]:
    rows = []
    for case in pred.cases:
        for name, fam in case.families.items():
            if fam.status == "blocked":
                continue
            metrics = [t.metric for t in fam.targets] or [_untargeted_metric(fam)]
            for metric in dict.fromkeys(metrics):
                e2e, kernels = twins(metric)
                target = next((t for t in fam.targets if t.metric == metric), None)
                bound = "-" if target is None else f"{'<=' if target.sense == 'max' else '>='} " \
                    f"{fmt_metric(metric, target.bound)} (#{target.issue})"
                state = "-" if target is None else "met" if target.met else "**missed**" if target.met is False \
                    else "not measured"
                if fam.status != "ok":
                    state = f"**{fam.status}**"
                host = fmt_metric("host_vs_e2e", fam.metrics.get("host_vs_e2e")) if e2e else "-"
                rows.append(f"| {case.op} | {_esc(case.title)} | {name} | {metric} | "
                            f"{fmt_metric(metric, fam.metrics.get(e2e)) if e2e else '-'} | "
                            f"{fmt_metric(metric, fam.metrics.get(kernels)) if kernels else '-'} | {host} | {bound} | "
                            f"{state} |")
    return rows


def render_bench_markdown(pred: BenchPredicate, banners: Sequence[str] = (), note: str | None = None) -> str:
    """Markdown: the header, then one row per (case, family, targeted metric); the README's performance table."""
    run = pred.runs[0]
    prov = run.provenance
    where = f"{prov.gpu_name or 'no GPU'} ({prov.sm or 'no CUDA'}), torch {prov.torch}, triton {prov.triton}"
    icon = "✅" if pred.verdict.exit_code == 0 else "❌"
    out = [f"## gradsweep bench: {pred.manifest.name} {icon}", "",
           *[f"> **⚠️ {_esc(b)}**\n" for b in [*banners, *([] if pred.claims_figures else [SMOKE])]],
           *([f"_{_esc(note)}_", ""] if note else []),
           f"**{_esc(pred.verdict.summary)}** (exit {pred.verdict.exit_code})", "",
           f"Ran {run.started_at} on {_esc(where)}; source `{pred.source.sha256[:16]}`, git "
           f"{(prov.git_commit or 'n/a')[:12]}{' (dirty)' if prov.git_dirty else ''}; targets "
           f"{pred.targets.path} v{pred.targets.version}; {backward_text(run.backward_thread)}."]
    if pred.ceilings is not None:
        out += ["", f"Ceilings of the same run: copy {pred.ceilings.copy_gbps:.0f} GB/s, cuBLAS bf16 "
                    f"{pred.ceilings.gemm_tflops:.0f} TFLOP/s{pred.ceilings.host_text()}. End to end: the public "
                    "call as a trainer makes it "
                    "(planning, uploads, launches, kernels); kernels only: device busy time."]
    out += ["", HOST_NOTE, "", TABLE_HEAD, TABLE_RULE, *_md_rows(pred)]
    return "\n".join(out) + "\n"


def readme_block(pred: BenchPredicate, evidence: str) -> str:
    """The README's performance table: where it came from, the run's ceilings, one row per targeted metric."""
    run = pred.runs[0]
    prov = run.provenance
    lines = [f"Generated from `{evidence}` (signed; `gradsweep verify {evidence}`) by "
             f"`python -m gradsweep.report.bench_readme {evidence}`: {prov.gpu_name or 'no GPU'}, {run.started_at}, "
             f"git {(prov.git_commit or 'n/a')[:12]}; {backward_text(run.backward_thread)}; "
             f"{_esc(pred.verdict.summary)}."]
    if not pred.claims_figures:
        lines.append(f"**{SMOKE}.**")
    if pred.ceilings is not None:
        lines.append(f"Same-run ceilings: copy {pred.ceilings.copy_gbps:.0f} GB/s, cuBLAS bf16 "
                     f"{pred.ceilings.gemm_tflops:.0f} TFLOP/s{pred.ceilings.host_text()}. End to end = what a "
                     "training step pays (planning, "
                     "uploads, launches, kernels); kernels only = device busy time.")
    lines += [HOST_NOTE, "", TABLE_HEAD, TABLE_RULE, *_md_rows(pred)]
    return "\n".join(lines) + "\n"


def render_bench_junit(pred: BenchPredicate, banners: Sequence[str] = ()) -> str:
    """One testcase per (case, family): a failed check or an error is a failure, blocked is skipped; targets are
    properties (a missed target is a finding, not a failure: the bench exits 0)."""
    flag = " (UNVERIFIED)" if any(b.startswith("UNVERIFIED") for b in banners) else ""
    suites = ET.Element("testsuites", name=f"gradsweep bench {pred.manifest.name}{flag}")
    by_family: dict[str, list[tuple[CaseRecord, FamilyResult]]] = {}
    for case in pred.cases:
        for name, fam in case.families.items():
            by_family.setdefault(name, []).append((case, fam))
    for family in sorted(by_family):
        rows = by_family[family]
        failures = sum(f.status in ("check_failed", "error") for _, f in rows)
        skipped = sum(f.status == "blocked" for _, f in rows)
        suite = ET.SubElement(suites, "testsuite", name=f"bench.{family}", tests=str(len(rows)),
                              failures=str(failures), errors="0", skipped=str(skipped))
        for case, fam in rows:
            tc = ET.SubElement(suite, "testcase", classname=f"gradsweep.bench.{family}.{case.op}", name=case.name,
                               time=f"{(fam.measured.e2e_ms or 0.0) / 1e3 if fam.measured else 0.0:.6f}")
            props = ET.SubElement(tc, "properties")
            for t in fam.targets:
                ET.SubElement(props, "property", name=f"target.{t.metric}", value=target_text(t))
            if fam.status in ("check_failed", "error"):
                ET.SubElement(tc, "failure", message=f"{fam.status}: {fam.reason}", type=fam.status).text = fam.reason
            elif fam.status == "blocked":
                ET.SubElement(tc, "skipped", message=fam.reason)
    ET.indent(suites)
    return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(suites, encoding="unicode") + "\n"


def verify_summary(pred: BenchPredicate) -> list[str]:
    """What ``gradsweep verify`` prints about bench evidence, after the signature line."""
    run = pred.runs[0]
    prov = run.provenance
    lines = [f"bench evidence of manifest {pred.manifest.name} v{pred.manifest.version} ({pred.manifest.path}), "
             f"targets {pred.targets.path} v{pred.targets.version}, contract {pred.contract.version}; "
             f"{pred.verdict.summary}",
             f"ran {run.started_at} on {prov.host}: {prov.gpu_name or 'no GPU'}{' ' + prov.sm if prov.sm else ''}, "
             f"torch {prov.torch}, git {prov.git_commit or 'n/a'}{' (dirty)' if prov.git_dirty else ''}"
             + ("" if pred.claims_figures else "; SMOKE RUN: no figures claimed")]
    return lines
