"""TEST STAND-IN for the Hugging Face Hub, used by spark-reconciler's tests; not part of the product.

The real Hub is unreachable from CI, so tests point the real `huggingface_hub` client (`HF_ENDPOINT` or
`endpoint=`) at this stdlib-only server, which serves one repo shaped like `0xSero/DeepSeek-V4.1-Flash-Spark`:

- `checkpoint.py` builds the repo (six shards, 5 and 6 only as `.partNN`, `reassemble.sh`,
  `sha256-manifest.txt`, EXL3 banks and plan);
- `server.py` answers the endpoints the client calls, with the headers, errors and Range behaviour the
  real client expects, verified against the huggingface_hub 2.4.0 source (see docs/sources.md);
- `faults.py` injects cuts, 5xx answers and rate caps and keeps a request log; `control.py` drives them over HTTP.

CLI: `python3 -m tests.testbed.hub build --out DIR` then `python3 -m tests.testbed.hub serve --root DIR`.
"""

from .checkpoint import build_checkpoint
from .control import StandinControl
from .faults import CutRule, FailRule, Faults, RequestLog
from .repo import DEFAULT_REPO_ID, RepoFile, RepoInfo, load_repo_info
from .server import StandinHub

__all__ = [
    "DEFAULT_REPO_ID",
    "CutRule",
    "FailRule",
    "Faults",
    "RepoFile",
    "RepoInfo",
    "RequestLog",
    "StandinControl",
    "StandinHub",
    "build_checkpoint",
    "load_repo_info",
]
