"""Render a drift report: rich tables (bitwise claims and cross-backend parity in separate sections) and JSON."""

from __future__ import annotations

import json

from rich.console import Console
from rich.table import Table

from gradsweep.drift.plan import BITWISE
from gradsweep.evidence.jsonsafe import jsonable


def to_json(report: dict) -> str:
    return json.dumps(jsonable(report), indent=2, sort_keys=False) + "\n"


def _g(x: float | None) -> str:
    if x is None:
        return "-"
    return "0" if x == 0 else f"{x:.3g}"


def _bits(entry: dict) -> str:
    if entry.get("status") != "compared":
        return "n/a"
    return "equal" if not entry["mismatched"] else f"{entry['mismatched']}/{entry['numel']}"


def _boundary_table(pair: dict) -> Table:
    t = Table(title=f"{pair['id']}  [{pair['claim']}]", title_justify="left")
    for col in ("boundary", "bits differ", "max abs", "mean abs", "p99 abs", "max rel", "p99 rel",
                "dlogp mean (active)", "share"):
        t.add_column(col, justify="left" if col == "boundary" else "right")
    first = pair.get("first_difference")
    for e in pair["boundaries"]:
        name = e["name"] + (" <- first" if e["name"] == first else "")
        if e.get("status") != "compared":
            t.add_row(name, "n/a", e.get("reason", "")[:70], *[""] * 6)
            continue
        eff = e.get("dlogp")
        t.add_row(name, _bits(e), _g(e["max_abs"]), _g(e["mean_abs"]), _g(e["p99_abs"]), _g(e["max_rel"]),
                  _g(e["p99_rel"]), "-" if eff is None else _g(eff["mean_abs"]),
                  "-" if eff is None else _g(eff["share"]), style="bold" if e["name"] == first else None)
    return t


def _layer_table(pair: dict) -> Table:
    t = Table(title="per layer (residual stream: growth over the layer's input)", title_justify="left")
    for col in ("layer", "differing boundaries", "residual max abs", "residual mean abs", "growth max",
                "growth mean", "first difference"):
        t.add_column(col, justify="right" if col != "first difference" else "left")
    for row in pair["layers"]:
        t.add_row(str(row["layer"]), f"{row['differing']}/{row['boundaries']}", _g(row["residual_max_abs"]),
                  _g(row["residual_mean_abs"]), _g(row["growth_max"]), _g(row["growth_mean"]),
                  row["first_difference"] or "-")
    return t


def _rl_table(pair: dict) -> Table:
    t = Table(title="RL loss fragments (policy logp = each role's; old = ref = the inference role's; "
                    "active tokens)", title_justify="left")
    for col in ("fragment.tensor", "bits differ", "max abs", "mean abs", "p99 abs", "loss (train)", "loss (infer)"):
        t.add_column(col, justify="left" if col == "fragment.tensor" else "right")
    for e in pair["rl"]:
        name = f"{e['fragment']}.{e['tensor']}"
        if e["status"] != "compared":
            t.add_row(name, "n/a", f"{e['role']}: {e['reason']}"[:70], "", "", "", "")
            continue
        t.add_row(name, _bits(e), _g(e["max_abs"]), _g(e["mean_abs"]), _g(e["p99_abs"]),
                  _g(e.get("train_value")), _g(e.get("infer_value")))
    return t


def _pair_lines(pair: dict) -> list[str]:
    lines = []
    if pair["status"] != "compared":
        lines.append(f"{pair['id']}: {pair['status']} ({pair.get('role', '')}) - {pair.get('reason', '')}")
        return lines
    first = pair["first_difference"]
    lp = pair["logp_active"]
    if first is None:
        lines.append("every boundary is bitwise equal")
    else:
        lines.append(f"first boundary whose bits differ: {first}; logp on active tokens: {lp['mismatched']}/"
                     f"{lp['numel']} differ, max {_g(lp['max_abs'])}, mean {_g(lp['mean_abs'])}, "
                     f"p99 {_g(lp['p99_abs'])}")
    tv = pair.get("trainer_view")
    if tv and tv.get("active_tokens"):
        lines.append(f"trainer's importance ratio exp(logp_train - logp_infer): {tv['ratio_not_one']}/"
                     f"{tv['active_tokens']} active tokens != 1, max |r-1| {_g(tv['ratio_max_abs_dev'])}, "
                     f"outside the clip range {tv['clip_range']}: {tv['clipped_fraction']:.3%}")
    par = pair.get("parity")
    if par:
        for side in ("train", "infer"):
            s = par[side]
            verdict = s["note"] or ("within" if s["ok"] else "OUTSIDE")
            bound = "" if s["bound"] is None else f" bound {_g(s['bound'])} ="
            lines.append(f"parity {side}: logp error vs FP64 {_g(s['error'])}:{bound} {s['k']} x stock "
                         f"{_g(s['stock_error'])} + {s['floor']} ({s['accumulation']} class) -> {verdict}")
    return lines


def render(report: dict, console: Console) -> None:
    shape = report["shape"]
    smp = report["samples"]
    console.print(f"[bold]gradsweep drift[/bold]: manifest {report['manifest']['name']}, Qwen3 chain hidden "
                  f"{shape['hidden']}, {shape['layers']} layers, heads {shape['heads']}/{shape['kv_heads']}, "
                  f"vocab {shape['vocab']}; {smp['tokens']} tokens ({smp['active_tokens']} carry loss) on "
                  f"{report['device']}")
    sections = ((BITWISE, "Bitwise claims: one profile, train layout vs inference layout (are the bits equal?)"),
                ("parity", "Tolerance-based cross-backend parity: different profiles (bits are not expected "
                           "to match; accuracy judged against FP64 by the contract)"))
    for claim, title in sections:
        pairs = [p for p in report["pairs"] if p["claim"] == claim]
        if not pairs:
            continue
        console.rule(title)
        for pair in pairs:
            if pair["status"] == "compared":
                console.print(_boundary_table(pair))
                console.print(_layer_table(pair))
                if pair["rl"]:
                    console.print(_rl_table(pair))
            for line in _pair_lines(pair):
                console.print(line)
    console.rule("Deterministic repeatability (checked only where a profile advertises it)")
    for r in report["repeatability"]:
        if not r["advertised"] or not r["checked"]:
            console.print(f"{r['profile']}: {r.get('note', 'not checked')}")
        else:
            bad = [c for c in r["runs"] if not c["ok"]]
            console.print(f"{r['profile']}: {'bitwise repeatable' if not bad else 'NOT repeatable'} over "
                          f"{len(r['runs'])} rerun(s)" + (f"; first difference {bad[0]['layout']}: "
                                                         f"{bad[0]['first_difference']}" if bad else ""))
    console.print(f"drift run: {report['seconds']:.1f} s")
