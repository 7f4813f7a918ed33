"""Where each node's serving image comes from: its registry, or a peer over the fabric in a
chain; identity by the pinned digest whatever name a node knows the image by; the registry a
node cannot reach as a blocker; and the images we pulled that are pruned once a newer serves."""

from __future__ import annotations

from typing import Any

import pytest

from reconciler.actions import CopyImage, PruneImages, Pull, Step
from reconciler.facts.node import Facts, PulledImage, RegistryReach
from reconciler.plan import plan
from reconciler.serving import LABEL_CONFIG_HASH
from reconciler.spec import Deployment
from reconciler.spec.imageref import digest_of, local_name, registry_of, same_image
from tests.scenarios import converged_facts, empty_facts, reference_deployment, with_node

DIGEST = "sha256:" + "ab" * 32
OTHER = "sha256:" + "cd" * 32


def peer_workers(deployment: Deployment) -> Deployment:
    return deployment.model_copy(update={"image": deployment.image.model_copy(update={"worker_source": "peer"})})


def four_nodes(facts: Facts | None = None) -> tuple[Deployment, Facts]:
    deployment = reference_deployment()
    worker = deployment.nodes[1]
    facts = facts if facts is not None else empty_facts()
    nodes, observed = [*deployment.nodes], dict(facts.nodes)
    for name, ip in (("spark-third", "10.10.10.12"), ("spark-fourth", "10.10.10.14")):
        nodes.append(worker.model_copy(update={"name": name, "fabric": worker.fabric.model_copy(update={"ip": ip})}))
        observed[name] = facts.nodes["spark-worker"]
    return peer_workers(deployment.model_copy(update={"nodes": nodes})), facts.model_copy(update={"nodes": observed})


def image_actions(deployment: Deployment, facts: Facts) -> list[Any]:
    return [item for item in plan(deployment, facts).actions if item.component == "image"]


# ---------------------------------------------------------------- identity


@pytest.mark.parametrize(
    ("one", "other", "same"),
    [
        # The peer relay's name and the registry's: one image, whatever the host.
        (f"ghcr.io/a/b@{DIGEST}", f"127.0.0.1:41234/a/b@{DIGEST}", True),
        (f"ghcr.io/a/b@{DIGEST}", f"ghcr.io/a/b@{OTHER}", False),
        ("vllm/vllm-openai:latest", "vllm/vllm-openai:latest", True),
        ("vllm/vllm-openai:latest", "vllm/vllm-openai:v1", False),
        ("vllm/vllm-openai:latest", f"vllm/vllm-openai@{DIGEST}", False),
    ],
)
def test_images_are_the_same_when_their_pinned_digests_are(one: str, other: str, same: bool) -> None:
    assert same_image(one, other) is same
    assert same_image(other, one) is same


def test_a_node_knows_the_image_under_any_name_with_its_digest() -> None:
    """Docker's image ID differs between overlay2 and the containerd store; the digest does not."""
    known = ["tb/engine:latest", f"127.0.0.1:5001/tb/engine@{DIGEST}"]
    assert local_name(known, f"198.19.0.1:5000/tb/engine@{DIGEST}") == f"127.0.0.1:5001/tb/engine@{DIGEST}"
    assert local_name(known, f"198.19.0.1:5000/tb/engine@{OTHER}") is None
    assert local_name(known, "tb/engine:latest") == "tb/engine:latest"
    assert digest_of("x/y:tag") is None


@pytest.mark.parametrize(
    ("ref", "host", "path", "address"),
    [
        (f"ghcr.io/0xsero/img@{DIGEST}", "ghcr.io", "0xsero/img", ("ghcr.io", 443)),
        (f"198.19.0.1:5000/tb/engine@{DIGEST}", "198.19.0.1:5000", "tb/engine", ("198.19.0.1", 5000)),
        (f"localhost/x@{DIGEST}", "localhost", "x", ("localhost", 443)),
        ("haproxy:3.0-alpine", "docker.io", "library/haproxy", ("registry-1.docker.io", 443)),
        (f"vllm/vllm-openai:v1@{DIGEST}", "docker.io", "vllm/vllm-openai", ("registry-1.docker.io", 443)),
    ],
)
def test_the_registry_of_a_ref_follows_dockers_rule(ref: str, host: str, path: str, address: tuple[str, int]) -> None:
    registry = registry_of(ref)
    assert (registry.host, registry.path, registry.address) == (host, path, address)


