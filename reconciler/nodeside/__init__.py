"""Programs that run ON the nodes: stdlib only, shipped as source over SSH.

Nothing here may import from the rest of the package: nodes have python3 and nothing else
of ours. The reconciler sends a module's source to `python3 -` followed by one call. A module
may import from the siblings that exist to be shared, statedir.py (the state dir's layout) and
common.py; shipped, those import lines go and the siblings' source comes along instead (see
`source`). A shared sibling imports no sibling itself.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

_HERE = Path(__file__).parent
# `from reconciler.nodeside.<sibling> import ...`, on one line or in parentheses.
_SIBLING_IMPORT = re.compile(r"^from reconciler\.nodeside\.(\w+) import (?:\([^)]*\)|.*)\n", re.MULTILINE)
_MAIN = '\nif __name__ == "__main__":'


def source(module: str) -> str:
    """nodeside/<module>.py as a node runs it: with the siblings it imports in place of their
    imports (before the module's `__main__` block, which may use them at once)."""
    text = _read(module)
    siblings = "".join(f"\n{_read(name)}" for name in _SIBLING_IMPORT.findall(text))
    text = _SIBLING_IMPORT.sub("", text)
    main = text.find(_MAIN)
    return f"{text}{siblings}" if main < 0 else f"{text[:main]}{siblings}{text[main:]}"


def _read(module: str) -> str:
    return (_HERE / f"{module}.py").read_text(encoding="utf-8")


def program(module: str, call: str, args: Any) -> bytes:
    """Source of nodeside/<module>.py plus `call(args)`, ready for `python3 -`."""
    return f"{source(module)}\n\n{call}(json.loads({json.dumps(json.dumps(args))}))\n".encode()
