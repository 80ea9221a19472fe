"""``gradsweep drift``: run the drift plan of gradsweep.drift (the Qwen3 chain, boundary by boundary) and render it."""

from __future__ import annotations

from pathlib import Path


def run_drift(manifest_path: Path | None, profiles: list[str], train: str, infer: str, infer_profile: str | None,
              layers: int | None, hidden: int | None, intermediate: int | None, vocab: int | None,
              out: Path | None, key: Path | None, dlogp: bool, rl: bool, reruns: int, as_json: bool,
              allow_plugins: bool = False, say=lambda s: None) -> tuple[dict, str, int]:
    """(report, text to print, exit code); BadInput for bad options. The work is gradsweep.drift.command's."""
    from gradsweep.drift.command import DriftRequest, exit_code, run_request
    from gradsweep.drift.outputs import table_text
    from gradsweep.drift.report import to_json

    req = DriftRequest(manifest_path, list(profiles), train, infer, infer_profile, layers, hidden, intermediate,
                       vocab, out, key, dlogp, rl, reruns, allow_plugins)
    report, written = run_request(req, say)
    for kind, path in written.items():
        say(f"wrote {kind}: {path}")
    return report, to_json(report) if as_json else table_text(report), exit_code(report)
