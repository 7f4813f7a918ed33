"""A checkpoint revision change under the loop, on the testbed.

The Hub stand-in serves two commits of the test checkpoint, A and B, that differ in one shard
and in config.json; the engine stand-in says which config.json it loaded (`/_standin/loaded`, on rank 0's own port:
the front lets nothing through without the key).
Converged on A (`revision: main`, pinned to A), the spec is changed to B: the old group keeps
serving A until B is staged and verified on both nodes, then the group restarts in order and
serves B, and not one of A's files had its inode or mtime changed meanwhile. A is kept
(`keep_revisions: 1`), so setting A again converges without a download. Each step is timed.

The loop runs for the whole module; each test first brings the deployment to the revision it
starts from (`on_a`, `on_b`), so the tests run in any order.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import Bed, running_loop, wait_until
from tests.testbed import services
from tests.testbed.config import HOST_IP, HUB_PORT
from tests.testbed.hub.control import StandinControl

pytestmark = pytest.mark.testbed

HEAD, WORKER = "spark-head", "spark-worker"
MODEL = "/srv/spark/models/DeepSeek-V4.1-Flash-Spark"
LOOP_SETTINGS = """
loop:
  resync_s: 10
  liveness_s: 2
  liveness_timeout_s: 3
  failure_threshold: 2
  max_backoff_s: 10