def test_a_converged_node_under_the_relays_name_needs_nothing() -> None:
    deployment = peer_workers(reference_deployment())
    facts = converged_facts(deployment)
    ref = deployment.image.ref
    relay_name = f"127.0.0.1:40000/0xsero/image@{digest_of(ref)}"
    images = [name for name in facts.nodes["spark-worker"].images if name != ref] + [relay_name]
    container = facts.nodes["spark-worker"].containers[0].model_copy(update={"image": relay_name})
    facts = with_node(facts, "spark-worker", images=images, containers=[container], image_store={digest_of(ref): 10})
    result = plan(deployment, facts)
    assert result.actions == [], [item.summary for item in result.actions]


# ---------------------------------------------------------------- the chain


def test_peer_workers_take_the_image_in_a_chain_after_the_heads_fetch() -> None:
    deployment, facts = four_nodes()
    actions = image_actions(deployment, facts)
    fetch = next(item for item in actions if item.step is Step.FETCH_IMAGE)
    assert fetch.node == "spark-head"
    copies = [item for item in actions if item.step is Step.COPY_IMAGE]
    assert [(item.node, item.payload.source_node) for item in copies] == [
        ("spark-worker", "spark-head"),
        ("spark-third", "spark-worker"),
        ("spark-fourth", "spark-third"),
    ]
    assert copies[0].depends_on == (fetch.id,)
    assert copies[1].depends_on == (copies[0].id,), "a worker passes on only what its own copy completed"
    assert copies[2].depends_on == (copies[1].id,)
    assert isinstance(copies[2].payload, CopyImage)
    assert copies[2].payload.fabric == ("10.10.10.12", "10.10.10.14")
    assert "spark-third holds the image by then: the workers copy in a chain" in copies[2].cause
    pulls = {item.node: item for item in actions if item.step is Step.PULL and not item.target}
    for worker, copy in zip(("spark-worker", "spark-third", "spark-fourth"), copies, strict=True):
        assert isinstance(pulls[worker].payload, Pull)
        assert pulls[worker].payload.from_store
        assert pulls[worker].depends_on == (copy.id,)
    # The head lacks it too: its Docker loads it from the store just filled, not the registry again.
    assert isinstance(pulls["spark-head"].payload, Pull)
    assert pulls["spark-head"].payload.from_store
    assert pulls["spark-head"].depends_on == (fetch.id,)
    order = [item.step for item in actions if not item.target]
    assert order == [Step.FETCH_IMAGE, *[Step.COPY_IMAGE] * 3, *[Step.PULL] * 4], "copies first, pulls side by side"


def test_a_worker_whose_store_holds_the_image_starts_the_chain_and_the_head_fetches_nothing() -> None:
    deployment, facts = four_nodes()
    digest = digest_of(deployment.image.ref)
    facts = with_node(facts, "spark-head", images=[deployment.image.ref, deployment.api.front_image])
    facts = with_node(facts, "spark-worker", images=[deployment.image.ref], image_store={digest: 10})
    actions = image_actions(deployment, facts)
    assert not [item for item in actions if item.step is Step.FETCH_IMAGE]
    copies = [(item.node, item.payload.source_node) for item in actions if item.step is Step.COPY_IMAGE]
    assert copies == [("spark-third", "spark-worker"), ("spark-fourth", "spark-third")]


