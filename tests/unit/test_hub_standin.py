"""The Hugging Face Hub test stand-in (tests/testbed/hub), checked with the REAL huggingface_hub client.

The stand-in is only useful if the real client cannot tell it from the Hub for what we use, so every
download here goes through `snapshot_download`/`hf_hub_download`/`HfApi`, and the stand-in's request log
proves which requests and bytes travelled. Servers listen on 127.0.0.1 only.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import shutil
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from huggingface_hub import HfApi, RepoFile, RepoFolder, constants, hf_hub_download, snapshot_download
from huggingface_hub.errors import (
    HfHubHTTPError,
    RemoteEntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)

from tests.testbed.hub import Faults, RepoInfo, StandinControl, StandinHub, build_checkpoint
from tests.testbed.hub.checkpoint import BANKS, MANIFEST_NAME, PARTED_SHARDS, PLAN_NAME, SHARD_COUNT, shard_name
from tests.testbed.hub.repo import blob_id_of
from tests.unit.hubclient import isolated_client

REPO_ROOT = Path(__file__).resolve().parents[2]
PAGE_SIZE = 6  # small, so every listing spans several pages
TOKEN = "hf_standin_test_token"
MIB = 1 << 20


# --- fixtures -----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> RepoInfo:
    return build_checkpoint(tmp_path_factory.mktemp("ckpt"), shard_mib=1, part_mib=0.6)


@pytest.fixture(scope="module")
def built_big(tmp_path_factory: pytest.TempPathFactory) -> RepoInfo:
    """Shard 5's part00 is 11 MiB: larger than the client's 10 MiB download chunk, so a resume shows."""
    return build_checkpoint(tmp_path_factory.mktemp("ckpt-big"), shard_mib=8, part_mib=11)


@pytest.fixture(autouse=True)
def hf_client(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    """Isolate the real client: temp HF_HOME, no token, no Xet, no telemetry; fresh HTTP session per test."""
    yield from isolated_client(monkeypatch, tmp_path / "hf-home")


def _serve(info: RepoInfo, **options: Any) -> StandinHub:
    return StandinHub(info.files_dir.parent, page_size=PAGE_SIZE, **options).start()


@pytest.fixture
def hub(built: RepoInfo) -> Iterator[StandinHub]:
    server = _serve(built)
    yield server
    server.stop()


@pytest.fixture
def control(hub: StandinHub) -> StandinControl:
    return StandinControl(hub.url)


def download(hub: StandinHub, tmp_path: Path, token: str | bool = False, **options: Any) -> Path:
    """snapshot_download into tmp_path/local; the client's own cache stays outside the local dir."""
    local = tmp_path / "local"
    snapshot_download(
        hub.info.repo_id,
        local_dir=local,
        cache_dir=tmp_path / "hf-cache",
        endpoint=hub.url,
        token=token,
        **options,
    )
    return local


