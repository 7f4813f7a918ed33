"""Root-netns services on 198.19.0.1: the image registry (:5000) and the hub stand-in (:5080).

Both listen only on the testbed host address, which the nodes reach over the mgmt switch;
nothing binds a wildcard address.
"""

from __future__ import annotations

import hashlib
import shutil
import sys
from pathlib import Path

from tests.testbed import proc
from tests.testbed.config import HOST_IP, HUB_PORT, PACKAGE_DIR, REGISTRY, REPO_ROOT, Layout, TestbedError
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


def build_hub(layout: Layout) -> bool:
    """Build the checkpoint into $TB_ROOT/hub once; True if it was (re)built."""
    stamp = layout.cache / "hub.stamp"
    want = _hub_source_hash()
    if layout.hub.is_dir() and stamp.is_file() and stamp.read_text().strip() == want:
        return False
    shutil.rmtree(layout.hub, ignore_errors=True)
    stamp.unlink(missing_ok=True)
    argv = [sys.executable, "-m", "tests.testbed.hub", "build", "--out", str(layout.hub)]
    result = proc.run(argv, check=False, timeout=600, cwd=REPO_ROOT)
    if result.returncode != 0:
        raise TestbedError(f"hub build failed ({result.returncode}):\n{(result.stderr or result.stdout)[-2000:]}")
    layout.cache.mkdir(parents=True, exist_ok=True)
    stamp.write_text(want + "\n")
    return True


def start_hub(layout: Layout, root: Path | None = None, port: int = HUB_PORT) -> None:
    """A Hub stand-in serving one built repo (default: the synthetic checkpoint on :5080)."""
    argv = [sys.executable, "-m", "tests.testbed.hub", "serve", "--root", str(root or layout.hub)]
    argv += ["--host", HOST_IP, "--port", str(port)]
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


def is_hub_process(argv: list[str]) -> bool:
    return "tests.testbed.hub" in argv and "serve" in argv