def test_with_copy_transport_ssh_the_head_sends_every_worker_its_image() -> None:
    deployment, facts = four_nodes()
    deployment = deployment.model_copy(update={"model": deployment.model.model_copy(update={"copy_transport": "ssh"})})
    copies = [item for item in image_actions(deployment, facts) if item.step is Step.COPY_IMAGE]
    assert {(item.payload.source_node, item.payload.fabric) for item in copies} == {("spark-head", None)}
    assert all("over SSH, as model.copy_transport says" in item.summary for item in copies)


def test_a_registry_the_worker_cannot_reach_is_a_blocker_naming_cause_and_fix() -> None:
    deployment = reference_deployment()
    reach = RegistryReach(address="ghcr.io:443", error="No route to host")
    facts = with_node(empty_facts(), "spark-worker", registry=reach)
    result = plan(deployment, facts)
    blocker = next(item for item in result.blockers if item.component == "image")
    assert blocker.node == "spark-worker"
    assert "its registry ghcr.io:443 cannot be reached from spark-worker: No route to host" in blocker.message
    assert "set image_source: peer on spark-worker" in blocker.hint
    assert not [item for item in result.actions if item.node == "spark-worker" and item.step is Step.PULL]
    # The same worker set to take it from a peer needs no registry.
    peered = peer_workers(deployment)
    assert not [item for item in plan(peered, facts).blockers if item.component == "image"]


def test_the_head_refuses_an_image_source_and_a_peer_needs_a_pinned_ref() -> None:
    from reconciler.spec.loading import cross_check

    deployment = reference_deployment()
    head = deployment.nodes[0].model_copy(update={"image_source": "peer"})
    problems = cross_check(deployment.model_copy(update={"nodes": [head, *deployment.nodes[1:]]}))
    assert [(path, message) for path, message, _ in problems] == [
        (("nodes", 0, "image_source"), "the head always pulls the image from its registry (it is every peer's source)")
    ]
    image = deployment.image.model_copy(update={"ref": "vllm/vllm-openai:latest", "allow_unpinned": True})
    unpinned = peer_workers(deployment.model_copy(update={"image": image}))
    assert [path for path, _, _ in cross_check(unpinned)] == [("image", "worker_source")]


# ---------------------------------------------------------------- lifecycle


def pulled(ref: str, at: str, users: list[str] | None = None, role: str = "serving") -> PulledImage:
    return PulledImage(
        ref=ref,
        id="sha256:" + at.replace("-", "")[:8].ljust(64, "0"),
        at=at,
        present=True,
        users=users or [],
        role=role,
    )


def test_older_images_we_pulled_go_once_the_new_one_serves_and_keep_previous_stay() -> None:
    deployment = reference_deployment()
    facts = converged_facts(deployment)
    name = deployment.image.ref.split("@", 1)[0]
    records = [
        pulled(f"{name}@sha256:{'1' * 64}", "2026-01-01"),
        pulled(f"{name}@sha256:{'2' * 64}", "2026-02-01"),
        pulled(f"{name}@sha256:{'3' * 64}", "2026-03-01"),
        pulled(deployment.image.ref, "2026-04-01", users=["dsv41-r0"]),
        pulled(deployment.api.front_image, "2026-01-01", role="front"),
    ]
    facts = with_node(facts, "spark-head", pulled=records, image_store={f"sha256:{'1' * 64}": 5})
    prunes = [item for item in plan(deployment, facts).actions if item.step is Step.PRUNE_IMAGES]
    assert [item.node for item in prunes] == ["spark-head"]
    payload = prunes[0].payload
    assert isinstance(payload, PruneImages)
    # keep_previous 1: the newest other image stays; the front's image is no serving image.
    assert payload.remove == [records[0].ref, records[1].ref]
    assert payload.keep == sorted([str(digest_of(deployment.image.ref)), f"sha256:{'3' * 64}"])
    shrunk = deployment.model_copy(update={"image": deployment.image.model_copy(update={"keep_previous": 0})})
    payload = next(item for item in plan(shrunk, facts).actions if item.step is Step.PRUNE_IMAGES).payload
    assert payload.remove == [records[0].ref, records[1].ref, records[2].ref]  # type: ignore[union-attr]


