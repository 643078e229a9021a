"""Reading Nsight Compute's CSV output (lab: not installed). Shared by the scripts that run under ``ncu``:
:mod:`lab.hbm_probe` (``--page details``: one row per kernel and metric) and :mod:`lab.decode_profile` (``--page
raw``: one row per kernel, one column per metric, a units row under the header).

Plain Python (csv only): the parsers run on a CPU machine over files brought back from the GPU.
"""

from __future__ import annotations

import csv
import io
from typing import Dict, List, Optional, Sequence

# a unit's scale to its SI base (byte, second); a rate ("Gbyte/second") scales by its numerator; other units
# ("%", "register/thread", "") are taken as they are
UNIT_SCALE = {
    "byte": 1.0, "B": 1.0, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9, "Tbyte": 1e12, "KB": 1e3, "MB": 1e6, "GB": 1e9,
    "TB": 1e12, "nsecond": 1e-9, "ns": 1e-9, "usecond": 1e-6, "us": 1e-6, "msecond": 1e-3, "ms": 1e-3,
    "second": 1.0, "s": 1.0,
}
# the columns ncu writes before the metrics on both pages (absent ones are simply not there)
ID_COLUMNS = ("ID", "Process ID", "Process Name", "Host Name", "Kernel Name", "Function Name", "Context", "Stream",
              "Block Size", "Grid Size", "Device", "CC", "Section Name", "Metric Name", "Metric Unit", "Metric Value",
              "Kernel Time", "Demangled Name")


def table_lines(text: str) -> List[str]:
    """The CSV table of an ``ncu --csv`` report: the lines from the header (``"ID",...``) on; the application's own
    output and ncu's ``==PROF==`` lines before it are dropped, ``==...==`` lines after it too. ``ValueError`` when
    there is no such header (ncu failed, or profiled nothing)."""
    lines = text.splitlines()
    start = next((i for i, ln in enumerate(lines) if ln.startswith('"ID"')), None)
    if start is None:
        raise ValueError('no ncu CSV table found (expected a header line starting with "ID")')
    return [ln for ln in lines[start:] if ln.strip() and not ln.startswith("==")]


def unit_scale(unit: str) -> float:
    """Factor from ``unit`` to its SI base: ``"Mbyte"`` -> 1e6, ``"usecond"`` -> 1e-6, ``"Gbyte/second"`` -> 1e9
    (per second stays per second); 1 for units without a scale (``%``, ``register/thread``, empty)."""
    head = (unit or "").strip().split("/")[0]
    return UNIT_SCALE.get(head, 1.0)


def to_number(value, unit: str = "") -> Optional[float]:
    """``value`` (a CSV cell: ``"10,240,000"``, ``"4.0e-05"``, ``"n/a"``) in its SI base unit; ``None`` for an
    empty cell, ``n/a`` or text that is not a number."""
    s = str(value if value is not None else "").strip().replace(",", "")
    if not s or s.lower() in ("n/a", "nan", "-"):
        return None
    try:
        return float(s) * unit_scale(unit)
    except ValueError:
        return None


def details_rows(text: str) -> List[Dict[str, str]]:
    """The rows of an ``ncu --csv`` report of the details page (the default): one dict per (kernel, metric), with
    ``Metric Name`` / ``Metric Unit`` / ``Metric Value``."""
    return list(csv.DictReader(io.StringIO("\n".join(table_lines(text)))))


def raw_rows(text: str, metrics: Optional[Sequence[str]] = None) -> List[dict]:
    """The kernels of an ``ncu --csv --page raw`` report, in the report's order: one dict per kernel with the
    identity columns as text (``ID``, ``Kernel Name``, ``Stream``, ``Grid Size``, ...) and every other column --
    or only ``metrics`` -- as a number in its SI base unit (bytes, seconds; ``%`` as printed), ``None`` for ``n/a``.
    The units row under the header (its first cell empty) gives each metric's unit; without it values are taken
    as printed. ``ValueError`` without a table."""
    rows = list(csv.reader(io.StringIO("\n".join(table_lines(text)))))
    header, body = rows[0], rows[1:]
    units = [""] * len(header)
    if body and body[0] and body[0][0] == "":
        units, body = body[0] + [""] * (len(header) - len(body[0])), body[1:]
    out = []
    for cells in body:
        if not cells or not cells[0].strip():
            continue
        r = {}
        for col, unit, cell in zip(header, units, cells):
            if col in ID_COLUMNS:
                r[col] = cell
            elif metrics is None or col in metrics:
                r[col] = to_number(cell, unit)
        out.append(r)
    return out
