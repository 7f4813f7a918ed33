"""The spec model: reference defaults, strictness, and located, actionable problems."""

from __future__ import annotations

import re
import textwrap

import pytest

from reconciler.errors import SpecError, SpecProblem
from reconciler.spec import (
    REFERENCE_ENV,
    REFERENCE_IMAGE,
    Deployment,
    expand_home,
    load_spec,
    parse_spec,
)
from tests.scenarios import FIXTURES, SPEC_PATH

MINIMAL = """\
nodes:
  - name: spark-head
    role: head
  - name: spark-worker
    ssh: {host: 10.10.10.11, user: nvidia}
"""


def problems_of(text: str) -> list[SpecProblem]:
    with pytest.raises(SpecError) as caught:
        parse_spec(textwrap.dedent(text), "spec.yaml")
    return caught.value.problems


def only_problem(text: str) -> SpecProblem:
    problems = problems_of(text)
    assert len(problems) == 1, [p.render() for p in problems]
    return problems[0]


def test_shipped_spec_is_valid_and_warns_only_about_the_branch_revision() -> None:
    loaded = load_spec(SPEC_PATH)
    assert [w.path for w in loaded.warnings] == ["model.revision"]


def test_an_almost_empty_spec_takes_every_reference_default() -> None:
    deployment = parse_spec(MINIMAL, "spec.yaml").deployment
    assert deployment.name == "dsv41"
    assert deployment.state_dir == "~/.dsv41-two-sparks"
    assert deployment.key_file() == "~/.dsv41-two-sparks/api_key"
    assert deployment.nodes[0].model_dir == "~/models/DeepSeek-V4.1-Flash-Spark"
    assert deployment.model.repo == "0xSero/DeepSeek-V4.1-Flash-Spark"
    assert deployment.model.manifest == "sha256-manifest.txt"
    assert deployment.model.exl3_plan == "J268-ho-v31-K5n.json"
    assert deployment.model.keep_parts is False
    assert deployment.source_of(deployment.nodes[1]) == "peer"
    assert deployment.image.ref == REFERENCE_IMAGE
    serving = deployment.serving
    assert (serving.kv_cache_dtype, serving.kv_bytes, serving.gpu_util) == ("fp8", 2_700_000_000, 0.88)
    assert (serving.max_model_len, serving.max_num_seqs, serving.max_num_batched_tokens) == (262_144, 2, 2048)
    assert serving.speculative.num_speculative_tokens == 7
    assert serving.speculative.enable_adaptive_verification is True
    assert serving.cudagraph.mode == "FULL_DECODE_ONLY"
    assert serving.engram.table_memory == "disk"
    assert (serving.backends.attention, serving.backends.linear, serving.backends.moe) == ("B12X", "b12x", "b12x")
    assert serving.reasoning_parser == serving.tool_call_parser == "deepseek_v41"
    assert serving.images_per_prompt == 1
    assert (serving.port, serving.master_port) == (8000, 29655)
    assert serving.env == REFERENCE_ENV
    assert (deployment.memguard.floor_gib, deployment.memguard.interval_s) == (1.0, 1.0)
    assert deployment.api.bind == "0.0.0.0"
    assert deployment.startup.timeout_s == 45 * 60
    assert (deployment.pi.enabled, deployment.pi.provider, deployment.pi.set_default) == (True, "dsv41-sparks", False)


def test_three_planted_errors_give_three_located_messages() -> None:
    with pytest.raises(SpecError) as caught:
        load_spec(FIXTURES / "specs/three-errors.yaml")
    located = [(p.line, p.path) for p in caught.value.problems]
    assert located == [(9, "nodes[1].fabric.ip"), (11, "image.ref"), (13, "serving.port")]
    assert all(p.hint for p in caught.value.problems)
    messages = " | ".join(p.message for p in caught.value.problems)
    assert "link-local" in messages
    assert "not pinned by digest" in messages
    assert "80000" in messages


def test_malformed_yaml_is_located() -> None:
    problem = only_problem("nodes:\n  - name: a\n   role: head\n")
    assert problem.line == 3
    assert "malformed YAML" in problem.message