def test_an_image_a_container_uses_is_pruned_only_when_our_rank_restarts_off_it() -> None:
    deployment = reference_deployment()
    facts = converged_facts(deployment)
    old = f"{deployment.image.ref.split('@', 1)[0]}@sha256:{'1' * 64}"
    shrunk = deployment.model_copy(update={"image": deployment.image.model_copy(update={"keep_previous": 0})})
    mine = with_node(facts, "spark-worker", pulled=[pulled(old, "2026-01-01", users=["someones-container"])])
    assert not [item for item in plan(shrunk, mine).actions if item.step is Step.PRUNE_IMAGES]
    # The ranks run the old image and restart onto the spec's: the prune waits for the group's readiness.
    running = facts.nodes["spark-worker"].containers[0]
    labels = {**running.labels, LABEL_CONFIG_HASH: "rendered-for-the-old-image"}
    container = running.model_copy(update={"image": old, "labels": labels})
    ours = with_node(
        facts, "spark-worker", pulled=[pulled(old, "2026-01-01", users=["dsv41-r1"])], containers=[container]
    )
    result = plan(shrunk, ours)
    prune = next(item for item in result.actions if item.step is Step.PRUNE_IMAGES)
    ready = next(item for item in result.actions if item.step in (Step.SMOKE, Step.WAIT_READY))
    assert result.actions.index(prune) > result.actions.index(ready)
    assert prune.depends_on, "after the group's restart"


# ---------------------------------------------------------------- what a node says


@pytest.mark.parametrize(
    "raw",
    [
        {"image_store": ["not", "a", "mapping"], "pulled": {"a": 1}, "registry": "down"},
        {"image_store": {"sha256:zz": 5, DIGEST: -1, OTHER: "big"}, "pulled": [{"ref": 1}], "registry": {"error": 3}},
        {"image_store": {DIGEST: 2**80}, "pulled": [{"ref": "x", "id": "y" * 500}], "registry": {"address": "a" * 999}},
    ],
)
def test_malformed_image_facts_are_left_out_never_raised(raw: dict[str, Any]) -> None:
    """A store, a pull record or a reachability answer that cannot be read counts as absent: no
    blob is then passed on, no image pruned, and a registry is taken as reachable (its pull says more)."""
    from reconciler.facts.gather import node_facts_from_probe

    base = {"docker": {"containers": [], "images": []}, "home": "/home/nvidia", "checkpoint": {}}
    facts = node_facts_from_probe(reference_deployment().head, {**base, **raw})
    assert facts.reachable, facts.error
    assert set(facts.image_store) <= {DIGEST}
    assert facts.pulled == []
    assert facts.registry is None


