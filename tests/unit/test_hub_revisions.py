"""Model revisions on the Hub stand-in: commit B built from commit A, both served, branches moved at run time.

Everything is checked through the REAL huggingface_hub client where the client is involved
(`HfApi.model_info`, `list_repo_tree`, `snapshot_download`); servers listen on 127.0.0.1 only.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import subprocess
import sys
import urllib.error
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from huggingface_hub import HfApi, RepoFile, snapshot_download
from huggingface_hub.errors import RevisionNotFoundError

from tests.testbed import services
from tests.testbed.config import Layout
from tests.testbed.hub import RepoInfo, StandinControl, StandinHub, build_checkpoint, build_revision
from tests.testbed.hub.checkpoint import (
    CONFIG_NAME,
    INDEX_JSON_NAME,
    MANIFEST_NAME,
    PARTED_SHARDS,
    SHARD_COUNT,
    read_manifest,
    shard_name,
)
from tests.unit.hubclient import isolated_client

REPO_ROOT = Path(__file__).resolve().parents[2]
CHANGED_SHARD = shard_name(3)
CHANGED = {CHANGED_SHARD, CONFIG_NAME, MANIFEST_NAME}
PAGE_SIZE = 7


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[RepoInfo, RepoInfo]:
    base = tmp_path_factory.mktemp("rev")
    a = build_checkpoint(base / "A", shard_mib=0.5, part_mib=0.3)
    return a, build_revision(base / "A", base / "B")


@pytest.fixture(autouse=True)
def hf_client(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    """Isolate the real client: temp HF_HOME, no token, no Xet, no telemetry; fresh HTTP session per test."""
    yield from isolated_client(monkeypatch, tmp_path / "hf-home")


@pytest.fixture
def hub(built: tuple[RepoInfo, RepoInfo]) -> Iterator[StandinHub]:
    a, b = built
    server = StandinHub([a.files_dir.parent, b.files_dir.parent], page_size=PAGE_SIZE).start()
    yield server
    server.stop()


def native_shard(files_dir: Path, n: int) -> bytes:
    name = shard_name(n)
    if n not in PARTED_SHARDS:
        return (files_dir / name).read_bytes()
    return b"".join(p.read_bytes() for p in sorted(files_dir.glob(f"{name}.part[0-9][0-9]")))


def header_of(data: bytes) -> bytes:
    (length,) = struct.unpack("<Q", data[:8])
    return data[: 8 + length]


def by_path(info: RepoInfo) -> dict[str, Any]:
    return {f.path: f for f in info.files}


# --- the builder --------------------------------------------------------------------------------------------


def test_b_differs_from_a_in_one_shard_config_and_manifest_only(built: tuple[RepoInfo, RepoInfo]) -> None:
    a, b = built
    files_a, files_b = by_path(a), by_path(b)
    assert set(files_a) == set(files_b)
    assert {p for p in files_a if files_a[p] != files_b[p]} == CHANGED
    for path in set(files_a) - CHANGED:
        assert (a.files_dir / path).read_bytes() == (b.files_dir / path).read_bytes(), path
        assert os.stat(a.files_dir / path).st_ino == os.stat(b.files_dir / path).st_ino, f"{path} is a hardlink"
    assert a.commit != b.commit
    assert len(b.commit) == 40


def test_the_changed_shard_keeps_its_size_and_header_with_other_data(built: tuple[RepoInfo, RepoInfo]) -> None:
    a, b = built
    old, new = (a.files_dir / CHANGED_SHARD).read_bytes(), (b.files_dir / CHANGED_SHARD).read_bytes()
    assert len(old) == len(new)
    assert header_of(old) == header_of(new)
    assert old[len(header_of(old)) :] != new[len(header_of(new)) :]


def test_configs_carry_their_checkpoint_tag(built: tuple[RepoInfo, RepoInfo]) -> None:
    a, b = built
    config_a = json.loads((a.files_dir / CONFIG_NAME).read_text())
    config_b = json.loads((b.files_dir / CONFIG_NAME).read_text())
    assert (config_a["checkpoint_tag"], config_b["checkpoint_tag"]) == ("A", "B")
    assert {k: v for k, v in config_a.items() if k != "checkpoint_tag"} == {
        k: v for k, v in config_b.items() if k != "checkpoint_tag"
    }


def test_bs_manifest_and_index_describe_bs_shards(built: tuple[RepoInfo, RepoInfo]) -> None:
    a, b = built
    manifest = read_manifest(b.files_dir / MANIFEST_NAME)
    assert sorted(manifest) == [shard_name(n) for n in range(1, SHARD_COUNT + 1)]
    for n in range(1, SHARD_COUNT + 1):
        assert hashlib.sha256(native_shard(b.files_dir, n)).hexdigest() == manifest[shard_name(n)]
    old = read_manifest(a.files_dir / MANIFEST_NAME)
    assert {name for name in manifest if manifest[name] != old[name]} == {CHANGED_SHARD}
    index = json.loads((b.files_dir / INDEX_JSON_NAME).read_text())
    data = native_shard(b.files_dir, 3)
    tensors = set(json.loads(header_of(data)[8:])) - {"__metadata__"}
    assert {k for k, v in index["weight_map"].items() if v == CHANGED_SHARD} == tensors


def test_revisions_are_reproducible_and_refuse_parted_shards(built: tuple[RepoInfo, RepoInfo], tmp_path: Path) -> None:
    a, b = built
    assert build_revision(a.files_dir.parent, tmp_path / "again").commit == b.commit
    assert build_revision(a.files_dir.parent, tmp_path / "two", shard=2).commit != b.commit
    assert build_checkpoint(tmp_path / "plain", shard_mib=0.5, part_mib=0.3).commit == a.commit
    with pytest.raises(ValueError, match="whole shards"):
        build_revision(a.files_dir.parent, tmp_path / "parted", shard=PARTED_SHARDS[0])
    with pytest.raises(ValueError, match="other than its base"):
        build_revision(a.files_dir.parent, a.files_dir.parent)


def test_cli_build_revision(built: tuple[RepoInfo, RepoInfo], tmp_path: Path) -> None:
    a, b = built
    argv = [sys.executable, "-m", "tests.testbed.hub", "build-revision", "--base", str(a.files_dir.parent)]
    done = subprocess.run(
        [*argv, "--out", str(tmp_path / "b")], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60, check=True
    )
    assert f"commit={b.commit}" in done.stdout


# --- serving several commits --------------------------------------------------------------------------------


def test_health_lists_the_commits_and_main_points_at_the_first(
    hub: StandinHub, built: tuple[RepoInfo, RepoInfo]
) -> None:
    a, b = built
    health = StandinControl(hub.url).health()
    assert health["commits"] == [a.commit, b.commit]
    assert health["branches"] == {"main": a.commit}
    assert health["commit"] == a.commit
    assert hub.info.commit == a.commit


def test_model_info_and_tree_at_each_commit(hub: StandinHub, built: tuple[RepoInfo, RepoInfo]) -> None:
    api = HfApi(endpoint=hub.url, token=False)
    for info in built:
        assert api.model_info(info.repo_id, revision=info.commit).sha == info.commit
        entries = {e.path: e for e in api.list_repo_tree(info.repo_id, recursive=True, revision=info.commit)}
        shard = entries[CHANGED_SHARD]
        assert isinstance(shard, RepoFile)
        assert shard.lfs is not None
        assert shard.lfs.sha256 == by_path(info)[CHANGED_SHARD].sha256
        siblings = api.model_info(info.repo_id, revision=info.commit, files_metadata=True).siblings or []
        assert {s.rfilename: s.blob_id for s in siblings} == {f.path: f.blob_id for f in info.files}
    a = built[0]
    assert api.model_info(a.repo_id, revision="main").sha == a.commit
    with pytest.raises(RevisionNotFoundError):
        api.model_info(a.repo_id, revision="0" * 40)


def test_last_commit_of_an_entry_is_the_commit_that_changed_it(
    hub: StandinHub, built: tuple[RepoInfo, RepoInfo]
) -> None:
    a, b = built
    api = HfApi(endpoint=hub.url, token=False)
    entries = {e.path: e for e in api.list_repo_tree(b.repo_id, recursive=True, expand=True, revision=b.commit)}
    last = {path: (e.last_commit.oid if e.last_commit else None) for path, e in entries.items()}
    assert {p for p, commit in last.items() if commit == b.commit} == CHANGED
    assert last[shard_name(1)] == last["exl3"] == a.commit
    newer = api.model_info(b.repo_id, revision=b.commit).last_modified
    older = api.model_info(a.repo_id, revision=a.commit).last_modified
    assert newer is not None
    assert older is not None
    assert newer > older


def test_snapshot_download_of_each_commit_gives_its_bytes(
    hub: StandinHub, built: tuple[RepoInfo, RepoInfo], tmp_path: Path
) -> None:
    control = StandinControl(hub.url)
    for info in built:
        control.clear_log()
        local = tmp_path / info.commit
        snapshot_download(
            info.repo_id,
            revision=info.commit,
            local_dir=local,
            cache_dir=tmp_path / "hf-cache",
            endpoint=hub.url,
            token=False,
        )
        for f in info.files:
            assert hashlib.sha256((local / f.path).read_bytes()).hexdigest() == f.sha256, f.path
        assert json.loads((local / CONFIG_NAME).read_text())["checkpoint_tag"] in ("A", "B")
        resolves = [e for e in control.log() if "/resolve/" in e["path"]]
        assert resolves
        assert {e["commit"] for e in resolves} == {info.commit}
    a, b = built
    assert (tmp_path / a.commit / CHANGED_SHARD).read_bytes() != (tmp_path / b.commit / CHANGED_SHARD).read_bytes()


def test_moving_main_changes_what_main_resolves_to(hub: StandinHub, built: tuple[RepoInfo, RepoInfo]) -> None:
    a, b = built
    api, control = HfApi(endpoint=hub.url, token=False), StandinControl(hub.url)
    assert control.move_branch("main", b.commit) == {"main": b.commit}
    assert api.model_info(a.repo_id, revision="main").sha == b.commit
    assert api.model_info(a.repo_id).sha == b.commit
    for revision in ("main", "refs%2Fheads%2Fmain"):
        head = httpx.head(f"{hub.url}/{a.repo_id}/resolve/{revision}/{CONFIG_NAME}")
        assert head.headers["X-Repo-Commit"] == b.commit
        assert head.headers["ETag"] == f'"{by_path(b)[CONFIG_NAME].blob_id}"'
    assert control.health()["branches"] == {"main": b.commit}
    assert hub.info.commit == b.commit

    with pytest.raises(urllib.error.HTTPError) as refused:
        control.move_branch("main", "f" * 40)
    assert refused.value.code == 400
    assert control.branches() == {"main": b.commit}, "a refused move changes nothing"

    control.move_branch("release", a.commit)
    assert api.model_info(a.repo_id, revision="release").sha == a.commit
    control.move_branch("main", a.commit)
    assert api.model_info(a.repo_id, revision="main").sha == a.commit


def test_branches_given_at_start_and_roots_of_different_repos(built: tuple[RepoInfo, RepoInfo], tmp_path: Path) -> None:
    a, b = built
    roots = [a.files_dir.parent, b.files_dir.parent]
    server = StandinHub(roots, branches={"main": b.commit})
    try:
        assert server.branches() == {"main": b.commit}
        assert server.commits == (a.commit, b.commit)
    finally:
        server.stop()
    other = build_checkpoint(tmp_path / "other", shard_mib=0.05, part_mib=0.03, repo_id="someone/else")
    with pytest.raises(ValueError, match="same repo"):
        StandinHub([a.files_dir.parent, other.files_dir.parent])
    with pytest.raises(ValueError, match="same commit"):
        StandinHub([a.files_dir.parent, a.files_dir.parent])
    with pytest.raises(ValueError, match="not a served commit"):
        StandinHub(roots, branches={"main": "0" * 40})


def test_cli_serves_several_roots_with_a_branch(built: tuple[RepoInfo, RepoInfo]) -> None:
    a, b = built
    serve = [sys.executable, "-m", "tests.testbed.hub", "serve", "--port", "0"]
    serve += ["--root", str(a.files_dir.parent), "--root", str(b.files_dir.parent), "--branch", f"main={b.commit}"]
    process = subprocess.Popen(serve, cwd=REPO_ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        line = process.stdout.readline().split()
        assert line[3].startswith("http://127.0.0.1:")
        assert f"commit={b.commit}" in line
        assert f"commits={a.commit},{b.commit}" in line
        health = StandinControl(line[3]).health()
        assert (health["commits"], health["branches"]) == ([a.commit, b.commit], {"main": b.commit})
    finally:
        process.terminate()
        assert process.wait(timeout=10) == 0
        if process.stdout is not None:
            process.stdout.close()


# --- the testbed's build ------------------------------------------------------------------------------------


def test_testbed_builds_both_commits_once_and_names_them(tmp_path: Path) -> None:
    layout = Layout(tmp_path / "tb-root")
    assert services.build_hub(layout)
    a, b = services.hub_commits(layout)
    assert a != b
    document = json.loads(layout.hub_commits_json.read_text())
    assert document["commits"] == {"A": a, "B": b}
    assert document["differs"] == sorted(CHANGED)
    assert services.hub_roots(layout) == [layout.hub, layout.hub_revision]
    assert not services.build_hub(layout), "cached while the hub code is unchanged"
    server = StandinHub(services.hub_roots(layout))
    try:
        assert server.commits == (a, b)
        assert server.branches() == {"main": a}
    finally:
        server.stop()
