"""Mid-file resume across processes, with the real huggingface_hub client and the Hub stand-in.

huggingface_hub >= 1.18 never reuses a killed run's partial file; the reconciler does: this
test kills a download in the middle of a shard and proves that the next run fetches only the
bytes that were missing (the stand-in's request log shows the Range and the bytes sent).
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from huggingface_hub._local_folder import _short_hash

from reconciler.hub import fetch, fetch_order, list_files
from reconciler.repofiles import HubFile
from reconciler.spec import Model
from tests.testbed.hub.server import StandinHub
from tests.unit.hubclient import kill_when, serving_checkpoint

ROOT = Path(__file__).resolve().parents[2]
SHARD = "model-00001-of-00006.safetensors"


@pytest.fixture
def hub(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Iterator[StandinHub]:
    yield from serving_checkpoint(tmp_path_factory, monkeypatch, shard_mib=24, part_mib=20)


def partial_of(model_dir: Path) -> Path | None:
    found = [p for p in (model_dir / ".cache/huggingface/download").glob("*.incomplete") if p.stat().st_size > 0]
    return max(found, key=lambda p: p.stat().st_size, default=None)


def start_download(model: Model, model_dir: Path) -> subprocess.Popen[bytes]:
    code = (
        "import sys, json; from reconciler.hub import fetch; from reconciler.spec import Model\n"
        "model = Model.model_validate(json.loads(sys.argv[1]))\n"
        "fetch(model, sys.argv[2], commit=model.revision, report=print)\n"
    )
    argv = [sys.executable, "-c", code, model.model_dump_json(), str(model_dir)]
    return subprocess.Popen(argv, cwd=ROOT, env=os.environ.copy(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def kill_mid_file(process: subprocess.Popen[bytes], model_dir: Path, at_least: int) -> None:
    def far_enough() -> bool:
        partial = partial_of(model_dir)
        return partial is not None and partial.stat().st_size >= at_least

    kill_when(process, far_enough, "mid-file", timeout=30)


def test_a_killed_download_resumes_mid_file(hub: StandinHub, tmp_path: Path) -> None:
    model = Model(endpoint=hub.url, revision=hub.info.commit)
    model_dir = tmp_path / "model"
    hub.faults.set_rate(12 * 1024 * 1024)
    process = start_download(model, model_dir)
    kill_mid_file(process, model_dir, at_least=6 * 1024 * 1024)
    partial = partial_of(model_dir)
    assert partial is not None
    have = partial.stat().st_size
    listing = {item.path: item for item in list_files(model).files}
    resumed_path = next(path for path, item in listing.items() if partial.name.split(".")[1] == item.etag)
    size = listing[resumed_path].size
    assert 0 < have < size, "killed in the middle of the file"
    hub.faults.set_rate(None)
    seen = len(hub.log.entries())
    lines: list[str] = []
    fetch(model, str(model_dir), commit=model.revision, report=lines.append)
    after = [entry for entry in hub.log.entries(seen) if entry["file"] == resumed_path and entry["method"] == "GET"]
    print(f"{resumed_path}: {have} of {size} bytes kept; re-fetched {[e['bytes_sent'] for e in after]}")
    assert [entry["range"] for entry in after] == [f"bytes={have}-"]
    assert after[0]["bytes_sent"] == size - have
    assert any(f"resuming {resumed_path} at byte {have}" in line for line in lines)
    expected = listing[resumed_path].sha256
    assert hashlib.sha256((model_dir / resumed_path).read_bytes()).hexdigest() == expected
    assert partial_of(model_dir) is None, "no partial garbage is left behind"


def test_a_partial_for_another_etag_is_discarded_not_appended(hub: StandinHub, tmp_path: Path) -> None:
    model = Model(endpoint=hub.url, revision=hub.info.commit)
    model_dir = tmp_path / "model"
    fetch(model, str(model_dir), commit=model.revision, report=print)
    listing = {item.path: item for item in list_files(model).files}
    shard = listing[SHARD]
    metadata = model_dir / ".cache/huggingface/download" / f"{SHARD}.metadata"
    (model_dir / SHARD).unlink()
    metadata.unlink()
    stale = metadata.parent / f"{_short_hash(SHARD + '.metadata')}.{'0' * 64}.abcdef12.incomplete"
    stale.write_bytes(b"x" * 1000)
    seen = len(hub.log.entries())
    fetch(model, str(model_dir), commit=model.revision, report=print)
    gets = [e for e in hub.log.entries(seen) if e["file"] == SHARD and e["method"] == "GET"]
    assert [entry["range"] for entry in gets] == [None]
    assert not stale.exists()
    assert hashlib.sha256((model_dir / SHARD).read_bytes()).hexdigest() == shard.sha256


def test_each_file_is_reported_once_as_it_lands_parts_first_and_again_without_a_download(
    hub: StandinHub, tmp_path: Path
) -> None:
    model = Model(endpoint=hub.url, revision=hub.info.commit)
    model_dir = tmp_path / "model"
    landed: list[str] = []
    on_disk: list[bool] = []

    def seen(item: HubFile) -> None:
        landed.append(item.path)
        on_disk.append((model_dir / item.path).stat().st_size == item.size)

    listing = fetch(model, str(model_dir), commit=model.revision, report=lambda _line: None, on_file=seen)
    assert sorted(landed) == sorted(item.path for item in listing.files), "every file, each once"
    assert all(on_disk), "a file is reported once it is complete on disk"
    order = fetch_order(listing.files)
    is_part = [".safetensors.part" in item.path for item in order]
    assert any(is_part), "the checkpoint has parts"
    assert is_part == sorted(is_part, reverse=True), "parts first: their shard is reassembled while the rest comes"
    rest = [item.size for item in order if ".safetensors.part" not in item.path]
    assert rest == sorted(rest, reverse=True), "then the biggest first, the many small files last"
    seen_before = len(hub.log.entries())
    again: list[str] = []
    fetch(
        model, str(model_dir), commit=model.revision, report=lambda _line: None, on_file=lambda i: again.append(i.path)
    )
    assert sorted(again) == sorted(landed), "files already complete are reported too (a resumed apply)"
    assert not [e for e in hub.log.entries(seen_before) if e["method"] == "GET" and e["file"]], "nothing downloaded"


def test_a_symlink_planted_at_a_partial_is_not_followed(hub: StandinHub, tmp_path: Path) -> None:
    """A link at a killed run's partial name, to a file outside: removed, not appended through."""
    model = Model(endpoint=hub.url, revision=hub.info.commit)
    model_dir = tmp_path / "model"
    shard = next(item for item in list_files(model).files if item.path == SHARD)
    cache = model_dir / ".cache/huggingface/download"
    cache.mkdir(parents=True)
    outside = tmp_path / "outside"
    outside.write_bytes(b"o" * 1000)
    link = cache / f"{_short_hash(SHARD + '.metadata')}.{shard.etag}.abcdef12.incomplete"
    link.symlink_to(outside)
    fetch(model, str(model_dir), commit=model.revision, report=print)
    assert outside.read_bytes() == b"o" * 1000, "the file outside was appended to"
    assert not (model_dir / SHARD).is_symlink()
    assert hashlib.sha256((model_dir / SHARD).read_bytes()).hexdigest() == shard.sha256
    assert not link.is_symlink()
