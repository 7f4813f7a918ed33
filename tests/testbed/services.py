"""Root-netns services on 198.19.0.1: the image registry (:5000) and the hub stand-in (:5080).

Both listen only on the testbed host address, which the nodes reach over the mgmt switch;
nothing binds a wildcard address.

The hub stand-in on :5080 serves two commits of the synthetic checkpoint (model revisions):
A, built into `$TB_ROOT/hub`, and B (`build_revision`: shard `model-00003-of-00006.safetensors`
regenerated, `config.json` with `"checkpoint_tag": "B"` instead of "A", the manifest updated, every
other file a hardlink of A's), built into `$TB_ROOT/hub/revision-B`. `main` resolves to A at every
start; tests move it with `StandinControl(...).move_branch("main", b)` (`POST /_standin/branches`),
and a restart (`start_hub`) resets it unless `branches=` says otherwise. Tests read the two shas with
`hub_commits(layout)` -> (A, B) (from the builds' `standin-index.json`), or from
`$TB_ROOT/hub/commits.json` (`{"repo_id", "commits": {"A": sha, "B": sha}, "differs": [paths]}`).
Both builds are cached and rebuilt when any file of tests/testbed/hub changes.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
from collections.abc import Mapping
from pathlib import Path

from tests.testbed import proc
from tests.testbed.config import HOST_IP, HUB_PORT, PACKAGE_DIR, REGISTRY, REPO_ROOT, Layout, TestbedError
from tests.testbed.hub.repo import INDEX_NAME
from tests.testbed.web import http_status

HUB_PACKAGE = PACKAGE_DIR / "hub"


def registry_config(layout: Layout) -> str:
    return f"""version: 0.1
log:
  level: warn
  accesslog:
    disabled: true
storage:
  cache:
    blobdescriptor: inmemory
  filesystem:
    rootdirectory: {layout.registry / "data"}
  delete:
    enabled: true
http:
  addr: {REGISTRY}
  secret: testbed-fixed-secret-not-a-credential
health:
  storagedriver:
    enabled: false
"""


def start_registry(layout: Layout) -> None:
    """Debian's docker-registry (distribution 2.8), plain HTTP: the nodes' dockerd use --insecure-registry."""
    (layout.registry / "data").mkdir(parents=True, exist_ok=True)
    config = layout.registry / "config.yml"
    config.write_text(registry_config(layout))
    proc.spawn_detached(["docker-registry", "serve", str(config)], layout.registry / "registry.log")
    host, port = REGISTRY.rsplit(":", 1)
    if not proc.wait_for(lambda: http_status(host, int(port), "/v2/", 1.0) == 200, 15.0, interval=0.05):
        raise TestbedError(f"registry not answering on {REGISTRY}\n{proc.tail(layout.registry / 'registry.log')}")


# ---------------------------------------------------------------- hub stand-in


def hub_available() -> bool:
    return (HUB_PACKAGE / "__main__.py").is_file()


def _hub_source_hash() -> str:
    """Rebuild the checkpoint when the hub code changes, not only when the build is missing."""
    sha = hashlib.sha256()
    for src in sorted(HUB_PACKAGE.rglob("*.py")):
        sha.update(str(src.relative_to(HUB_PACKAGE)).encode() + b"\0" + src.read_bytes())
    return sha.hexdigest()


def _hub_built(layout: Layout) -> bool:
    return all((root / INDEX_NAME).is_file() for root in (layout.hub, layout.hub_revision)) and (
        layout.hub_commits_json.is_file()
    )


def build_hub(layout: Layout) -> bool:
    """Build commits A and B of the checkpoint into $TB_ROOT/hub once; True if they were (re)built."""
    stamp = layout.cache / "hub.stamp"
    want = _hub_source_hash()
    if _hub_built(layout) and stamp.is_file() and stamp.read_text().strip() == want:
        return False
    shutil.rmtree(layout.hub, ignore_errors=True)
    stamp.unlink(missing_ok=True)
    hub = [sys.executable, "-m", "tests.testbed.hub"]
    for argv in (
        [*hub, "build", "--out", str(layout.hub)],
        [*hub, "build-revision", "--base", str(layout.hub), "--out", str(layout.hub_revision)],
    ):
        result = proc.run(argv, check=False, timeout=600, cwd=REPO_ROOT)
        if result.returncode != 0:
            raise TestbedError(f"hub build failed ({result.returncode}):\n{(result.stderr or result.stdout)[-2000:]}")
    _write_hub_commits(layout)
    layout.cache.mkdir(parents=True, exist_ok=True)
    stamp.write_text(want + "\n")
    return True


def _index(root: Path) -> dict[str, object]:
    try:
        data: dict[str, object] = json.loads((root / INDEX_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        raise TestbedError(f"no hub build in {root}: run `python3 -m tests.testbed up`") from None
    return data


def _files(index: dict[str, object]) -> dict[str, str]:
    files = index.get("files")
    return {str(f["path"]): str(f["sha256"]) for f in files} if isinstance(files, list) else {}


def _write_hub_commits(layout: Layout) -> None:
    a, b = _index(layout.hub), _index(layout.hub_revision)
    files_a, files_b = _files(a), _files(b)
    differs = sorted(p for p in files_a.keys() | files_b.keys() if files_a.get(p) != files_b.get(p))
    document = {"repo_id": a["repo_id"], "commits": {"A": a["commit"], "B": b["commit"]}, "differs": differs}
    layout.hub_commits_json.write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")


def hub_commits(layout: Layout) -> tuple[str, str]:
    """(A, B): the commit shas the :5080 stand-in serves, read from the builds' indexes."""
    return str(_index(layout.hub)["commit"]), str(_index(layout.hub_revision)["commit"])


