"""Pure fact parsers on verbatim outputs, and facts snapshot loading."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from reconciler.cli import main
from reconciler.errors import FactsError
from reconciler.facts.containers import container_from_inspect
from reconciler.facts.files import HubFacts
from reconciler.facts.gather import node_facts_from_probe
from reconciler.facts.memory import parse_meminfo
from reconciler.facts.node import load_facts
from reconciler.repofiles import parse_manifest
from tests.scenarios import CONVERGED_FACTS, SPEC_PATH, reference_deployment

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
    impossible = [{"size": -1, "blob_id": "b" * 40}, {"size": 10**400, "blob_id": "b" * 40}]
    for bad in (*impossible, {"size": 1, "sha256": "zz"}, {"size": 1, "blob_id": "q"}):
        with pytest.raises(ValidationError):
            listing(bad)


HEAD_CHECKPOINT = ("nodes", "spark-head", "checkpoint")
COMMIT = "61f9933a00000000000000000000000000000000"
SHARD = "model-00001-of-00006.safetensors"


@pytest.mark.parametrize(
    ("where", "value"),
    [
        ((*HEAD_CHECKPOINT, "disk_free"), -(10**400)),
        ((*HEAD_CHECKPOINT, "disk_free"), 2**63),
        ((*HEAD_CHECKPOINT, "hub", COMMIT, "files", SHARD, "size"), 10**400),
        ((*HEAD_CHECKPOINT, "revisions", COMMIT, "files", SHARD, "size"), 2**63),
        (("nodes", "spark-head", "memory", "available_kib"), 10**400),
    ],
    ids=["disk_free far below 0", "disk_free beyond 64 bits", "a listed size", "a file's size", "memory"],
)
def test_an_impossible_byte_count_in_a_facts_file_is_a_located_error(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, where: tuple[str, ...], value: int
) -> None:
    """Sizes are shown as floats (GB): a count no kernel or Hub reports is refused where the
    snapshot is read, naming the field, instead of overflowing where a plan shows it."""
    document = json.loads(CONVERGED_FACTS.read_text(encoding="utf-8"))
    parent = document
    for key in where[:-1]:
        parent = parent[key]
    parent[where[-1]] = value
    path = tmp_path / "facts.json"
    path.write_text(json.dumps(document), encoding="utf-8")
    code = main(["plan", "--spec", str(SPEC_PATH), "--facts", str(path)])
    err = capsys.readouterr().err
    assert code == 1
    assert "internal error" not in err
    assert f"{path}: {'.'.join(where)}: Input should be" in err


@pytest.mark.parametrize(
    "value", [2**63, -(2**63) - 1, 10**400, True, "12"], ids=["2**63", "-2**63-1", "10**400", "true", "text"]
)
def test_a_disk_free_beyond_64_bits_is_unknown(value: object) -> None:
    raw = {"docker": {"containers": [], "images": []}, "home": "/home/nvidia", "checkpoint": {}, "disk_free": value}
    facts = node_facts_from_probe(reference_deployment().head, raw)
    assert (facts.reachable, facts.checkpoint.disk_free) == (True, None)
    for reported in (2**63 - 1, -1, -(2**63)):  # a negative one is kept: init shows it as no measurement
        kept = node_facts_from_probe(reference_deployment().head, {**raw, "disk_free": reported})
        assert kept.checkpoint.disk_free == reported


def test_a_meminfo_figure_no_kernel_reports_is_no_memory_figure() -> None:
    text = MEMINFO.replace("2831155", "9" * 30)
    raw = {"docker": {"containers": [], "images": []}, "home": "/home/nvidia", "checkpoint": {}, "meminfo": text}
    facts = node_facts_from_probe(reference_deployment().head, raw)
    assert (facts.reachable, facts.memory) == (True, None)
