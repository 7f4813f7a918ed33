"""TEST STAND-IN for the Hugging Face Hub, used by spark-reconciler's tests; not part of the product.

The real Hub is unreachable from CI, so tests point the real `huggingface_hub` client (`HF_ENDPOINT` or
`endpoint=`) at this stdlib-only server, which serves one repo shaped like `0xSero/DeepSeek-V4.1-Flash-Spark`,
at one commit or several (model revisions; branches such as `main` point at one of them and can be moved):

- `checkpoint.py` builds the repo (six shards, 5 and 6 only as `.partNN`, `reassemble.sh`,
  `sha256-manifest.txt`, EXL3 banks and plan; `config.json` has a `checkpoint_tag`), and with
  `build_revision` its next commit (one shard and `config.json` changed, the rest hardlinked);
- `server.py` answers the endpoints the client calls, with the headers, errors and Range behaviour the
  real client expects, verified against the huggingface_hub 2.4.0 source (see docs/sources.md);
- `faults.py` injects cuts, 5xx answers and rate caps and keeps a request log; `control.py` drives them and
  moves branches over HTTP.

CLI: `python3 -m tests.testbed.hub build --out DIR`, optionally `build-revision --base DIR --out DIR2`, then
`python3 -m tests.testbed.hub serve --root DIR [--root DIR2] [--branch main=COMMIT]`.
"""

from .checkpoint import build_checkpoint, build_revision
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
    "build_revision",
    "load_repo_info",
]
