"""Where counters come from: the node-side programs' structured lines (run through `python3 -`
as on a node), the Hub client's download measured on disk, and the readiness wait's rank lines."""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from huggingface_hub._local_folder import _short_hash

from reconciler import hub, redact
from reconciler.actions import WaitReady, action
from reconciler.execution import ApplyContext, Progress
from reconciler.health import RankLines
from reconciler.hub import downloaded, list_files
from reconciler.progress import Counter, parse_line
from reconciler.repofiles import HubFile
from reconciler.spec import Model
from reconciler.transport.base import run_program
from reconciler.transport.local import LocalTransport
from tests.scenarios import empty_facts, reference_deployment
from tests.testbed.hub.server import StandinHub
from tests.unit.hubclient import serving_checkpoint

NODE = LocalTransport("local")
SECRET = "sk-rankLogSecretKey0987654321"


def counters(lines: list[str]) -> list[Counter]:
    found = [parse_line(line) for line in lines]
    return [counter for counter in found if counter is not None]


def test_hashing_reports_every_file_done_and_all_bytes(tmp_path: Path) -> None:
    sizes = {"a.safetensors": 3000, "b.safetensors": 5000, "c.json": 10}
    for name, size in sizes.items():
        (tmp_path / name).write_bytes(b"x" * size)
    lines: list[str] = []
    args = {"model_dir": str(tmp_path), "files": sorted(sizes), "cache": str(tmp_path / "cache.json")}
    run_program(NODE, "ops", "run", {"call": "hash_files", "args": args}, on_line=lines.append)
    reported = counters(lines)
    assert reported, "hashing says how far it is"
    assert all(counter.what == "hash" and counter.total == 8010 and counter.files == 3 for counter in reported)
    assert [counter.files_done for counter in reported if counter.files_done][-3:] == [1, 2, 3]
    assert reported[-1].done == 8010


def test_reassembly_reports_its_shards_by_name(tmp_path: Path) -> None:
    shards = ["model-00005-of-00006.safetensors", "model-00006-of-00006.safetensors"]
    for shard in shards:
        for index in range(2):
            (tmp_path / f"{shard}.part{index:02d}").write_bytes(b"p" * 100)
    lines: list[str] = []
    args = {"model_dir": str(tmp_path), "shards": shards}
    run_program(NODE, "ops", "run", {"call": "reassemble", "args": args}, on_line=lines.append)
    reported = counters(lines)
    assert {counter.name for counter in reported} == set(shards)
    assert reported[-1] == Counter("reassemble", 400, 400, 2, 2, shards[1])


