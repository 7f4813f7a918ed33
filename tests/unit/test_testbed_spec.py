"""The spec a testbed run converges: rendered for the testbed's $TB_ROOT, never over a tracked file."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from reconciler.spec import load_spec
from tests.scenarios import ROOT
from tests.testbed import specfile
from tests.testbed.config import Layout
from tests.testbed.config import TestbedError as SpecRefused

IMAGE = "198.19.0.1:5000/tb/engine@sha256:" + "ab" * 32
TRACKED = [ROOT / "specs/testbed.yaml", ROOT / "specs/testbed-vllm.yaml"]


def digest_of_specs() -> dict[str, str]:
    return {path.name: hashlib.sha256(path.read_bytes()).hexdigest() for path in sorted((ROOT / "specs").iterdir())}


@pytest.mark.parametrize("source", TRACKED, ids=lambda path: path.name)
def test_a_tracked_testbed_spec_gets_this_tb_roots_keys_and_the_image(source: Path, tmp_path: Path) -> None:
    layout = Layout(tmp_path / "tb")
    target = specfile.write(source, tmp_path / "out.yaml", layout, IMAGE)
    rendered = target.read_text(encoding="utf-8")
    worker = next(node for node in load_spec(target).deployment.nodes if node.ssh is not None)
    assert worker.ssh is not None
    assert (worker.ssh.identity_file, worker.ssh.known_hosts) == (str(layout.client_key), str(layout.known_hosts))
    assert load_spec(target).deployment.image.ref == IMAGE
    assert "/tmp/testbed/keys" not in rendered
    changed = [line for line in rendered.splitlines() if line not in source.read_text(encoding="utf-8").splitlines()]
    assert len(changed) == 3, "only image.ref, identity_file and known_hosts change"


def test_every_ssh_node_gets_the_keys_not_only_the_first() -> None:
    text = "image:\n  ref: old\nnodes:\n" + "".join(
        f"  - name: n{i}\n    ssh:\n      identity_file: /x/k\n      known_hosts: /x/h\n" for i in range(3)
    )
    rendered = specfile.render(text, Layout(Path("/srv/tb-elsewhere")), IMAGE)
    assert rendered.count("identity_file: /srv/tb-elsewhere/keys/id_ed25519\n") == 3
    assert rendered.count("known_hosts: /srv/tb-elsewhere/keys/known_hosts\n") == 3
    assert "/x/" not in rendered


def test_a_spec_without_an_image_ref_or_ssh_node_is_refused() -> None:
    with pytest.raises(SpecRefused, match="one image ref"):
        specfile.render("nodes:\n  - name: a\n", Layout(Path("/srv/tb")), IMAGE)


def test_the_tracked_spec_itself_is_never_the_target(tmp_path: Path) -> None:
    source = tmp_path / "testbed.yaml"
    shutil.copy(TRACKED[0], source)
    before = source.read_bytes()
    with pytest.raises(SpecRefused, match="refusing to rewrite"):
        specfile.write(source, tmp_path / "." / "testbed.yaml", Layout(tmp_path / "tb"), IMAGE)
    assert source.read_bytes() == before


def test_the_spec_command_writes_under_tb_root_and_leaves_the_checkout_alone(tmp_path: Path) -> None:
    before = digest_of_specs()
    environment = {**os.environ, "TB_ROOT": str(tmp_path / "tb")}
    argv = [sys.executable, "-m", "tests.testbed", "spec", "specs/testbed.yaml", "--image", IMAGE]
    written = subprocess.run(argv, cwd=ROOT, env=environment, capture_output=True, text=True, check=True)
    assert written.stdout.strip() == str(tmp_path / "tb/specs/testbed.yaml")
    assert str(tmp_path / "tb/keys/known_hosts") in (tmp_path / "tb/specs/testbed.yaml").read_text(encoding="utf-8")
    assert digest_of_specs() == before


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make (./make.sh installs it)")
def test_make_demo_hands_the_reconciler_the_spec_under_tb_root(tmp_path: Path) -> None:
    """`make -n` prints the demo's commands without running them: every --spec lies under TB_ROOT."""
    environment = {**os.environ, "TB_ROOT": str(tmp_path / "tb")}
    argv = ["make", "-n", "--no-print-directory", "demo"]
    dry = subprocess.run(argv, cwd=ROOT, env=environment, capture_output=True, text=True, check=True).stdout
    specs = re.findall(r'--spec ([^\s"]+)', dry)
    assert specs, dry
    assert set(specs) == {str(tmp_path / "tb/specs/testbed.yaml")}
    assert "sed -i" not in dry
