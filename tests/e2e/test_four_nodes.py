"""Four nodes whose workers have no route to the registry or the Hub: everything a worker needs
arrives over the fabric. A four-rank group converges from empty with the workers taking the
checkpoint and the image from peers in a chain (the head uploads each about once); the image
carries the pinned digest on every node; an image change moves only the layers that changed,
keeps the image it replaces for a rollback and prunes the one before; a worker set to pull from
the registry it cannot reach gets a blocker naming the cause and the fix.

The session's testbed has four nodes; this module's spec names all four (`bed4`)."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator

import pytest

from tests.e2e.conftest import Bed
from tests.testbed import network
from tests.testbed.config import node_named

pytestmark = pytest.mark.testbed

MODEL = "/srv/spark/models/DeepSeek-V4.1-Flash-Spark"
STORE = "/srv/spark/state/images"
WORKERS = ("spark-worker", "spark-third", "spark-fourth")
NODES = ("spark-head", *WORKERS)


def fabric_tx_bytes(bed: Bed, node: str) -> int:
    """Bytes the node has sent on its fabric port (netlink counters of its own namespace)."""
    links = json.loads(bed.node(node, "ip", "-s", "-j", "link", "show", "enp1s0f1np1").stdout)
    return int(links[0]["stats64"]["tx"]["bytes"])


def digests(bed: Bed, node: str) -> list[str]:
    """The pinned digests of every image the node's Docker holds."""
    listed = bed.node(node, "docker", "image", "ls", "--digests", "--format", "{{.Digest}}").stdout
    return sorted({line.strip() for line in listed.splitlines() if line.startswith("sha256:")})


def pinned_digest(ref: str) -> str:
    return ref.split("@", 1)[1]


def set_spec(bed: Bed, old: str, new: str) -> None:
    text = bed.spec.read_text(encoding="utf-8")
    assert old in text, f"the spec has no {old!r}"
    bed.spec.write_text(text.replace(old, new, 1), encoding="utf-8")


@pytest.fixture(scope="module")
def offline(bed4: Bed) -> Iterator[Bed]:
    """The workers without the serving image and without a route to the registry and the Hub
    (their peers still reach them over SSH and the fabric); the routes come back at the end."""
    engine = bed4.testbed.images()["engine"]
    for worker in WORKERS:
        # By its ID, whatever names it carries: a module before may have left it tagged otherwise.
        found = bed4.node(worker, "docker", "image", "inspect", "--format", "{{.Id}}", engine, check=False)
        if found.returncode == 0:
            bed4.node(worker, "docker", "image", "rm", "--force", found.stdout.strip())
        assert pinned_digest(engine) not in digests(bed4, worker)
        network.cut_services(node_named(worker), True)
    set_spec(bed4, "\nimage:\n", "\nimage:\n  worker_source: peer\n")
    try:
        yield bed4
    finally:
        for worker in WORKERS:
            network.cut_services(node_named(worker), False)


def test_four_offline_workers_converge_from_peers_and_an_image_change_moves_only_new_layers(offline: Bed) -> None:
    bed = offline
    engine = bed.testbed.images()["engine"]
    pinned = engine.split("@", 1)[1]
    planned = bed.reconciler("plan").stdout
    assert re.search(r"image on spark-head: fetch \S+ from 198\.19\.0\.1:5000 into spark-head's image store", planned)
    chain = {"spark-worker": "spark-head", "spark-third": "spark-worker", "spark-fourth": "spark-third"}
    for worker, origin in chain.items():
        assert re.search(
            rf"image on {worker}: copy the layers {worker} lacks of \S+ from {origin} over the fabric", planned
        )
        checkpoint = next(line for line in planned.splitlines() if f"checkpoint on {worker}: copy" in line)
        assert f"from {origin} into" in checkpoint, "the checkpoint goes down the same chain"
    sent = fabric_tx_bytes(bed, "spark-head")
    started = time.monotonic()
    result = bed.reconciler("apply", "--yes", timeout=900)
    print(f"four nodes converged from peers in {time.monotonic() - started:.1f} s")
    uploaded = fabric_tx_bytes(bed, "spark-head") - sent
    size = int(bed.node("spark-head", "du", "-sbL", "--exclude=.cache", MODEL).stdout.split()[0])
    image = int(bed.node("spark-head", "du", "-sb", f"{STORE}/blobs").stdout.split()[0])
    print(f"head fabric upload {uploaded} B for {size} B of checkpoint and {image} B of image")
    # Each byte leaves the head about once: the third and fourth nodes take theirs from the node before.
    assert 0.95 * (size + image) <= uploaded <= 1.3 * (size + image), uploaded
    out = result.stdout
    assert out.index("start dsv41-r3") < out.index("start dsv41-r2") < out.index("start dsv41-r1")
    assert out.index("start dsv41-r1") < out.index("start dsv41-r0")
    assert bed.plan_exit() == 0
    for rank, node in enumerate(NODES):
        assert pinned in digests(bed, node), f"{node} lacks the pinned digest {pinned}"
        command = bed.docker_json(node, "inspect", "--format", "{{json .Config.Cmd}}", f"dsv41-r{rank}")
        assert isinstance(command, list)
        assert command[command.index("--tensor-parallel-size") + 1] == "4"
        running = bed.node(node, "docker", "inspect", "--format", "{{.State.Running}}", f"dsv41-r{rank}")
        assert running.stdout.strip() == "true"

    variant = bed.testbed.push_engine_variant("four offline nodes")
    set_spec(bed, engine, variant)
    changed = bed.reconciler("apply", "--yes", timeout=900)
    text = changed.stdout + changed.stderr
    for worker, origin in chain.items():
        # The variant adds one layer: its manifest, config and that layer travel, the two shared layers stay.
        assert re.search(rf"copied 3 blobs \([^)]*\) of \S+ from {origin} to {worker}; 2 already there", text), text
    assert bed.plan_exit() == 0
    for node in WORKERS:
        # image.keep_previous (default 1): the image it replaced stays for a rollback.
        assert {variant.split("@", 1)[1], pinned} <= set(digests(bed, node))

    newest = bed.testbed.push_engine_variant("four offline nodes, again")
    set_spec(bed, variant, newest)
    bed.reconciler("apply", "--yes", timeout=900)
    assert bed.plan_exit() == 0
    for node in WORKERS:
        held = set(digests(bed, node))
        assert {newest.split("@", 1)[1], variant.split("@", 1)[1]} <= held, "the newest and the one before"
        assert pinned not in held, f"{node} keeps an image older than keep_previous allows"
    assert pinned in digests(bed, "spark-head"), "the head's image came from the testbed, not from us: never pruned"
    kept = sorted(bed.node("spark-head", "ls", f"{STORE}/refs").stdout.split())
    assert kept == sorted(ref.rsplit(":", 1)[1] + ".json" for ref in (variant, newest)), kept

    # A worker told to pull from the registry it cannot reach, once it lacks the image.
    set_spec(bed, "  - name: spark-fourth\n", "  - name: spark-fourth\n    image_source: registry\n")
    listed = bed.node("spark-fourth", "docker", "image", "ls", "--digests", "--format", "{{.Repository}}@{{.Digest}}")
    for name in listed.stdout.split():
        if name.endswith(newest.split("@", 1)[1]):
            bed.node("spark-fourth", "docker", "image", "rm", "--force", name)
    blocked = bed.reconciler("plan", check=False)
    assert "its registry 198.19.0.1:5000 cannot be reached from spark-fourth" in blocked.stdout, blocked.stdout
    assert "set image_source: peer on spark-fourth" in blocked.stdout, "the hint names the fix"
