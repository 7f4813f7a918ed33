"""Ranged downloads (reconciler/hub/ranges.py) with the real Hub client's HTTP stack and the Hub
stand-in: a big file comes in one byte range per stream, resumes every range where a killed run
stopped, survives a cut, and falls back to the client's whole-file download when the Hub
ignores Range. The range floor is lowered so the stand-in's small shards are split."""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx2
import pytest
from huggingface_hub import hf_hub_url

from reconciler.errors import HubError, RangesIgnoredError
from reconciler.hub import HubListing, downloaded, fetch, list_files
from reconciler.hub import ranges as hubranges
from reconciler.repofiles import HubFile
from reconciler.spec import Model
from tests.testbed.hub.faults import CutRule, FailRule
from tests.testbed.hub.server import StandinHub
from tests.unit.hubclient import kill_when, serving_checkpoint

ROOT = Path(__file__).resolve().parents[2]
MIB = 1024 * 1024
FLOOR = 2 * MIB  # the test's MIN_RANGE_BYTES: a 24 MiB shard is split in 8
SHARD = "model-00001-of-00006.safetensors"


@pytest.fixture
def hub(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Iterator[StandinHub]:
    monkeypatch.setattr(hubranges, "MIN_RANGE_BYTES", FLOOR)
    monkeypatch.setattr(hubranges, "DURABLE_EVERY_BYTES", MIB // 2)
    yield from serving_checkpoint(tmp_path_factory, monkeypatch, shard_mib=24, part_mib=20)


def sha256_of(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def file_gets(hub: StandinHub, path: str, since: int = 0) -> list[dict[str, object]]:
    return [e for e in hub.log.entries(since) if e["file"] == path and e["method"] == "GET"]


def leftovers(model_dir: Path) -> list[str]:
    cache = model_dir / ".cache/huggingface/download"
    endings = (".ranges", ".ranges.json", ".ranges.json.tmp", ".incomplete")
    return sorted(p.name for p in cache.rglob("*") if p.name.endswith(endings) or ".ranges.json.tmp-" in p.name)


def assert_all_verified(model_dir: Path, listing: HubListing) -> None:
    for item in listing.files:
        if item.sha256 is not None:
            assert sha256_of(model_dir / item.path) == item.sha256, item.path


# --- the split and its progress file, alone ---------------------------------------------------------


@pytest.mark.parametrize("size", [32 * MIB, 32 * MIB + 1, 100 * MIB + 7, 5 * 1024 * MIB])
@pytest.mark.parametrize("streams", [2, 3, 8, 64])
def test_the_split_covers_the_file_once_in_at_most_one_range_per_stream(size: int, streams: int) -> None:
    ranges = hubranges.split(size, streams)
    assert ranges is not None
    assert ranges[0][0] == 0
    assert ranges[-1][1] == size
    assert all(a[1] == b[0] for a, b in itertools.pairwise(ranges)), "contiguous"
    assert len(ranges) <= streams
    assert all(end - start >= hubranges.MIN_RANGE_BYTES // 2 for start, end in ranges)


@pytest.mark.parametrize(("size", "streams"), [(32 * MIB - 1, 8), (5 * 1024 * MIB, 1), (0, 8)])
def test_a_small_file_or_one_stream_is_fetched_whole(size: int, streams: int) -> None:
    assert hubranges.split(size, streams) is None


BAD_PROGRESS: list[object] = [
    None,
    [],
    {"size": 10},
    {"size": 10, "ranges": []},
    {"size": 10, "ranges": [[0, 5, 0]]},  # does not reach the end
    {"size": 10, "ranges": [[0, 5, 0], [6, 10, 0]]},  # a gap
    {"size": 10, "ranges": [[0, 5, 0], [4, 10, 0]]},  # an overlap
    {"size": 10, "ranges": [[0, 10, 11]]},  # more done than the range holds
    {"size": 10, "ranges": [[0, 10, -1]]},
    {"size": 10, "ranges": [[0, 10, True]]},
    {"size": 10, "ranges": [[0, 10.0, 0]]},
    {"size": 10, "ranges": [[0, 10]]},
    {"size": 11, "ranges": [[0, 10, 0]]},  # another size
    {"size": 10, "ranges": [[0, 0, 0], [0, 10, 0]]},  # an empty range
]


@pytest.mark.parametrize("document", BAD_PROGRESS)
def test_a_progress_document_that_does_not_describe_the_file_is_not_trusted(document: object) -> None:
    assert hubranges.progress_of(document, 10) is None


def test_a_progress_document_is_read_back() -> None:
    document = {"size": 10, "ranges": [[0, 4, 4], [4, 10, 2]]}
    assert hubranges.progress_of(document, 10) == ([(0, 4), (4, 10)], {0: 4, 4: 2})


TARGET = hubranges.Target(url="http://hub/x", root=Path("/nonexistent"), path=SHARD, size=1000, etag="e", commit="c")


@pytest.mark.parametrize(
    ("status", "headers", "said"),
    [
        (206, {"content-range": "bytes 0-99/1000"}, "bytes 100-199/1000"),  # another span
        (206, {}, "Content-Range None"),
        (206, {"content-range": "bytes 100-199/1000", "content-encoding": "gzip"}, "compressed (gzip)"),
        (200, {"content-length": "17"}, "200 of '17' bytes"),  # an error page, not the file
        (204, {}, "HTTP 204"),
    ],
)
def test_a_range_answered_otherwise_is_a_hub_error_that_says_so(
    status: int, headers: dict[str, str], said: str
) -> None:
    with pytest.raises(HubError) as caught:
        hubranges._check_answer(httpx2.Response(status, headers=headers), TARGET, 100, 200)
    assert said in caught.value.message
    assert "download_streams: 1" in caught.value.hint


def test_a_whole_file_answer_means_the_hub_ignores_ranges() -> None:
    with pytest.raises(RangesIgnoredError):
        hubranges._check_answer(httpx2.Response(200, headers={"content-length": "1000"}), TARGET, 100, 200)


def test_retry_after_is_honoured_within_bounds() -> None:
    def refusal(after: str) -> hubranges._PassingRefusalError:
        return hubranges._PassingRefusalError(httpx2.Response(429, headers={"retry-after": after}))

    assert hubranges._pause(refusal("3"), 1) == 3.0
    assert hubranges._pause(refusal("3600"), 1) == hubranges.MAX_PAUSE_S
    assert hubranges._pause(refusal("soon"), 3) == 4.0  # not a number of seconds: the backoff


# --- against the Hub stand-in ---------------------------------------------------------------------


def test_a_big_file_comes_in_one_range_per_stream_and_lands_verified(hub: StandinHub, tmp_path: Path) -> None:
    model = Model(endpoint=hub.url, revision=hub.info.commit)
    model_dir = tmp_path / "model"
    landed: list[str] = []
    listing = fetch(model, str(model_dir), commit=model.revision, report=print, on_file=lambda i: landed.append(i.path))
    assert sorted(landed) == sorted(item.path for item in listing.files), "every file reported once"
    assert_all_verified(model_dir, listing)
    size = next(item.size for item in listing.files if item.path == SHARD)
    expected = hubranges.split(size, model.download_streams)
    assert expected is not None
    assert len(expected) == 8
    ranges = sorted(str(e["range"]) for e in file_gets(hub, SHARD))
    assert ranges == sorted(f"bytes={start}-{end - 1}" for start, end in expected)
    assert sum(int(str(e["bytes_sent"])) for e in file_gets(hub, SHARD)) == size, "each byte once"
    assert leftovers(model_dir) == []
    seen = len(hub.log.entries())
    fetch(model, str(model_dir), commit=model.revision, report=print)
    assert not [e for e in hub.log.entries(seen) if e["method"] == "GET" and e["file"]], "recorded as downloaded"


def start_download(model: Model, model_dir: Path) -> subprocess.Popen[bytes]:
    code = (
        "import sys, json; from reconciler.hub import ranges as hubranges; from reconciler.hub import fetch\n"
        "from reconciler.spec import Model\n"
        f"hubranges.MIN_RANGE_BYTES = {FLOOR}; hubranges.DURABLE_EVERY_BYTES = {MIB // 2}\n"
        "model = Model.model_validate(json.loads(sys.argv[1]))\n"
        "fetch(model, sys.argv[2], commit=model.revision, report=print)\n"
    )
    argv = [sys.executable, "-c", code, model.model_dump_json(), str(model_dir)]
    return subprocess.Popen(argv, cwd=ROOT, env=os.environ.copy(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def progress_files(model_dir: Path) -> list[Path]:
    return list((model_dir / ".cache/huggingface/download").rglob(f"*{hubranges.PROGRESS_SUFFIX}"))


def kill_once_ranges_progress(process: subprocess.Popen[bytes], model_dir: Path, at_least: int) -> None:
    def far_enough() -> bool:
        return any(hubranges.ranged_bytes(path) >= at_least for path in progress_files(model_dir))

    kill_when(process, far_enough, "in its ranges")


def test_a_killed_ranged_download_resumes_every_range_where_it_stopped(hub: StandinHub, tmp_path: Path) -> None:
    model = Model(endpoint=hub.url, revision=hub.info.commit)
    model_dir = tmp_path / "model"
    hub.faults.set_rate(2 * MIB)  # per connection: eight ranges at once, each well under way
    kill_once_ranges_progress(start_download(model, model_dir), model_dir, at_least=4 * MIB)
    listing = list_files(model)
    (progress,) = [p for p in progress_files(model_dir) if hubranges.ranged_bytes(p) >= 4 * MIB][:1]
    saved = json.loads(progress.read_text())
    item = next(i for i in listing.files if progress.name.split(".")[1] == i.etag)
    have = sum(done for _start, _end, done in saved["ranges"])
    assert 0 < have < item.size
    meter = downloaded(model_dir, listing.files)
    assert meter.done >= have, "the meter counts a ranged file's bytes from its progress"
    hub.faults.set_rate(None)
    seen = len(hub.log.entries())
    lines: list[str] = []
    fetch(model, str(model_dir), commit=model.revision, report=lines.append)
    wanted = sorted(f"bytes={start + done}-{end - 1}" for start, end, done in saved["ranges"] if done < end - start)
    gets = file_gets(hub, item.path, seen)
    assert sorted(str(e["range"]) for e in gets) == wanted, "each range from where it stopped"
    assert sum(int(str(e["bytes_sent"])) for e in gets) == item.size - have
    assert any(f"resuming {item.path} at byte {have} of {item.size} (in ranges)" in line for line in lines)
    assert_all_verified(model_dir, listing)
    assert leftovers(model_dir) == []


def test_a_cut_in_the_middle_of_a_range_goes_on_from_its_last_byte(hub: StandinHub, tmp_path: Path) -> None:
    model = Model(endpoint=hub.url, revision=hub.info.commit)
    model_dir = tmp_path / "model"
    hub.faults.add_cut(CutRule(path=SHARD, after_bytes=MIB + 12345))
    listing = fetch(model, str(model_dir), commit=model.revision, report=print)
    assert_all_verified(model_dir, listing)
    gets = file_gets(hub, SHARD)
    (cut,) = [e for e in gets if e["note"] == "cut"]
    start, end = (int(n) for n in str(cut["range"]).removeprefix("bytes=").split("-"))
    again = [e for e in gets if int(str(e["seq"])) > int(str(cut["seq"])) and str(e["range"]).endswith(f"-{end}")]
    (resumed,) = [int(str(e["range"]).removeprefix("bytes=").split("-")[0]) for e in again]
    # From its last byte in (what came of a read cut short comes again).
    assert start + 12345 <= resumed <= start + MIB + 12345
    assert resumed > start, "not from the range's start"
    assert leftovers(model_dir) == []


def test_a_hub_that_ignores_range_gets_each_big_file_whole_from_the_client(hub: StandinHub, tmp_path: Path) -> None:
    model = Model(endpoint=hub.url, revision=hub.info.commit)
    model_dir = tmp_path / "model"
    hub.faults.set_ignore_ranges(True)
    listing = fetch(model, str(model_dir), commit=model.revision, report=print)
    assert_all_verified(model_dir, listing)
    for item in listing.files:
        gets = file_gets(hub, item.path)
        assert len([e for e in gets if e["range"] is None]) == 1, f"{item.path}: one whole download"
        assert len(gets) <= 1 + model.download_streams, "ranges given up at the first whole answer"
    assert leftovers(model_dir) == []


def test_a_garbled_progress_file_starts_that_file_afresh(hub: StandinHub, tmp_path: Path) -> None:
    model = Model(endpoint=hub.url, revision=hub.info.commit)
    model_dir = tmp_path / "model"
    listing = list_files(model)
    item: HubFile = next(i for i in listing.files if i.path == SHARD)
    base = hubranges.partial_base(model_dir, SHARD, item.etag)
    Path(base).parent.mkdir(parents=True)
    Path(f"{base}{hubranges.RANGES_SUFFIX}").write_bytes(b"\0" * item.size)
    Path(f"{base}{hubranges.PROGRESS_SUFFIX}").write_text('{"size": 1, "ranges": "all of it"}')
    stale = hubranges.partial_base(model_dir, SHARD, "0" * 64)
    Path(f"{stale}{hubranges.PROGRESS_SUFFIX}").write_text("{}")
    fetch(model, str(model_dir), commit=model.revision, report=print)
    assert sha256_of(model_dir / SHARD) == item.sha256
    assert sum(int(str(e["bytes_sent"])) for e in file_gets(hub, SHARD)) == item.size
    assert leftovers(model_dir) == []


def test_a_passing_refusal_of_a_range_is_asked_again(hub: StandinHub, tmp_path: Path) -> None:
    model = Model(endpoint=hub.url, revision=hub.info.commit)
    model_dir = tmp_path / "model"
    hub.faults.add_fail(FailRule(count=2, status=503, path=f"*/{SHARD}", method="GET"))
    listing = fetch(model, str(model_dir), commit=model.revision, report=print)
    assert_all_verified(model_dir, listing)
    gets = [e for e in hub.log.entries() if str(e["path"]).endswith(f"/{SHARD}") and e["method"] == "GET"]
    assert sorted(int(str(e["status"])) for e in gets) == [206] * 8 + [503, 503]
    assert leftovers(model_dir) == []


def test_a_lasting_refusal_fails_the_download_and_keeps_what_came(hub: StandinHub, tmp_path: Path) -> None:
    model = Model(endpoint=hub.url, revision=hub.info.commit)
    model_dir = tmp_path / "model"
    hub.faults.add_fail(FailRule(count=1000, status=403, path=f"*/{SHARD}", method="GET"))
    with pytest.raises(HubError) as caught:
        fetch(model, str(model_dir), commit=model.revision, report=print)
    assert "403" in caught.value.message
    assert not (model_dir / SHARD).exists()
    assert any(name.endswith(hubranges.PROGRESS_SUFFIX) for name in leftovers(model_dir)), "kept for a resume"
    hub.faults.clear()
    listing = fetch(model, str(model_dir), commit=model.revision, report=print)
    assert_all_verified(model_dir, listing)
    assert leftovers(model_dir) == []


def test_one_stream_after_a_killed_ranged_run_fetches_that_file_whole(hub: StandinHub, tmp_path: Path) -> None:
    """`download_streams: 1` is the way out of a Hub that mangles ranges: it must mean whole."""
    model = Model(endpoint=hub.url, revision=hub.info.commit)
    model_dir = tmp_path / "model"
    hub.faults.set_rate(2 * MIB)
    kill_once_ranges_progress(start_download(model, model_dir), model_dir, at_least=2 * MIB)
    hub.faults.set_rate(None)
    seen = len(hub.log.entries())
    one = model.model_copy(update={"download_streams": 1})
    listing = fetch(one, str(model_dir), commit=one.revision, report=print)
    assert_all_verified(model_dir, listing)
    ranged = [e for e in hub.log.entries(seen) if e["method"] == "GET" and e["file"] and e["range"] is not None]
    assert ranged == [], "no range asked for"
    assert leftovers(model_dir) == []


def test_a_file_whose_ranges_were_all_in_is_put_in_place_without_a_download(hub: StandinHub, tmp_path: Path) -> None:
    """Killed after its last range and before the rename: nothing is fetched again."""
    model = Model(endpoint=hub.url, revision=hub.info.commit)
    model_dir = tmp_path / "model"
    listing = fetch(model, str(model_dir), commit=model.revision, report=print)
    item = next(i for i in listing.files if i.path == SHARD)
    base = hubranges.partial_base(model_dir, SHARD, item.etag)
    os.replace(model_dir / SHARD, f"{base}{hubranges.RANGES_SUFFIX}")
    (model_dir / ".cache/huggingface/download" / f"{SHARD}.metadata").unlink()
    ranges = hubranges.split(item.size, model.download_streams)
    assert ranges is not None
    document = {"size": item.size, "ranges": [[start, end, end - start] for start, end in ranges]}
    Path(f"{base}{hubranges.PROGRESS_SUFFIX}").write_text(json.dumps(document))
    seen = len(hub.log.entries())
    landed: list[str] = []
    fetch(model, str(model_dir), commit=model.revision, report=print, on_file=lambda i: landed.append(i.path))
    assert file_gets(hub, SHARD, seen) == []
    assert landed.count(SHARD) == 1
    assert sha256_of(model_dir / SHARD) == item.sha256
    assert leftovers(model_dir) == []


# --- files planted at the download's own names ------------------------------------------------------


def plant_link(link: str, tmp_path: Path, size: int) -> Path:
    """A symbolic link at one of the download's names, to a file outside the model dir."""
    outside = tmp_path / "outside"
    outside.write_bytes(b"o" * size)
    Path(link).parent.mkdir(parents=True, exist_ok=True)
    os.symlink(outside, link)
    return outside


@pytest.mark.parametrize("planted", [hubranges.RANGES_SUFFIX, f"{hubranges.PROGRESS_SUFFIX}.tmp"])
def test_download_does_not_follow_a_symlink_planted_at_its_partial_names(
    hub: StandinHub, tmp_path: Path, planted: str
) -> None:
    """A link at the ranged partial (made to look resumable: the size of the file, a progress file
    beside it) or at the progress file's temporary name is replaced, never written through."""
    model = Model(endpoint=hub.url, revision=hub.info.commit)
    model_dir = tmp_path / "model"
    item = next(i for i in list_files(model).files if i.path == SHARD)
    base = hubranges.partial_base(model_dir, SHARD, item.etag)
    outside = plant_link(f"{base}{planted}", tmp_path, item.size)
    ranges = hubranges.split(item.size, model.download_streams)
    assert ranges is not None
    Path(f"{base}{hubranges.PROGRESS_SUFFIX}").write_text(
        json.dumps({"size": item.size, "ranges": [[start, end, 0] for start, end in ranges]})
    )
    listing = fetch(model, str(model_dir), commit=model.revision, report=print)
    assert outside.read_bytes() == b"o" * item.size, "the file outside was written through the link"
    assert not (model_dir / SHARD).is_symlink()
    assert_all_verified(model_dir, listing)
    assert leftovers(model_dir) == []


def test_a_trickling_hub_is_cut_and_resumed_then_fails_clearly(
    hub: StandinHub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(hubranges, "MIN_RATE_BPS", MIB)
    monkeypatch.setattr(hubranges, "RATE_WINDOW_S", 0.3)
    monkeypatch.setattr(hubranges, "RETRIES", 1)
    model = Model(endpoint=hub.url, revision=hub.info.commit)
    item = next(i for i in list_files(model).files if i.path == SHARD)
    url = hf_hub_url(model.repo, SHARD, revision=model.revision, endpoint=hub.url)
    target = hubranges.Target(url=url, root=tmp_path / "model", path=SHARD, size=item.size, etag=item.etag, commit="c")
    ranged = hubranges.open_ranged(target, model.download_streams)
    assert ranged is not None
    start, end = ranged.ranges[1]
    hub.faults.set_rate(2000)  # a hundred bytes every 50 ms
    seen = len(hub.log.entries())
    began = time.monotonic()
    try:
        with pytest.raises(HubError) as caught:
            hubranges.fetch_range(ranged, start, end, {})
    finally:
        ranged.close()
    assert time.monotonic() - began < 5, "it did not hang"
    assert "under 1.0 MB/s for 0.3 s, 2 times in a row" in caught.value.message
    asked = [str(e["range"]) for e in file_gets(hub, SHARD, seen)]
    assert len(asked) == 2
    assert asked[0] == f"bytes={start}-{end - 1}"
    resumed_at = int(asked[1].removeprefix("bytes=").split("-")[0])
    assert start < resumed_at < start + ranged.done[start], "resumed from the bytes the first request brought"
