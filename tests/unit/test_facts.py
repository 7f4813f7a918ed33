"""Pure fact parsers on verbatim outputs, and facts snapshot loading."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from reconciler.errors import FactsError
from reconciler.facts.containers import container_from_inspect
from reconciler.facts.files import HubFacts
from reconciler.facts.memory import parse_meminfo
from reconciler.facts.node import load_facts
from reconciler.repofiles import parse_manifest

MEMINFO = """\
MemTotal:       127506841 kB
MemFree:        121234567 kB
MemAvailable:    2831155 kB
Buffers:           12345 kB
HugePages_Total:       0
"""


def test_meminfo_reads_total_and_available() -> None:
    memory = parse_meminfo(MEMINFO)
    assert (memory.total_kib, memory.available_kib) == (127_506_841, 2_831_155)
    assert round(memory.available_gib, 2) == 2.70


def test_manifest_accepts_text_and_binary_sha256sum_lines() -> None:
    digest = "a" * 64
    text = f"{digest}  model-00001-of-00006.safetensors\n{digest.upper()} *exl3/plan/x.json\n\nnot a line\n"
    assert parse_manifest(text) == {"model-00001-of-00006.safetensors": digest, "exl3/plan/x.json": digest}


def test_container_from_docker_inspect() -> None:
    attrs = {
        "Id": "abc",
        "Name": "/dsv41-r1",
        "Config": {
            "Image": "img@sha256:1",
            "Entrypoint": ["/bin/sh", "-c", 'exec "$@"', "dsv41-r1"],
            "Cmd": ["vllm", "serve", "/model"],
            "Env": ["A=1", "B=x=y"],
            "Labels": {"io.spark-reconciler.rank": "1"},
        },
        "State": {"Status": "exited", "ExitCode": 0, "OOMKilled": False, "FinishedAt": "2026-11-29T21:00:00Z"},
    }
    container = container_from_inspect(attrs)
    assert container.name == "dsv41-r1"
    assert container.command == ["/bin/sh", "-c", 'exec "$@"', "dsv41-r1", "vllm", "serve", "/model"]
    assert container.env == {"A": "1", "B": "x=y"}
    assert (container.status, container.exit_code) == ("exited", 0)


def test_running_container_has_no_exit_code() -> None:
    attrs = {"Id": "a", "Name": "/x", "Config": {}, "State": {"Status": "running", "ExitCode": 0}}
    assert container_from_inspect(attrs).exit_code is None


@pytest.mark.parametrize(
    ("content", "words"),
    [("{", "malformed JSON"), ('{"version": 2, "nodes": {}}', "version"), ('{"nodes": {"a": {"home": 1}}}', "home")],
)
def test_bad_facts_files_name_the_problem(tmp_path: Path, content: str, words: str) -> None:
    path = tmp_path / "facts.json"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(FactsError) as caught:
        load_facts(path)
    assert words in caught.value.message
    assert str(path) in caught.value.message


def test_a_listed_file_is_checked_when_a_cached_listing_is_read() -> None:
    """A cached listing is read back from the head's state dir: a file in it is checked like the Hub's answer."""

    def listing(entry: dict[str, object]) -> HubFacts:
        return HubFacts.model_validate({"commit": "a" * 40, "files": {"x.json": entry}})

    assert listing({"size": 1, "blob_id": "b" * 40}).files["x.json"].etag == "b" * 40
    assert listing({"size": 1, "blob_id": "c" * 64}).files["x.json"].path == "x.json"  # git's SHA-256 format
    for bad in ({"size": -1, "blob_id": "b" * 40}, {"size": 1, "sha256": "zz"}, {"size": 1, "blob_id": "q"}):
        with pytest.raises(ValidationError):
            listing(bad)
