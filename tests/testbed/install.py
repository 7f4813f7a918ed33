"""Install the testbed's Debian packages, only those missing, without starting any host service.

Installing docker.io or openssh-server would normally start dockerd/containerd/sshd on the
host. A host containerd in particular would be picked up by every node's dockerd, so a
temporary policy-rc.d (exit 101: "action forbidden") is put in place when none exists.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from tests.testbed.config import TestbedError

PACKAGES = ["docker.io", "openssh-server", "docker-registry", "busybox-static", "rsync", "tini", "iproute2", "curl"]
PACKAGES += ["haproxy"]  # the front image the testbed builds (tests/testbed/images.py)
PACKAGES += ["python3"]
# The quickstart test installs the reconciler as the README says (pipx); the completion test runs zsh.
PACKAGES += ["pipx", "zsh"]
# promtool checks and tests the alert rules; the loop's e2e scrapes it all with a real Prometheus.
PACKAGES += ["prometheus"]
POLICY_RC_D = Path("/usr/sbin/policy-rc.d")


def missing_packages() -> list[str]:
    out = subprocess.run(
        ["dpkg-query", "-W", "-f=${Package} ${Status}\n", *PACKAGES], capture_output=True, text=True, check=False
    ).stdout
    installed = {line.split()[0] for line in out.splitlines() if line.endswith(" installed")}
    return [p for p in PACKAGES if p not in installed]


def install() -> list[str]:
    """apt-get install what is missing (apt-get update first only then); return what was installed."""
    missing = missing_packages()
    if not missing:
        print("install: all packages present:", " ".join(PACKAGES))
        return []
    if os.geteuid() != 0:
        raise TestbedError(f"install needs root to apt-get install: {' '.join(missing)}")
    print("install: missing:", " ".join(missing), flush=True)
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    guard = not POLICY_RC_D.exists()
    if guard:
        POLICY_RC_D.write_text("#!/bin/sh\n# tests.testbed install: start no services\nexit 101\n")
        POLICY_RC_D.chmod(0o755)
    try:
        subprocess.run(["apt-get", "update", "-qq"], env=env, check=True)
        apt = ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *missing]
        subprocess.run(apt, env=env, check=True)
    except subprocess.CalledProcessError as exc:
        raise TestbedError(f"apt-get failed: {exc}") from exc
    finally:
        if guard:
            POLICY_RC_D.unlink(missing_ok=True)
    return missing