def sha256_of(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def native_shard(files_dir: Path, n: int) -> bytes:
    """Shard n as bytes: the file itself, or its parts concatenated."""
    name = shard_name(n)
    if n not in PARTED_SHARDS:
        return (files_dir / name).read_bytes()
    return b"".join(p.read_bytes() for p in sorted(files_dir.glob(f"{name}.part[0-9][0-9]")))


def parse_safetensors(data: bytes) -> dict[str, Any]:
    (length,) = struct.unpack("<Q", data[:8])
    header: dict[str, Any] = json.loads(data[8 : 8 + length])
    ends = sorted(v["data_offsets"] for k, v in header.items() if k != "__metadata__")
    assert ends[0][0] == 0
    assert all(a[1] == b[0] for a, b in itertools.pairwise(ends))
    assert ends[-1][1] == len(data) - 8 - length, "data section must end at the end of the file"
    return header


def resolve_url(hub: StandinHub, path: str, revision: str = "main") -> str:
    return f"{hub.url}/{hub.info.repo_id}/resolve/{revision}/{path}"


def requests_to(log: list[dict[str, Any]], fragment: str) -> list[dict[str, Any]]:
    return [e for e in log if fragment in e["path"]]


# --- the builder --------------------------------------------------------------------------------------------


def test_shards_5_and_6_exist_only_as_parts_that_rebuild_the_manifest_shards(built: RepoInfo) -> None:
    files = built.files_dir
    lines = (files / MANIFEST_NAME).read_text().splitlines()
    manifest = {name: sha for sha, name in (line.split("  ") for line in lines)}
    assert sorted(manifest) == [shard_name(n) for n in range(1, SHARD_COUNT + 1)]
    for n in range(1, SHARD_COUNT + 1):
        assert (files / shard_name(n)).exists() == (n not in PARTED_SHARDS)
        assert hashlib.sha256(native_shard(files, n)).hexdigest() == manifest[shard_name(n)]
    for n in PARTED_SHARDS:
        assert len(list(files.glob(f"{shard_name(n)}.part[0-9][0-9]"))) >= 2


def test_shards_are_valid_safetensors_covering_the_index(built: RepoInfo) -> None:
    files = built.files_dir
    index = json.loads((files / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"].values()) == {shard_name(n) for n in range(1, SHARD_COUNT + 1)}
    for n in range(1, SHARD_COUNT + 1):
        header = parse_safetensors(native_shard(files, n))
        assert header["__metadata__"]["format"] == "pt"
        assert {k for k, v in index["weight_map"].items() if v == shard_name(n)} == set(header) - {"__metadata__"}
    assert json.loads((files / "config.json").read_text())["num_hidden_layers"] > 0


def test_exl3_banks_and_plan_look_like_the_real_repo(built: RepoInfo) -> None:
    files = built.files_dir
    plan = json.loads((files / "exl3" / "plan" / PLAN_NAME).read_text())
    assert [d.split("/")[-1] for d in plan["qdir"].split(":")] == list(BANKS)
    assert plan["qdir"].startswith("/home/build/exl3/")
    layers = sorted(p.relative_to(files).as_posix() for p in files.glob("exl3/*/L??.part.safetensors"))
    assert len(layers) == 3 * len(BANKS)
    for layer in layers:
        parse_safetensors((files / layer).read_bytes())


def test_index_records_hub_hashes_and_a_content_pinned_commit(built: RepoInfo, tmp_path: Path) -> None:
    assert len(built.commit) == 40
    assert int(built.commit, 16) >= 0
    for f in built.files:
        data = (built.files_dir / f.path).read_bytes()
        assert (f.size, f.sha256) == (len(data), hashlib.sha256(data).hexdigest())
        # The Hub reports the git blob id of the LFS pointer for LFS files, of the content otherwise.
        assert f.lfs == (f.path.endswith(".safetensors") or ".safetensors.part" in f.path or f.size > MIB)
        assert f.lfs or f.blob_id == blob_id_of(data)
    again = build_checkpoint(tmp_path / "a", shard_mib=0.05, part_mib=0.03)
    assert build_checkpoint(tmp_path / "b", shard_mib=0.05, part_mib=0.03).commit == again.commit
    assert build_checkpoint(tmp_path / "c", shard_mib=0.05, part_mib=0.03, seed=1).commit != again.commit


@pytest.mark.skipif(shutil.which("bash") is None or shutil.which("sha256sum") is None, reason="needs bash, sha256sum")
def test_reassemble_sh_rebuilds_and_checks_shards_5_and_6(built: RepoInfo, tmp_path: Path) -> None:
    copy = shutil.copytree(built.files_dir, tmp_path / "model")
    done = subprocess.run(["bash", "reassemble.sh"], cwd=copy, capture_output=True, text=True, timeout=30, check=False)
    assert done.returncode == 0, done.stderr
    for n in PARTED_SHARDS:
        assert f"{shard_name(n)}: OK" in done.stdout
        assert (copy / shard_name(n)).read_bytes() == native_shard(built.files_dir, n)


# --- downloads with the real client -------------------------------------------------------------------------


def test_snapshot_by_commit_fetches_every_file_and_pages_the_tree(
    hub: StandinHub, control: StandinControl, tmp_path: Path
) -> None:
    info = hub.info
    local = download(hub, tmp_path, revision=info.commit)
    for f in info.files:
        assert sha256_of(local / f.path) == f.sha256, f.path
    assert not any((local / shard_name(n)).exists() for n in PARTED_SHARDS)

    log = control.log()
    assert not requests_to(log, "/revision/"), "2.4.0 skips the revision call for a 40-hex sha"
    tree = requests_to(log, "/tree/")
    assert len(tree) == math.ceil((len(info.files) + len(info.directories())) / PAGE_SIZE) > 1
    assert all("cursor=" in e["query"] for e in tree[1:])
    for f in info.files:
        served = requests_to(log, f"/resolve/{info.commit}/{f.path}")
        assert sorted((e["method"], e["status"]) for e in served if e["path"].endswith(f.path)) == [
            ("GET", 200),
            ("HEAD", 200),
        ]
    assert not [e for e in log if e["path"].endswith(tuple(shard_name(n) for n in PARTED_SHARDS))]


def test_main_resolves_to_the_commit_and_a_rerun_only_asks_for_the_revision(
    hub: StandinHub, control: StandinControl, tmp_path: Path
) -> None:
    download(hub, tmp_path, revision="main")
    assert control.log()[0]["path"].endswith("/revision/main")
    assert HfApi(endpoint=hub.url, token=False).model_info(hub.info.repo_id, revision="main").sha == hub.info.commit

    control.clear_log()
    download(hub, tmp_path, revision="main")
    rerun = control.log()
    assert 1 <= len(rerun) <= 2
    assert not requests_to(rerun, "/resolve/")

    control.clear_log()
    download(hub, tmp_path, revision=hub.info.commit)
    assert control.log() == [], "2.4.0: sha revision + cached tree + matching metadata = no request at all"


def test_list_repo_tree_paths_info_and_model_info(hub: StandinHub, control: StandinControl) -> None:
    api, info = HfApi(endpoint=hub.url, token=False), hub.info
    entries = list(api.list_repo_tree(info.repo_id, recursive=True))
    assert {e.path for e in entries} == {f.path for f in info.files} | set(info.directories())
    assert len(requests_to(control.log(), "/tree/")) > 1
    part = next(f for f in info.files if f.path.endswith(".part01"))
    listed = next(e for e in entries if e.path == part.path)
    assert isinstance(listed, RepoFile)
    assert listed.lfs is not None
    assert listed.lfs.sha256 == part.sha256

    top = list(api.list_repo_tree(info.repo_id, "exl3"))
    assert [e.path for e in top] == ["exl3/plan", "exl3/q31", "exl3/q31s", "exl3/qn"]
    assert all(isinstance(e, RepoFolder) for e in top)

    paths = api.get_paths_info(info.repo_id, ["config.json", "exl3", "missing.bin"], revision=info.commit)
    assert [(type(p), p.path) for p in paths] == [(RepoFile, "config.json"), (RepoFolder, "exl3")]

    siblings = api.model_info(info.repo_id, files_metadata=True).siblings or []
    by_name = {s.rfilename: s for s in siblings}
    assert set(by_name) == {f.path for f in info.files}
    lfs = by_name[part.path].lfs
    assert lfs is not None
    assert lfs.sha256 == part.sha256


def test_verify_repo_checksums_after_download_and_after_a_flipped_byte(hub: StandinHub, tmp_path: Path) -> None:
    api, info = HfApi(endpoint=hub.url, token=False), hub.info
    local = download(hub, tmp_path, revision=info.commit)
    clean = api.verify_repo_checksums(info.repo_id, local_dir=local, revision=info.commit)
    assert (clean.checked_count, clean.mismatches, clean.missing_paths, repo_paths(clean.extra_paths)) == (
        len(info.files),
        [],
        [],
        [],
    )

    part = local / f"{shard_name(5)}.part01"
    data = bytearray(part.read_bytes())
    data[100] ^= 0xFF
    part.write_bytes(bytes(data))
    (local / shard_name(5)).write_bytes(b"reassembled")
    flipped = api.verify_repo_checksums(info.repo_id, local_dir=local, revision=info.commit)
    assert [(m["path"], m["algorithm"]) for m in flipped.mismatches] == [(part.name, "sha256")]
    assert repo_paths(flipped.extra_paths) == [shard_name(5)], "a reassembled shard is not in the repo"


def repo_paths(extra: list[str]) -> list[str]:
    """Clients before 2.4 list their own download bookkeeping (.cache/huggingface/) as extra files."""
    return [path for path in extra if not path.startswith(".cache/huggingface/")]


# --- errors and tokens --------------------------------------------------------------------------------------


def test_errors_are_raised_as_the_hub_would_cause_them(hub: StandinHub, tmp_path: Path) -> None:
    with pytest.raises(RepositoryNotFoundError):
        snapshot_download("nobody/nothing", local_dir=tmp_path / "a", endpoint=hub.url, token=False)
    with pytest.raises(RevisionNotFoundError):
        download(hub, tmp_path, revision="no-such-branch")
    with pytest.raises(RemoteEntryNotFoundError):
        hf_hub_download(hub.info.repo_id, "missing.bin", local_dir=tmp_path / "b", endpoint=hub.url, token=False)
    head = httpx.head(resolve_url(hub, "missing.bin"))
    assert (head.status_code, head.headers["X-Error-Code"]) == (404, "EntryNotFound")
    assert head.headers["X-Repo-Commit"] == hub.info.commit


def test_a_token_protected_hub_needs_the_right_bearer_token(built: RepoInfo, tmp_path: Path) -> None:
    hub = _serve(built, token=TOKEN)
    try:
        with pytest.raises(RepositoryNotFoundError):
            download(hub, tmp_path, token=False)
        with pytest.raises(HfHubHTTPError) as wrong:
            download(hub, tmp_path, token="hf_wrong")
        assert not isinstance(wrong.value, RepositoryNotFoundError)
        assert wrong.value.response.status_code == 401
        answer = httpx.get(f"{hub.url}/api/models/{built.repo_id}", headers={"Authorization": "Bearer hf_wrong"})
        assert answer.headers["X-Error-Message"] == "Invalid credentials in Authorization header"

        local = download(hub, tmp_path, token=TOKEN, allow_patterns=["config.json"])
        assert sha256_of(local / "config.json") == next(f.sha256 for f in built.files if f.path == "config.json")
    finally:
        hub.stop()


# --- Range and faults ---------------------------------------------------------------------------------------


def test_range_requests_and_resolve_headers(hub: StandinHub) -> None:
    part = next(f for f in hub.info.files if f.path.endswith(".part00"))
    data = (hub.info.files_dir / part.path).read_bytes()
    url = resolve_url(hub, part.path)
    tail = httpx.get(url, headers={"Range": "bytes=10-"})
    assert (tail.status_code, tail.content) == (206, data[10:])
    assert tail.headers["Content-Range"] == f"bytes 10-{part.size - 1}/{part.size}"
    assert httpx.get(url, headers={"Range": "bytes=10-19"}).content == data[10:20]
    assert httpx.get(url, headers={"Range": "bytes=-5"}).content == data[-5:]
    beyond = httpx.get(url, headers={"Range": f"bytes={part.size}-"})
    assert (beyond.status_code, beyond.headers["Content-Range"]) == (416, f"bytes */{part.size}")

    head = httpx.head(url).headers
    assert head["X-Repo-Commit"] == hub.info.commit
    assert head["Accept-Ranges"] == "bytes"
    assert head["ETag"] == head["X-Linked-Etag"] == f'"{part.sha256}"'
    assert int(head["X-Linked-Size"]) == int(head["Content-Length"]) == part.size
    config = next(f for f in hub.info.files if f.path == "config.json")
    small = httpx.head(resolve_url(hub, "config.json")).headers
    assert small["ETag"] == f'"{config.blob_id}"'
    assert "X-Linked-Etag" not in small


def test_cut_fault_ends_a_plain_get_early(hub: StandinHub, control: StandinControl) -> None:
    part = next(f for f in hub.info.files if f.path.endswith(".part00"))
    control.cut(part.path, after_bytes=1000)
    with pytest.raises(httpx.RemoteProtocolError):
        httpx.get(resolve_url(hub, part.path))
    assert len(httpx.get(resolve_url(hub, part.path)).content) == part.size, "the cut applies once"
    first, second = control.log()
    assert (first["bytes_sent"], first["note"]) == (1000, "cut")
    assert (second["bytes_sent"], second["note"]) == (part.size, None)


def test_real_client_resumes_in_process_with_range_after_a_cut(built_big: RepoInfo, tmp_path: Path) -> None:
    """2.4.0 retries a cut body in-process from the last whole 10 MiB chunk it wrote."""
    hub = _serve(built_big)
    try:
        part = next(f for f in built_big.files if f.path == f"{shard_name(5)}.part00")
        cut = int(10.5 * MIB)
        StandinControl(hub.url).cut(part.path, after_bytes=cut)
        got = hf_hub_download(
            built_big.repo_id, part.path, revision=built_big.commit, local_dir=tmp_path, endpoint=hub.url, token=False
        )
        assert sha256_of(Path(got)) == part.sha256
        gets = [(e["range"], e["status"], e["bytes_sent"]) for e in hub.log.entries() if e["method"] == "GET"]
        resumed_at = cut // constants.DOWNLOAD_CHUNK_SIZE * constants.DOWNLOAD_CHUNK_SIZE
        assert gets == [(None, 200, cut), (f"bytes={resumed_at}-", 206, part.size - resumed_at)]
    finally:
        hub.stop()


def test_5xx_faults_are_retried_on_listing_but_not_on_the_file_body(
    hub: StandinHub, control: StandinControl, tmp_path: Path
) -> None:
    api = HfApi(endpoint=hub.url, token=False)
    control.fail(1, 503, path="*/tree/*")
    assert len(list(api.list_repo_tree(hub.info.repo_id, "exl3"))) == 4
    assert [e["status"] for e in requests_to(control.log(), "/tree/")] == [503, 200]

    control.clear_log()
    control.fail(1, 503, path="*/resolve/*", method="GET")
    with pytest.raises(HfHubHTTPError) as failed:
        hf_hub_download(hub.info.repo_id, "config.json", local_dir=tmp_path, endpoint=hub.url, token=False)
    assert failed.value.response.status_code == 503
    assert [(e["method"], e["status"]) for e in control.log()] == [("HEAD", 200), ("GET", 503)]


def test_rate_cap_slows_file_bodies(hub: StandinHub, control: StandinControl) -> None:
    url = resolve_url(hub, shard_name(1))
    control.rate(2 * MIB)
    began = time.monotonic()
    assert len(httpx.get(url, headers={"Range": "bytes=0-1048575"}).content) == MIB
    assert time.monotonic() - began >= 0.4
    control.rate(None)
    assert control.faults()["rate_bps"] is None


def test_cdn_redirect_mode_serves_lfs_from_another_origin_without_the_token(built: RepoInfo, tmp_path: Path) -> None:
    hub = _serve(built, token=TOKEN, cdn_host="localhost")
    try:
        part = next(f for f in built.files if f.path.endswith(".part00"))
        head = httpx.head(resolve_url(hub, part.path), headers={"Authorization": f"Bearer {TOKEN}"})
        assert head.status_code == 302
        assert head.headers["Location"].startswith(f"http://localhost:{hub.port}/")
        assert head.headers["X-Linked-Etag"] == f'"{part.sha256}"'
        assert head.headers["X-Repo-Commit"] == built.commit

        local = download(hub, tmp_path, token=TOKEN, allow_patterns=["*.part00", "config.json"])
        assert sha256_of(local / part.path) == part.sha256
        cdn = requests_to(hub.log.entries(), "/_standin/cdn/")
        assert len(cdn) == len(PARTED_SHARDS)
        assert not any(e["authorized"] for e in cdn)
        assert all(e["host"].startswith("localhost:") for e in cdn)
    finally:
        hub.stop()


def test_fault_specs_of_the_command_line() -> None:
    faults = Faults()
    faults.add_cli_spec("cut:model-*.part01:4096:2")
    faults.add_cli_spec("fail:2:500:*/resolve/*:get")
    faults.add_cli_spec("rate:1000")
    faults.add_cli_spec("ignore-ranges")
    assert faults.to_json() == {
        "cut": [{"path": "model-*.part01", "after_bytes": 4096, "times": 2}],
        "fail": [{"count": 2, "status": 500, "path": "*/resolve/*", "method": "GET"}],
        "rate_bps": 1000,
        "ignore_ranges": True,
    }
    assert faults.take_failure("HEAD", "/a/b/resolve/main/x") is None
    assert faults.take_failure("GET", "/a/b/resolve/main/x") == 500
    with pytest.raises(ValueError, match="bad fault spec"):
        faults.add_cli_spec("explode:now")


# --- the command line ---------------------------------------------------------------------------------------


def test_cli_build_then_serve_with_a_token(tmp_path: Path) -> None:
    command = [sys.executable, "-m", "tests.testbed.hub"]
    build = [*command, "build", "--out", str(tmp_path), "--shard-mib", "0.05", "--part-mib", "0.03"]
    built = subprocess.run(build, cwd=REPO_ROOT, capture_output=True, text=True, timeout=30, check=True)
    assert built.stdout.startswith("built 0xSero/DeepSeek-V4.1-Flash-Spark commit=")
    serve = [*command, "serve", "--root", str(tmp_path), "--port", "0", "--token", TOKEN, "--fault", "rate:100000000"]
    process = subprocess.Popen(serve, cwd=REPO_ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        url = process.stdout.readline().split()[3]
        assert url.startswith("http://127.0.0.1:")
        assert StandinControl(url).faults()["rate_bps"] == 100_000_000
        assert httpx.get(f"{url}/api/models/0xSero/DeepSeek-V4.1-Flash-Spark").status_code == 401
        authorized = httpx.get(
            f"{url}/api/models/0xSero/DeepSeek-V4.1-Flash-Spark", headers={"Authorization": f"Bearer {TOKEN}"}
        )
        assert authorized.json()["sha"] == StandinControl(url).health()["commit"]
    finally:
        process.terminate()
        assert process.wait(timeout=10) == 0
        if process.stdout is not None:
            process.stdout.close()