def test_unknown_key_is_rejected_with_a_suggestion() -> None:
    problem = only_problem(MINIMAL + "serving:\n  kv_byte: 1\n")
    assert (problem.line, problem.column, problem.path) == (7, 3, "serving.kv_byte")
    assert "did you mean 'kv_bytes'" in problem.hint


def test_duplicate_keys_are_rejected() -> None:
    problem = only_problem(MINIMAL + "serving:\n  port: 8000\n  port: 8001\n")
    assert (problem.line, problem.path, problem.message) == (8, "serving.port", "duplicate key")


@pytest.mark.parametrize(
    ("address", "reason"),
    [
        ("169.254.127.30", "link-local"),
        ("127.0.0.1", "loopback"),
        ("0.0.0.0", "unspecified"),
        ("10.10.10", "not an IPv4"),
    ],
)
def test_fabric_ip_must_be_routable_ipv4(address: str, reason: str) -> None:
    problem = only_problem(MINIMAL + f"    fabric: {{ip: '{address}'}}\n")
    assert problem.path == "nodes[1].fabric.ip"
    assert reason in problem.message


def test_unpinned_image_is_accepted_only_when_allowed() -> None:
    problem = only_problem(MINIMAL + "image: {ref: 'vllm/vllm-openai:latest'}\n")
    assert problem.path == "image.ref"
    loaded = parse_spec(MINIMAL + "image: {ref: 'vllm/vllm-openai:latest', allow_unpinned: true}\n", "spec.yaml")
    assert loaded.deployment.image.ref == "vllm/vllm-openai:latest"


def test_relative_paths_are_rejected() -> None:
    problem = only_problem(MINIMAL + "state_dir: models/state\n")
    assert problem.path == "state_dir"
    assert "absolute" in problem.message


@pytest.mark.parametrize(
    ("text", "path", "words"),
    [
        (MINIMAL.replace("role: head", "role: worker"), "nodes", "exactly one node"),
        (MINIMAL + "  - name: spark-head\n    ssh: {host: 10.10.10.12}\n", "nodes[2].name", "used twice"),
        (MINIMAL + "  - name: spark-third\n", "nodes[2]", "more than one node has no ssh"),
        (MINIMAL + "serving: {master_port: 8000}\n", "serving.master_port", "equals the API port"),
        (MINIMAL.replace("role: head", "role: head\n    model_source: hub"), "nodes[0].model_source", "head"),
    ],
)
def test_cross_field_rules(text: str, path: str, words: str) -> None:
    problem = only_problem(text)
    assert problem.path == path
    assert words in problem.message


def test_duplicate_fabric_ips_are_rejected() -> None:
    text = (
        MINIMAL.replace("role: head", "role: head\n    fabric: {ip: 10.10.10.11}") + "    fabric: {ip: 10.10.10.11}\n"
    )
    assert only_problem(text).path == "nodes[1].fabric.ip"


def test_derived_environment_cannot_be_typed() -> None:
    problem = only_problem(MINIMAL + "serving:\n  extra_env: {NCCL_SOCKET_IFNAME: wlP9s9}\n")
    assert problem.path == "serving.extra_env"
    assert "nodes[].fabric.ifname" in problem.hint


def test_api_key_cannot_be_passed_as_an_argument() -> None:
    problem = only_problem(MINIMAL + "serving:\n  extra_args: ['--api-key=abc']\n")
    assert problem.path == "serving.extra_args"
    assert "api.key_file" in problem.hint


def test_capture_sizes_beyond_the_maximum_are_rejected() -> None:
    problem = only_problem(MINIMAL + "serving:\n  cudagraph: {capture_sizes: [1, 32]}\n")
    assert problem.path == "serving.cudagraph.capture_sizes"


def test_at_least_two_nodes() -> None:
    problem = only_problem("nodes:\n  - name: spark-head\n    role: head\n")
    assert problem.path == "nodes"


def test_every_problem_is_reported_at_once() -> None:
    text = MINIMAL + "serving:\n  port: 0\n  gpu_util: 1.5\nmemguard: {floor_gib: -1}\nname: Bad_Name\n"
    assert {p.path for p in problems_of(text)} == {"serving.port", "serving.gpu_util", "memguard.floor_gib", "name"}


