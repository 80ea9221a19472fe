"""JSON that RFC 8785 accepts: non-finite floats become the strings pydantic reads back as floats."""

from __future__ import annotations

import math
from typing import Any

import rfc8785


def jsonable(value: Any) -> Any:
    """Replace NaN/inf (which canonical JSON forbids) by 'NaN' / 'Infinity' / '-Infinity', recursively."""
    if isinstance(value, float):
        if math.isnan(value):
            return "NaN"
        if math.isinf(value):
            return "Infinity" if value > 0 else "-Infinity"
        return value
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    return value


def canonical(value: Any) -> bytes:
    """RFC 8785 canonical bytes of a JSON-able value (non-finite floats made safe first)."""
    return rfc8785.dumps(jsonable(value))
