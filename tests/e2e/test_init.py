"""`reconciler init` on the testbed, run on the head the way a user runs it on a Spark.

The user types `reconciler init --worker root@<worker's fabric address>` in a fresh directory;
the only testbed-specific option is `--model-dir`: over SSH the worker's `~` is root's home,
which in the testbed is the host machine's own /root, so the checkpoint goes to the node's
private /srv/spark instead. The head's ~/.ssh (the testbed writes it, like ssh-copy-id and a
first login would) holds the client key and the nodes' host keys, so the defaults find them.

What the user would then edit by hand is the testbed's business, not init's: the Hub stand-in
(model.endpoint), the engine stand-in's image, no GPUs or --privileged (serving), a small
memory floor and short startup timeouts, and a state dir on /srv/spark for the same reason as
the model dir. The test pastes exactly those sections from specs/testbed.yaml over the drafted
ones, as a user editing the file would, and leaves everything init detected untouched: node
names, SSH target, model dirs and the fabric (interface, address, HCAs).

One init drafts the spec for the module (`drafted`); each test reads that draft and leaves it
as it is, so the tests run in any order.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from reconciler.spec import load_spec
from tests.e2e.conftest import RECONCILER, TB_ROOT, Bed
from tests.e2e.userspec import edited_like_a_user
from tests.testbed.config import Layout, node_named

pytestmark = pytest.mark.testbed

HEAD, WORKER = "spark-head", "spark-worker"
FABRIC_IP = {HEAD: "198.18.10.13", WORKER: "198.18.10.11"}
WORKER_LOGIN = f"root@{FABRIC_IP[WORKER]}"
MODEL_DIR = "/srv/spark/models/DeepSeek-V4.1-Flash-Spark"
PASSING = ["ssh", "python3", "rsync", "docker", "image", "rdma port", "fabric address", "roce gid", "disk"]
HONEST_FAILURES = {"nvidia runtime", "gpu driver", "memory"}


@pytest.fixture(scope="module")
def drafted(bed: Bed, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess[str]]:
    """A directory where `reconciler init` wrote its draft, and what that init said."""
    workdir = tmp_path_factory.mktemp("init")
    return workdir, init(bed, workdir, "--worker", WORKER_LOGIN, "--model-dir", MODEL_DIR)


def init(bed: Bed, cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    started = time.monotonic()
    result = bed.testbed.exec("spark-head", [RECONCILER, "init", *args], cwd=str(cwd), check=False, timeout=120)
    elapsed = time.monotonic() - started
    print(f"$ reconciler init {' '.join(args)}  ({elapsed:.1f} s, exit {result.returncode})")
    print(result.stdout + result.stderr)
    return result


def test_an_unknown_host_key_stops_init_with_the_command_that_adds_it(bed: Bed, tmp_path: Path) -> None:
    workdir = tmp_path
    known_hosts = workdir / "known_hosts"
    known_hosts.write_text("", encoding="utf-8")
    args = ["--worker", WORKER_LOGIN, "--model-dir", MODEL_DIR, "--known-hosts", str(known_hosts)]
    refused = init(bed, workdir, *args, "--out", "first.yaml")
    assert refused.returncode == 1
    assert f"{known_hosts} holds no host key for {FABRIC_IP[WORKER]}; init never trusts an unseen host key" in (
        refused.stderr
    )
    assert not (workdir / "first.yaml").exists()
    assert known_hosts.read_text(encoding="utf-8") == "", "init never adds a key"
    # The hint: look at the offered fingerprints first, and only then the command that adds the key.
    look = f"`ssh-keyscan -p 22 {FABRIC_IP[WORKER]} | ssh-keygen -lf -` shows the fingerprints it offers"
    assert look in refused.stderr
    keyscan = re.search(r"only if they match: `(ssh-keyscan [^`]*)`", refused.stderr)
    assert keyscan is not None, refused.stderr
    assert keyscan.group(1) == f"ssh-keyscan -p 22 {FABRIC_IP[WORKER]} >> {known_hosts}"
    # What the hint asks first: the scanned key's fingerprint is the one the node itself has.
    scanned = bed.node(HEAD, "sh", "-c", f"ssh-keyscan {FABRIC_IP[WORKER]} 2>/dev/null | ssh-keygen -lf -").stdout
    own = Layout(TB_ROOT).host_key(node_named(WORKER)).with_suffix(".pub")
    assert bed.node(HEAD, "ssh-keygen", "-lf", str(own)).stdout.split()[1] in scanned
    bed.node(HEAD, "sh", "-c", keyscan.group(1) + " 2>/dev/null")
    assert init(bed, workdir, *args, "--out", "first.yaml").returncode == 0
    assert (workdir / "first.yaml").is_file()


def test_init_writes_a_spec_from_what_the_nodes_say(
    bed: Bed, drafted: tuple[Path, subprocess.CompletedProcess[str]]
) -> None:
    workdir, result = drafted
    assert result.returncode == 0
    spec = workdir / "specs/deployment.yaml"
    assert f"Wrote {Path('specs/deployment.yaml')}." in result.stdout
    assert result.stdout.endswith("Next:\n  reconciler doctor\n  reconciler plan\n  reconciler apply\n")
    assert bed.reconciler("validate", "--spec", str(spec), check=False).returncode == 0
    deployment = load_spec(spec).deployment
    assert [(node.name, node.role) for node in deployment.nodes] == [(HEAD, "head"), (WORKER, "worker")]
    head, worker = deployment.nodes
    assert head.ssh is None
    assert worker.ssh is not None
    assert (worker.ssh.host, worker.ssh.user, worker.ssh.known_hosts) == (
        FABRIC_IP[WORKER],
        "root",
        "~/.ssh/known_hosts",
    )
    for node in (head, worker):
        assert node.model_dir == MODEL_DIR
        assert (node.fabric.ifname, node.fabric.ip, node.fabric.hcas) == (
            "enp1s0f1np1",
            FABRIC_IP[node.name],
            ["rocep1s0f1"],
        )
    flat = " ".join(line.strip().lstrip("# ") for line in spec.read_text(encoding="utf-8").splitlines())
    for name in (HEAD, WORKER):
        assert f"detected: enp1s0f1np1 carries {FABRIC_IP[name]}/24 and is RoCE-capable (rocep1s0f1 ACTIVE" in flat
    assert "the node's fabric address: the checkpoint copy (rsync over SSH) takes the fabric" in flat
    assert "198.19.0." not in flat, "the management network is never the fabric"


def test_init_never_overwrites_the_spec(bed: Bed, drafted: tuple[Path, subprocess.CompletedProcess[str]]) -> None:
    workdir, _ = drafted
    spec = workdir / "specs/deployment.yaml"
    before = spec.read_text(encoding="utf-8")
    result = init(bed, workdir, "--worker", WORKER_LOGIN, "--model-dir", MODEL_DIR)
    assert result.returncode == 1
    assert "specs/deployment.yaml exists; init never overwrites a spec" in result.stderr
    assert spec.read_text(encoding="utf-8") == before


def test_the_edited_spec_passes_doctor_and_converges(
    bed: Bed, drafted: tuple[Path, subprocess.CompletedProcess[str]], tmp_path: Path
) -> None:
    draft = (drafted[0] / "specs/deployment.yaml").read_text(encoding="utf-8")
    spec = tmp_path / "specs/deployment.yaml"  # the draft itself stays as init wrote it, for the other tests
    spec.parent.mkdir()
    spec.write_text(edited_like_a_user(draft, bed.spec.read_text(encoding="utf-8")), encoding="utf-8")
    edited = Bed(bed.testbed, spec)
    result = edited.reconciler("doctor", "--json", check=False)
    report: Any = json.loads(result.stdout)
    checks = {(check["node"], check["check"]): check for check in report["checks"]}
    for node in (HEAD, WORKER):
        for name in PASSING:
            assert checks[(node, name)]["status"] == "PASS", checks[(node, name)]
        assert checks[(node, "fabric address")]["message"] == f"enp1s0f1np1 {FABRIC_IP[node]}/24 (from the spec)"
        assert checks[(node, "roce gid")]["message"] == "HCAs from the spec: rocep1s0f1"
    for name in ("same subnet", "mtu", "clock skew"):
        assert checks[("all nodes", name)]["status"] == "PASS", checks[("all nodes", name)]
    failed = {check for (_, check), found in checks.items() if found["status"] == "FAIL"}
    assert failed <= HONEST_FAILURES, f"only what the testbed lacks may fail: {failed - HONEST_FAILURES}"
    edited.reconciler("apply", "--yes")
    assert edited.plan_exit() == 0
