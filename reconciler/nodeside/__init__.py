"""Programs that run ON the nodes: stdlib only, shipped as source over SSH.

Nothing here may import from the rest of the package: nodes have python3 and nothing else
of ours. The reconciler sends a module's source to `python3 -` followed by one call. A module
that names state-dir files imports `StateDir` with the line `_LAYOUT_IMPORT`; shipped, that
line goes and the layout's source comes along instead (see `source`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

_HERE = Path(__file__).parent
_LAYOUT_IMPORT = "from reconciler.nodeside.statedir import StateDir\n"
_MAIN = '\nif __name__ == "__main__":'


def source(module: str) -> str:
    """nodeside/<module>.py as a node runs it: with the state-dir layout in place of its import
    (before the module's `__main__` block, which may use it at once)."""
    text = (_HERE / f"{module}.py").read_text(encoding="utf-8")
    if _LAYOUT_IMPORT not in text:
        return text
    text = text.replace(_LAYOUT_IMPORT, "")
    layout = (_HERE / "statedir.py").read_text(encoding="utf-8")
    main = text.find(_MAIN)
    return f"{text}\n{layout}" if main < 0 else f"{text[:main]}\n{layout}{text[main:]}"


def program(module: str, call: str, args: Any) -> bytes:
    """Source of nodeside/<module>.py plus `call(args)`, ready for `python3 -`."""
    return f"{source(module)}\n\n{call}(json.loads({json.dumps(json.dumps(args))}))\n".encode()