@pytest.fixture
def standin(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Iterator[StandinHub]:
    yield from serving_checkpoint(tmp_path_factory, monkeypatch, shard_mib=1, part_mib=0.75)


def test_the_node_side_fetcher_reports_bytes_and_files_of_what_it_fetches(standin: StandinHub, tmp_path: Path) -> None:
    listing = list_files(Model(endpoint=standin.url, revision=standin.info.commit))
    wanted = [item for item in listing.files if item.path.endswith(".safetensors")][:3]
    entries = [{"path": i.path, "size": i.size, "etag": i.etag, "sha256": i.sha256} for i in wanted]
    args = {
        "endpoint": standin.url,
        "repo": standin.repo_id,
        "commit": listing.commit,
        "token": None,
        "model_dir": str(tmp_path / "model"),
        "files": entries,
    }
    lines: list[str] = []
    run_program(NODE, "fetch", "fetch", args, on_line=lines.append)
    reported = counters(lines)
    total = sum(item.size for item in wanted)
    assert all(counter.what == "download" and counter.total == total for counter in reported)
    assert {counter.name for counter in reported} == {item.path for item in wanted}
    assert reported[-1].done == total
    assert reported[-1].files_done == reported[-1].files == 3


def test_the_hub_clients_download_is_counted_from_the_disk_while_it_runs(
    standin: StandinHub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(hub.download, "METER_EVERY_S", 0.05)
    standin.faults.set_rate(2 * 1024 * 1024)
    model = Model(endpoint=standin.url, revision=standin.info.commit)
    seen: list[Counter] = []
    hub.fetch(model, str(tmp_path / "model"), commit=model.revision, report=print, on_bytes=seen.append)
    total = sum(item.size for item in list_files(model).files)
    assert len(seen) > 3
    assert seen[0].done < total, "the first count is taken before the download"
    assert all(counter.total == total for counter in seen)
    assert [counter.done for counter in seen] == sorted(counter.done for counter in seen)
    assert any(0 < counter.done < total for counter in seen), "bytes of unfinished files are counted"
    assert seen[-1].done == total
    assert seen[-1].files_done == seen[-1].files == len(list_files(model).files)


def test_a_partial_file_counts_its_bytes_and_names_the_file(tmp_path: Path) -> None:
    files = [
        HubFile(path="a.json", size=10, blob_id="1" * 40),
        HubFile(path="sub/b.safetensors", size=1000, sha256="f" * 64),
    ]
    (tmp_path / "a.json").write_bytes(b"x" * 10)
    cache = tmp_path / hub.DOWNLOAD_CACHE / "sub"
    cache.mkdir(parents=True)
    (cache / f"{_short_hash('b.safetensors.metadata')}.{'f' * 64}.abcd1234.incomplete").write_bytes(b"y" * 400)
    assert downloaded(tmp_path, files) == Counter("download", 410, 1010, 1, 2, "sub/b.safetensors")


class Container:
    def __init__(self, *logs: bytes) -> None:
        self.logs_seen = list(logs)

    def logs(self, tail: int) -> bytes:
        assert tail == 1
        return self.logs_seen.pop(0) if len(self.logs_seen) > 1 else self.logs_seen[0]


def test_the_readiness_wait_shows_each_ranks_last_line_redacted_and_once_in_the_journal() -> None:
    redact.register(SECRET)
    out = io.StringIO()
    clock = [0.0]
    progress = Progress(out, tty=False)
    ctx = ApplyContext(reference_deployment(), empty_facts(), {}, progress)
    states: dict[str, Any] = {
        "dsv41-r0": Container(b"\x1b[32mINFO\x1b[0m Model loading\n", b"INFO Model loading\n", b"INFO Starting API\n"),
        "dsv41-r1": Container(f"connected (key {SECRET})\r\n".encode()),
    }
    shown = RankLines(ctx, clock=lambda: clock[0])
    url = "http://127.0.0.1:8000"
    group = [("spark-head", "dsv41-r0"), ("spark-worker", "dsv41-r1")]
    wait = action(WaitReady(timeout_s=60, poll_s=1, url=url, ranks=group), "spark-head", "run", "wait", "test")
    with progress.step(1, 1, wait) as step:
        for second in range(0, 16):
            clock[0] = float(second)
            shown.show(states, url, float(second))
    assert step.detail == "waiting 15 s for /v1/models; r0| INFO Starting API | r1| connected (key (redacted))"
    text = out.getvalue()
    assert SECRET[:8] not in text
    assert text.count("      r0| INFO Model loading\n") == 1, "a line is printed once, when it changes"
    assert "      r0| INFO Starting API\n" in text
    assert text.count("      r1| connected (key (redacted))\n") == 1
    assert text.count("    waiting for http") == 4, "every 5 s: at 0, 5, 10 and 15 s"


def test_every_stderr_line_of_a_local_command_reaches_its_sink() -> None:
    lines: list[str] = []
    script = "import sys\nfor n in range(500): sys.stderr.write(f'line {n}\\n')\nprint('done')"
    result = NODE.run(["python3", "-c", script], on_line=lines.append)
    assert result.text == "done\n"
    assert lines == [f"line {n}" for n in range(500)]