"""
LOADED = (
    "import json, urllib.request\n"
    "try:\n"
    "    answer = urllib.request.urlopen('http://127.0.0.1:18000/_standin/loaded', timeout=2)\n"
    "    print(json.load(answer)['checkpoint_tag'])\n"
    "except Exception:\n"
    "    print('-')\n"
)


def loaded_tag(bed: Bed) -> str:
    return bed.node(HEAD, "python3", "-c", LOADED).stdout.strip()


def files_of(bed: Bed, node: str, directory: str) -> dict[str, str]:
    """Inode and mtime of every file of a revision directory."""
    script = f"cd {directory} && find . -path ./.cache -prune -o -type f -printf '%P %i %T@\\n'"
    lines = bed.node(node, "sh", "-c", script).stdout.splitlines()
    return {line.split(" ", 1)[0]: line.split(" ", 1)[1] for line in lines}


def status(bed: Bed) -> dict[str, Any]:
    """`status --json`: exit 0 converged, 2 not; {} when it cannot say (1, e.g. an invalid spec)."""
    result = bed.reconciler("status", "--json", check=False)
    if result.returncode == 1:
        return {}
    loaded: dict[str, Any] = json.loads(result.stdout)
    assert result.returncode == (0 if loaded["converged"] else 2), result.returncode
    return loaded


def set_revision(bed: Bed, revision: str) -> None:
    text = bed.spec.read_text(encoding="utf-8")
    bed.spec.write_text(re.sub(r"(?m)^  revision: .*$", f"  revision: {revision}", text), encoding="utf-8")


class TagWatch:
    """Which checkpoint the API serves, sampled twice a second while a revision change runs."""

    def __init__(self, bed: Bed) -> None:
        self.bed = bed
        self.seen: list[str] = []
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stopping.wait(0.5):
            tag = loaded_tag(self.bed)
            if not self.seen or self.seen[-1] != tag:
                self.seen.append(tag)

    def __enter__(self) -> TagWatch:
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stopping.set()
        self.thread.join(timeout=10)


@pytest.fixture(scope="module")
def looping(bed: Bed) -> Iterator[tuple[Bed, str, str, Path]]:
    commit_a, commit_b = services.hub_commits(bed.testbed.layout)
    bed.spec.write_text(bed.spec.read_text(encoding="utf-8") + LOOP_SETTINGS, encoding="utf-8")
    started = time.monotonic()
    bed.converged()
    print(f"converge on A (main): {time.monotonic() - started:.1f} s")
    with running_loop(bed, log_tail=6000) as log:
        yield bed, commit_a, commit_b, log


def serving(bed: Bed, revision: str, tag: str) -> None:
    set_revision(bed, revision)
    wait_until(lambda: loaded_tag(bed) == tag and status(bed).get("converged") is True, 300, f"serving {tag}")


@pytest.fixture
def on_a(looping: tuple[Bed, str, str, Path]) -> tuple[Bed, str, str, Path]:
    """`revision: main` (A), served and converged; B on no node (a test before may have staged
    it), so a change to B stages it afresh."""
    bed, _, commit_b, _ = looping
    serving(bed, "main", "A")
    for node in (HEAD, WORKER):
        bed.node(node, "rm", "-rf", f"{MODEL}@{commit_b}")
    wait_until(lambda: status(bed).get("converged") is True, 60, "converged without B")
    return looping


@pytest.fixture
def on_b(looping: tuple[Bed, str, str, Path]) -> tuple[Bed, str, str, Path]:
    """B served after A, so A is the kept revision."""
    bed, _, commit_b, _ = looping
    if loaded_tag(bed) != "B":
        serving(bed, "main", "A")
        serving(bed, commit_b, "B")
    return looping


def test_main_is_pinned_to_a_and_the_model_dir_links_to_its_revision(on_a: tuple[Bed, str, str, Path]) -> None:
    bed, commit_a, _, _ = on_a
    assert loaded_tag(bed) == "A"
    for node in (HEAD, WORKER):
        link = bed.node(node, "readlink", MODEL).stdout.strip()
        assert link == f"DeepSeek-V4.1-Flash-Spark@{commit_a}"
    record = json.loads(bed.node(HEAD, "cat", "/srv/spark/state/checkpoint.json").stdout)
    assert record["resolved"]["commit"] == commit_a
    assert bed.plan_exit() == 0


def test_a_moved_branch_is_reported_not_followed(on_a: tuple[Bed, str, str, Path]) -> None:
    bed, commit_a, commit_b, _ = on_a
    control = StandinControl(f"http://{HOST_IP}:{HUB_PORT}")
    control.move_branch("main", commit_b)
    try:
        planned = bed.reconciler("plan", "--verbose").stdout
        assert "No changes." in planned
        assert f"main has moved upstream to {commit_b[:8]}" in planned
        assert "--update-revision" in planned
        assert loaded_tag(bed) == "A"
    finally:
        control.move_branch("main", commit_a)


def test_a_new_revision_is_staged_beside_then_the_group_restarts_onto_it(on_a: tuple[Bed, str, str, Path]) -> None:
    bed, commit_a, commit_b, log = on_a
    before = {node: files_of(bed, node, f"{MODEL}@{commit_a}") for node in (HEAD, WORKER)}
    mark = len(log.read_text(encoding="utf-8"))
    started = time.monotonic()
    with TagWatch(bed) as watch:
        set_revision(bed, commit_b)
        wait_until(lambda: loaded_tag(bed) == "B" and status(bed).get("converged") is True, 300, "serving B")
    print(f"revision change A -> B, edit to converged: {time.monotonic() - started:.1f} s")
    assert [tag for tag in watch.seen if tag != "-"] == ["A", "B"], watch.seen
    text = log.read_text(encoding="utf-8")[mark:]
    verified = text.index("checkpoint on spark-worker: verify")
    stopped = text.index("ranks on spark-head: stop dsv41-r0")
    assert verified < stopped, "the old group serves until B is verified on both nodes"
    assert "link" in text[:stopped]
    after = {node: files_of(bed, node, f"{MODEL}@{commit_a}") for node in (HEAD, WORKER)}
    assert after == before, "no file of A had its inode or mtime changed"
    for node in (HEAD, WORKER):
        assert bed.node(node, "readlink", MODEL).stdout.strip() == f"DeepSeek-V4.1-Flash-Spark@{commit_b}"
        assert bed.node(node, "test", "-d", f"{MODEL}@{commit_a}", check=False).returncode == 0, "A is kept"
    shared = files_of(bed, WORKER, f"{MODEL}@{commit_b}")
    same_inode = [name for name in shared if shared[name].split()[0] == before[WORKER].get(name, " ").split()[0]]
    # All but config.json, the changed shard and the manifest that lists it are links to A's.
    assert len(same_inode) == len(shared) - 3, sorted(set(shared) - set(same_inode))
    assert bed.plan_exit() == 0


def test_rolling_back_to_the_kept_revision_downloads_nothing(on_b: tuple[Bed, str, str, Path]) -> None:
    bed, commit_a, _, log = on_b
    control = StandinControl(f"http://{HOST_IP}:{HUB_PORT}")
    since = len(control.log())
    mark = len(log.read_text(encoding="utf-8"))
    started = time.monotonic()
    set_revision(bed, commit_a)
    wait_until(lambda: loaded_tag(bed) == "A" and status(bed).get("converged") is True, 300, "serving A again")
    print(f"rollback B -> A: {time.monotonic() - started:.1f} s")
    fetched = [entry for entry in control.log(since) if entry.get("file") and entry["method"] == "GET"]
    assert fetched == [], fetched
    text = log.read_text(encoding="utf-8")[mark:]
    assert "checkpoint on spark-head: download" not in text
    assert "checkpoint on spark-worker: copy" not in text
    assert bed.plan_exit() == 0