def test_fractional_memguard_floor_is_kept() -> None:
    assert parse_spec(MINIMAL + "memguard: {floor_gib: 1.5}\n", "s").deployment.memguard.floor_gib == 1.5


def test_missing_spec_file_is_a_located_problem() -> None:
    with pytest.raises(SpecError) as caught:
        load_spec("/nonexistent/deployment.yaml")
    assert "cannot read the spec" in caught.value.problems[0].message
    assert "--spec" in caught.value.problems[0].hint


def test_a_non_mapping_document_is_rejected() -> None:
    assert "mapping" in only_problem("- a\n- b\n").message


def test_ranks_follow_the_node_list_with_the_head_as_rank_zero() -> None:
    text = """\
    nodes:
      - {name: w1, ssh: {host: w1}}
      - {name: h, role: head}
      - {name: w2, ssh: {host: w2}}
    """
    deployment: Deployment = parse_spec(textwrap.dedent(text), "s").deployment
    assert [(rank, node.name) for rank, node in deployment.ranked_nodes] == [(0, "h"), (1, "w1"), (2, "w2")]


@pytest.mark.parametrize(
    ("path", "home", "expanded"),
    [("~/models/x", "/home/nvidia", "/home/nvidia/models/x"), ("~", "/root", "/root"), ("/data/x", "/root", "/data/x")],
)
def test_home_expansion_uses_the_nodes_own_home(path: str, home: str, expanded: str) -> None:
    assert expand_home(path, home) == expanded


UPSTREAM = (
    MINIMAL
    + "serving:\n  profile: upstream\n  tokenizer_mode: auto\n  reasoning_parser: null\n  tool_call_parser: hermes\n"
)


def test_the_default_profile_is_the_reference() -> None:
    assert parse_spec(MINIMAL, "spec.yaml").deployment.serving.profile == "reference"


def test_upstream_profile_refuses_the_reference_images_parser_values_even_as_defaults() -> None:
    problems = problems_of(MINIMAL + "serving:\n  profile: upstream\n")
    assert sorted(p.path for p in problems) == [
        "serving.reasoning_parser",
        "serving.tokenizer_mode",
        "serving.tool_call_parser",
    ]
    tokenizer = next(p for p in problems if p.path == "serving.tokenizer_mode")
    assert "deepseek_v41" in tokenizer.message
    assert "auto" in tokenizer.hint


def test_upstream_profile_with_upstream_values_is_valid_without_warnings() -> None:
    loaded = parse_spec(UPSTREAM, "spec.yaml")
    assert loaded.deployment.serving.profile == "upstream"
    assert [w.path for w in loaded.warnings] == ["model.revision"]


def test_upstream_profile_warns_about_reference_only_fields_it_never_renders() -> None:
    loaded = parse_spec(UPSTREAM + "  kv_bytes: 1000\n  block_size: 16\n", "spec.yaml")
    warned = {w.path: w for w in loaded.warnings}
    assert {"serving.kv_bytes", "serving.block_size"} <= set(warned)
    assert warned["serving.kv_bytes"].line == 11
    assert "no effect" in warned["serving.kv_bytes"].message


@pytest.mark.parametrize(
    ("written", "value"),
    [("2.7GB", 2_700_000_000), ("2.7G", 2_700_000_000), ("2.5GiB", 2_684_354_560), ("'2700000000'", 2_700_000_000)],
)
def test_kv_bytes_takes_a_unit(written: str, value: int) -> None:
    text = SPEC_PATH.read_text(encoding="utf-8")
    assert "  kv_bytes: " in text
    edited = re.sub(r"(?m)^  kv_bytes: .*$", f"  kv_bytes: {written}", text)
    assert parse_spec(edited, "spec.yaml").deployment.serving.kv_bytes == value


def test_a_byte_count_that_is_none_says_how_to_write_one() -> None:
    text = re.sub(r"(?m)^  kv_bytes: .*$", "  kv_bytes: lots", SPEC_PATH.read_text(encoding="utf-8"))
    with pytest.raises(SpecError) as refused:
        parse_spec(text, "spec.yaml")
    rendered = refused.value.problems[0].render()
    assert "'lots' is not a byte count" in rendered
    assert "2.7GB" in rendered
