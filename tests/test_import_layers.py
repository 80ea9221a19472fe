"""Layers point one way: every import inside gradsweep/ goes to a lower layer, never up or sideways.

cli -> report -> bench / drift -> sweep -> evidence -> harness -> manifest -> ops -> nn -> kernels -> the
shared bottom (layouts, workload, contract, ...) -> canonical and the record types. Every import statement
counts, the ones inside functions too (a lazy import is still a dependency). A new package or top-level
module must be placed in LAYERS before it can import anything.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "gradsweep"

LAYERS: list[set[str]] = [  # top first; a unit may import units of lower layers only
    {"cli"},
    {"report"},
    {"bench", "drift"},
    {"sweep"},
    {"evidence"},
    {"harness"},
    {"manifest"},
    {"ops"},
    {"nn"},
    {"triton_kernels", "cuda_kernels", "_C"},
    {"layouts", "workload", "contract", "env_policy", "tracked_reds", "resolve", "kernel_api", "attention_host"},
    {"canonical", "results", "errors", "families", "stock", "__init__"},
    {"uploads", "_fold_plan"},  # host arrays to the device without a stream sync; the compiled fold planner
]
RANK = {unit: i for i, layer in enumerate(LAYERS) for unit in layer}


def unit_of(module: str) -> str:
    """'gradsweep.sweep.api' -> 'sweep'; 'gradsweep.cli' -> 'cli'; 'gradsweep' -> '__init__'."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT.parent).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def imports(path: Path) -> list[tuple[int, str]]:
    """(line, imported gradsweep module) of every import statement in the file, nested ones included."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.split(".")[0] == "gradsweep"]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module == "gradsweep":  # from gradsweep import x: x is the module
                found += [(node.lineno, f"gradsweep.{a.name}") for a in node.names]
            elif node.module.startswith("gradsweep."):
                found.append((node.lineno, node.module))
    return found


def upward_imports() -> list[str]:
    problems = []
    for path in sorted(ROOT.rglob("*.py")):
        src = unit_of(module_name(path))
        if src not in RANK:
            problems.append(f"{path.relative_to(ROOT.parent)}: unit {src!r} is in no layer; add it to LAYERS")
            continue
        for line, target in imports(path):
            dst = unit_of(target)
            if dst == src:
                continue
            if dst not in RANK:
                problems.append(f"{path.relative_to(ROOT.parent)}:{line}: imports {target}, whose unit {dst!r} is "
                                "in no layer")
            elif RANK[dst] <= RANK[src]:
                way = "sideways" if RANK[dst] == RANK[src] else "upward"
                problems.append(f"{path.relative_to(ROOT.parent)}:{line}: {src} imports {target} ({way})")
    return problems


def test_every_import_points_down() -> None:
    problems = upward_imports()
    assert not problems, "\n".join(problems)


def test_the_check_sees_an_upward_import(tmp_path: Path, monkeypatch) -> None:
    """The check can fail: a kernel module importing the harness is refused."""
    pkg = tmp_path / "gradsweep"
    (pkg / "triton_kernels").mkdir(parents=True)
    (pkg / "harness").mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "harness" / "__init__.py").write_text("")
    (pkg / "triton_kernels" / "bad.py").write_text("def f():\n    from gradsweep.harness import judge\n")
    monkeypatch.setitem(globals(), "ROOT", pkg)
    problems = upward_imports()
    assert problems == ["gradsweep/triton_kernels/bad.py:2: triton_kernels imports gradsweep.harness (upward)"]
