"""Evidence whose cells came from code other than gradsweep's own harness says so, loudly.

The hidden ``--cell-fn`` / ``--manifest-loader`` hooks (tests plant fakes through them) and manifest
plugins (``--allow-plugins``) are recorded in each run; ``verify`` and ``report`` turn them into
warnings so such evidence is never mistaken for a harness verdict.
"""

from __future__ import annotations

from gradsweep.evidence.predicate import Predicate
from gradsweep.resolve import STOCK_CELL_FNS, STOCK_LOADERS


def custom_code_warnings(pred: Predicate) -> list[str]:
    """One line per kind of non-default code that produced the cells (deduplicated across shards)."""
    found: list[str] = []
    for run in pred.runs:
        if run.cell_fn not in STOCK_CELL_FNS:
            found.append(f"NON-DEFAULT CELL FUNCTION {run.cell_fn}: these verdicts are not gradsweep's harness's")
        if run.loader is not None and run.loader not in STOCK_LOADERS:
            found.append(f"NON-DEFAULT MANIFEST LOADER {run.loader}: the cells were not read by gradsweep's "
                         "manifest loader")
        if run.plugins:
            found.append(f"PLUGINS imported (--allow-plugins): {', '.join(run.plugins)}")
    return list(dict.fromkeys(found))
