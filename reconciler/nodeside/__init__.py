"""Programs that run ON the nodes: stdlib only, shipped as source over SSH.

Nothing here may import from the rest of the package: nodes have python3 and nothing else
of ours. The reconciler sends a module's source to `python3 -` followed by one call.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def program(module: str, call: str, args: Any) -> bytes:
    """Source of nodeside/<module>.py plus `call(args)`, ready for `python3 -`."""
    source = (Path(__file__).parent / f"{module}.py").read_text(encoding="utf-8")
    return f"{source}\n\n{call}(json.loads({json.dumps(json.dumps(args))}))\n".encode()