def hub_roots(layout: Layout) -> list[Path]:
    """The build roots :5080 serves, oldest commit first (B only if built)."""
    return [layout.hub] + ([layout.hub_revision] if (layout.hub_revision / INDEX_NAME).is_file() else [])


def start_hub(
    layout: Layout,
    root: Path | None = None,
    port: int = HUB_PORT,
    *,
    branches: Mapping[str, str] | None = None,
    token_file: Path | None = None,
) -> None:
    """A Hub stand-in: by default commits A and B of the synthetic checkpoint on :5080, `main` -> A;
    with `root`, that one build (the real-engine lane's tiny model). `branches` points branches at
    served commits (e.g. `{"main": hub_commits(layout)[1]}`); with `token_file`, every Hub request
    needs that file's token (read by the stand-in, so it never shows in a process list)."""
    roots = [root] if root is not None else hub_roots(layout)
    argv = [sys.executable, "-m", "tests.testbed.hub", "serve"]
    for served in roots:
        argv += ["--root", str(served)]
    for name, commit in (branches or {}).items():
        argv += ["--branch", f"{name}={commit}"]
    argv += ["--host", HOST_IP, "--port", str(port)]
    if token_file is not None:
        argv += ["--token-file", str(token_file)]
    log = layout.hub_log(port)
    proc.spawn_detached(argv, log, cwd=REPO_ROOT)
    if not proc.wait_for(lambda: http_status(HOST_IP, port, "/", 1.0) is not None, 20.0, interval=0.05):
        raise TestbedError(f"hub not answering on {HOST_IP}:{port}\n{proc.tail(log)}")


def stop_hub(layout: Layout, port: int = HUB_PORT) -> list[int]:
    """Stop the Hub stand-in serving on `port` (an outage, for tests); returns the pids stopped."""
    pids = [
        info.pid
        for info in proc.processes()
        if is_hub_process(info.argv) and str(port) in info.argv and any(str(layout.root) in a for a in info.argv)
    ]
    proc.stop(pids, 5.0)
    return pids


def hub_ports(layout: Layout) -> list[int]:
    """The ports of every Hub stand-in of this testbed that runs (tests start extra ones)."""
    ports = []
    for info in proc.processes():
        if is_hub_process(info.argv) and any(str(layout.root) in arg for arg in info.argv):
            ports.append(int(info.argv[info.argv.index("--port") + 1]))
    return sorted(set(ports))


def is_hub_process(argv: list[str]) -> bool:
    return "tests.testbed.hub" in argv and "serve" in argv