def test_the_probe_reports_the_store_and_our_pulls_as_a_node_has_them(tmp_path: Any) -> None:
    """The real probe on this machine: a ref record in the store, a pull record, and a registry
    that refuses the connection; without Docker the image is missing, so the registry is asked."""
    import json
    import socket

    from reconciler.facts.gather import node_facts_from_probe, probe_args
    from reconciler.nodeside.statedir import StateDir
    from reconciler.transport.base import run_program
    from reconciler.transport.local import LocalTransport

    layout = StateDir(str(tmp_path / "state"))
    (tmp_path / "state/images/refs").mkdir(parents=True)
    (tmp_path / "state/images/blobs/sha256").mkdir(parents=True)
    for digest, size in ((DIGEST, 3), (OTHER, 7)):
        (tmp_path / f"state/images/blobs/sha256/{digest[7:]}").write_bytes(b"x" * size)
    record = {"ref": f"r/x@{DIGEST}", "digest": DIGEST, "blobs": {DIGEST: 3, OTHER: 7}, "layers": [OTHER]}
    (tmp_path / f"state/images/refs/{DIGEST[7:]}.json").write_text(json.dumps(record), encoding="utf-8")
    other = {**record, "ref": f"r/y@{OTHER}", "digest": OTHER, "blobs": {OTHER: 7, "sha256:" + "ef" * 32: 1}}
    (tmp_path / f"state/images/refs/{OTHER[7:]}.json").write_text(json.dumps(other), encoding="utf-8")
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    deployment = reference_deployment()
    image = deployment.image.model_copy(update={"ref": f"127.0.0.1:{port}/r/x@{DIGEST}"})
    deployment = deployment.model_copy(update={"image": image, "state_dir": layout.root})
    args = probe_args(deployment, deployment.head)
    raw = run_program(LocalTransport("spark-head"), "probe", "print_probe", args)
    # The second record lists a blob that is not there: that image is not held whole.
    assert raw["image_store"] == {DIGEST: 10}
    raw["docker"] = {"containers": [], "images": []}
    facts = node_facts_from_probe(deployment.head, raw)
    assert facts.image_store == {DIGEST: 10}
    assert facts.registry is not None
    assert facts.registry.address == f"127.0.0.1:{port}"
    assert facts.registry.error == "Connection refused"


def test_an_ipv6_registry_is_connected_to_without_its_brackets() -> None:
    assert registry_of(f"[fd00::1]:5000/a/b@{DIGEST}").address == ("fd00::1", 5000)
    assert registry_of(f"[fd00::1]/a/b@{DIGEST}").address == ("fd00::1", 443)


def test_a_record_from_before_roles_counts_only_when_it_is_of_the_serving_images_repository() -> None:
    """Records written before roles carry none: the front's HAProxy never takes a keep_previous slot."""
    deployment = reference_deployment().model_copy(update={})
    deployment = deployment.model_copy(update={"image": deployment.image.model_copy(update={"keep_previous": 1})})
    facts = converged_facts(deployment)
    name = deployment.image.ref.split("@", 1)[0]
    old, older = f"{name}@sha256:{'2' * 64}", f"{name}@sha256:{'1' * 64}"
    records = [
        PulledImage(ref=older, id="sha256:" + "1" * 64, at="2026-01-01", present=True),
        PulledImage(ref=old, id="sha256:" + "2" * 64, at="2026-02-01", present=True),
        PulledImage(ref=f"haproxy:3.0@sha256:{'9' * 64}", id="sha256:" + "9" * 64, at="2026-03-01", present=True),
    ]
    facts = with_node(facts, "spark-head", pulled=records)
    prune = next(item for item in plan(deployment, facts).actions if item.step is Step.PRUNE_IMAGES)
    assert isinstance(prune.payload, PruneImages)
    assert prune.payload.remove == [older]
    assert f"sha256:{'2' * 64}" in prune.payload.keep


def test_an_image_docker_refused_to_remove_is_not_planned_again() -> None:
    deployment = reference_deployment()
    deployment = deployment.model_copy(update={"image": deployment.image.model_copy(update={"keep_previous": 0})})
    old = f"{deployment.image.ref.split('@', 1)[0]}@sha256:{'1' * 64}"
    refused = PulledImage(ref=old, id="sha256:" + "1" * 64, at="2026-01-01", present=True, refused="has children")
    facts = with_node(converged_facts(deployment), "spark-head", pulled=[refused])
    assert plan(deployment, facts).actions == []


def test_a_head_that_cannot_reach_the_registry_blocks_the_chain_and_plans_no_pull_from_an_empty_store() -> None:
    deployment, facts = four_nodes()
    reach = RegistryReach(address="ghcr.io:443", error="Network is unreachable")
    facts = with_node(facts, "spark-head", registry=reach)
    result = plan(deployment, facts)
    assert [item.id for item in result.actions if item.component == "image" and not item.target] == []
    blocker = next(item for item in result.blockers if item.component == "image")
    assert blocker.node == "spark-head"
    assert "the head pulls the image for itself and for its peers" in blocker.hint
