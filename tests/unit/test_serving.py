"""The rendered rank containers against the reference launcher, flag for flag."""

from __future__ import annotations

import json

import pytest

from reconciler.serving import (
    KEY_MOUNT,
    LABEL_CONFIG_HASH,
    LABEL_DEPLOYMENT,
    LABEL_NODE,
    LABEL_OWNER,
    LABEL_RANK,
    Mount,
    NodeContext,
    RankContainer,
    ResolvedFabric,
    capture_sizes,
    max_capture_size,
    render_group,
    rewrite_exl3_plan,
)
from reconciler.spec import Deployment, Node
from tests.scenarios import FIXTURES, reference_deployment, with_serving

REFERENCE = FIXTURES / "reference"
HEAD_IP = "10.10.10.13"
WORKER_IP = "10.10.10.11"
HCAS = ("rocep1s0f1", "roceP2p1s0f1")
IFNAME = "enp1s0f1np1"
REFERENCE_VARS = {
    "HEAD_IP": HEAD_IP,
    "MPORT": "29655",
    "KV_BYTES": "2700000000",
    "GPU_UTIL": "0.88",
    "MAX_LEN": "262144",
    "MAX_SEQS": "2",
    "BATCH": "2048",
    "CAP": "16",
    "PORT": "8000",
    "EXTRA": "",
    "API_KEY_FILE": "/home/nvidia/.dsv41-two-sparks/api_key",
}
SECRET = "s3cr3t-key-value-never-rendered-0123456789ab"


def contexts() -> dict[str, NodeContext]:
    return {
        "spark-head": NodeContext("/home/nvidia", ResolvedFabric(IFNAME, HEAD_IP, HCAS, 3)),
        "spark-worker": NodeContext("/home/nvidia", ResolvedFabric(IFNAME, WORKER_IP, HCAS, 3)),
    }


def render(deployment: Deployment | None = None) -> dict[int, RankContainer]:
    group = render_group(deployment or reference_deployment(), contexts())
    return {container.rank: container for container in group}


def reference_args(name: str) -> list[str]:
    """The launcher text with its variables expanded; the key's command substitution stays a marker."""
    text = (REFERENCE / name).read_text(encoding="utf-8")
    text = text.replace('"$(cat $API_KEY_FILE)"', SECRET)
    for variable, value in sorted(REFERENCE_VARS.items(), key=lambda item: -len(item[0])):
        text = text.replace("${" + variable + "}", value).replace("$" + variable, value)
    # The transcription writes one argv word per token: JSON words as-is, single quotes around one.
    return [word.removeprefix("'").removesuffix("'") for word in text.split()]


def reference_env(ip: str) -> dict[str, str]:
    text = (REFERENCE / "container-env.txt").read_text(encoding="utf-8")
    text = text.replace("<hcas>", ",".join(HCAS)).replace("<if>", IFNAME).replace("<PLAN>", "J268-ho-v31-K5n.json")
    return dict(item.split("=", 1) for item in text.replace("<ip>", ip).split())


def test_rank1_argv_is_the_reference_flag_for_flag() -> None:
    expected = ["vllm", "serve", *reference_args("serve-args-both.txt"), *reference_args("serve-args-rank1.txt")]
    assert list(render()[1].command) == expected


def test_rank0_argv_is_the_reference_except_the_api_key_and_its_address() -> None:
    """The key stays with the front; rank 0 answers on 127.0.0.1:api.engine_port, behind it."""
    reference = ["vllm", "serve", *reference_args("serve-args-both.txt"), *reference_args("serve-args-rank0.txt")]
    key_at = reference.index("--api-key")
    assert reference[key_at + 1] == SECRET
    expected = reference[:key_at] + reference[key_at + 2 :]
    host_at = expected.index("--host")
    assert expected[host_at : host_at + 4] == ["--host", "0.0.0.0", "--port", "8000"]
    expected[host_at : host_at + 4] = ["--host", "127.0.0.1", "--port", "18000"]
    assert list(render()[0].command) == expected


@pytest.mark.parametrize(("rank", "ip"), [(0, HEAD_IP), (1, WORKER_IP)])
def test_env_is_the_reference_environment(rank: int, ip: str) -> None:
    assert render()[rank].env_dict == reference_env(ip)


def test_container_flags_match_the_reference_docker_run() -> None:
    container = render()[0]
    assert (container.network_mode, container.ipc_mode, container.privileged, container.gpus) == (
        "host",
        "host",
        True,
        "all",
    )
    assert container.ulimits == (("memlock", -1, -1),)
    assert container.shm_size == "32g"
    assert container.restart_policy == "no"
    assert container.stop_timeout_s > 10
    assert container.name == "dsv41-r0"
    assert render()[1].name == "dsv41-r1"


def test_mounts_model_read_only_plans_read_only_cache_writable_and_no_key() -> None:
    group = render()
    state = "/home/nvidia/.dsv41-two-sparks"
    shared = [
        Mount("/home/nvidia/models/DeepSeek-V4.1-Flash-Spark", "/model", read_only=True),
        Mount(f"{state}/plans", "/plans", read_only=True),
        Mount(f"{state}/cache", "/cache", read_only=False),
    ]
    assert list(group[1].mounts) == shared
    assert list(group[0].mounts) == shared


def test_worker_paths_expand_against_the_worker_home() -> None:
    homes = contexts()
    homes["spark-worker"] = NodeContext("/srv/worker", homes["spark-worker"].fabric)
    worker = render_group(reference_deployment(), homes)[1]
    assert worker.mounts[0].source == "/srv/worker/models/DeepSeek-V4.1-Flash-Spark"
    assert worker.mounts[2].source == "/srv/worker/.dsv41-two-sparks/cache"


def test_no_rank_gets_the_key_in_any_form() -> None:
    """The front holds the key; a rank has none to leak (argv, environment, mounts, wrapper)."""
    for rank in (render()[0], render()[1]):
        assert rank.entrypoint[:3] == ("/bin/sh", "-c", 'exec "$@"')
        assert "--api-key" not in rank.command
        assert all("API_KEY" not in name for name in rank.env_dict)
        assert all(mount.target != KEY_MOUNT for mount in rank.mounts)


def test_labels_identify_owner_deployment_rank_node_and_versioned_hash() -> None:
    labels = render()[1].labels
    assert labels[LABEL_OWNER] == "spark-reconciler"
    assert labels[LABEL_DEPLOYMENT] == "dsv41"
    assert labels[LABEL_RANK] == "1"
    assert labels[LABEL_NODE] == "spark-worker"
    assert labels[LABEL_CONFIG_HASH].startswith("v2:")
    assert len(labels[LABEL_CONFIG_HASH]) == len("v2:") + 64


def test_config_hash_is_stable_and_follows_semantic_changes_only() -> None:
    first, again = render(), render()
    assert first[0].labels[LABEL_CONFIG_HASH] == again[0].labels[LABEL_CONFIG_HASH]
    changed = render(with_serving(reference_deployment(), kv_bytes=2_000_000_000))
    assert changed[0].labels[LABEL_CONFIG_HASH] != first[0].labels[LABEL_CONFIG_HASH]
    # The rank-0-only EXTRA args leave rank 1's container as it was.
    extra = render(with_serving(reference_deployment(), extra_args=["--max-log-len", "100"]))
    assert extra[1].labels[LABEL_CONFIG_HASH] == first[1].labels[LABEL_CONFIG_HASH]
    assert extra[0].command[-2:] == ("--max-log-len", "100")


def test_fabric_change_changes_only_that_rank() -> None:
    moved = contexts()
    moved["spark-worker"] = NodeContext("/home/nvidia", ResolvedFabric("enP2p1s0f1np1", WORKER_IP, HCAS[1:], 3))
    before, after = render(), {c.rank: c for c in render_group(reference_deployment(), moved)}
    assert after[1].env_dict["NCCL_SOCKET_IFNAME"] == "enP2p1s0f1np1"
    assert after[1].labels[LABEL_CONFIG_HASH] != before[1].labels[LABEL_CONFIG_HASH]
    assert after[0].labels[LABEL_CONFIG_HASH] == before[0].labels[LABEL_CONFIG_HASH]


def test_no_proven_hca_leaves_nccl_ib_hca_unset() -> None:
    bare = contexts()
    bare["spark-worker"] = NodeContext("/home/nvidia", ResolvedFabric(IFNAME, WORKER_IP, (), 3))
    worker = render_group(reference_deployment(), bare)[1]
    assert "NCCL_IB_HCA" not in worker.env_dict
    assert worker.env_dict["NCCL_SOCKET_IFNAME"] == IFNAME


def test_gid_index_is_per_node() -> None:
    deployment = reference_deployment()
    worker = deployment.nodes[1]
    nodes = [
        deployment.nodes[0],
        worker.model_copy(update={"fabric": worker.fabric.model_copy(update={"gid_index": 4})}),
    ]
    per_node = contexts()
    per_node["spark-worker"] = NodeContext("/home/nvidia", ResolvedFabric(IFNAME, WORKER_IP, HCAS, 4))
    group = render_group(deployment.model_copy(update={"nodes": nodes}), per_node)
    assert group[1].env_dict["NCCL_IB_GID_INDEX"] == "4"
    assert group[0].env_dict["NCCL_IB_GID_INDEX"] == "3"


@pytest.mark.parametrize(
    ("num_spec", "max_seqs", "expected"),
    [
        (7, 2, [1, 2, 3, 4, 5, 6, 7, 8, 12, 16]),
        (7, 1, [1, 2, 3, 4, 5, 6, 7, 8]),
        (3, 4, [1, 2, 3, 4, 8, 12, 16]),
        (1, 3, [1, 2, 6]),
        (2, 3, [1, 2, 3, 7, 9]),
    ],
)
def test_capture_sizes_follow_the_reference_rule(num_spec: int, max_seqs: int, expected: list[int]) -> None:
    base = reference_deployment()
    speculative = base.serving.speculative.model_copy(update={"num_speculative_tokens": num_spec})
    serving = with_serving(base, speculative=speculative, max_num_seqs=max_seqs).serving
    assert capture_sizes(serving) == expected
    assert max_capture_size(serving) == max_seqs * (num_spec + 1)


def test_capture_size_override_is_used_as_given() -> None:
    base = reference_deployment()
    cudagraph = base.serving.cudagraph.model_copy(update={"capture_sizes": [16, 1, 8, 8]})
    rank = render(with_serving(base, cudagraph=cudagraph))[0]
    config = json.loads(rank.command[rank.command.index("--compilation-config") + 1])
    assert config["cudagraph_capture_sizes"] == [1, 8, 16]


def test_three_nodes_render_tensor_parallel_three_with_ordered_ranks() -> None:
    base = reference_deployment()
    third = Node(name="spark-third", role="worker", ssh=base.nodes[1].ssh)
    deployment = base.model_copy(update={"nodes": [*base.nodes, third]})
    homes = contexts()
    homes["spark-third"] = NodeContext("/home/nvidia", ResolvedFabric(IFNAME, "10.10.10.12", HCAS, 3))
    group = render_group(deployment, homes)
    assert [(c.rank, c.node, c.name) for c in group] == [
        (0, "spark-head", "dsv41-r0"),
        (1, "spark-worker", "dsv41-r1"),
        (2, "spark-third", "dsv41-r2"),
    ]
    argv = list(group[2].command)
    assert argv[argv.index("--tensor-parallel-size") + 1] == "3"
    assert argv[argv.index("--nnodes") + 1] == "3"
    assert argv[-3:] == ["--node-rank", "2", "--headless"]
    assert argv[argv.index("--master-addr") + 1] == HEAD_IP
    speculative = json.loads(argv[argv.index("--speculative-config") + 1])
    assert speculative["draft_tensor_parallel_size"] == 3


def test_extra_env_overrides_reference_env_on_both_ranks() -> None:
    group = render(with_serving(reference_deployment(), extra_env={"NCCL_DEBUG": "INFO", "FOO": "1"}))
    for rank in (0, 1):
        assert group[rank].env_dict["NCCL_DEBUG"] == "INFO"
        assert group[rank].env_dict["FOO"] == "1"


def test_exl3_plan_rewrite_points_banks_at_the_model_mount() -> None:
    source = json.dumps({"qdir": "/x/exl3/qn:/x/exl3/q31:/home/u/m/exl3/q31s/", "layers": [1, 2], "bits": 2.77})
    rewritten = json.loads(rewrite_exl3_plan(source))
    assert rewritten["qdir"] == "/model/exl3/qn:/model/exl3/q31:/model/exl3/q31s"
    assert rewritten["layers"] == [1, 2]
    assert rewritten["bits"] == 2.77


def upstream_deployment() -> Deployment:
    return with_serving(
        reference_deployment(),
        profile="upstream",
        tokenizer_mode="auto",
        reasoning_parser=None,
        tool_call_parser="hermes",
        images_per_prompt=0,
    )


def test_upstream_profile_renders_only_stock_vllm_flags_in_group_order() -> None:
    ranks = render(upstream_deployment())
    group = [
        *("/model", "--served-model-name", "deepseek-v4.1-flash", "--dtype", "bfloat16"),
        *("--tensor-parallel-size", "2", "--nnodes", "2", "--master-addr", HEAD_IP, "--master-port", "29655"),
        *("--max-model-len", "262144", "--max-num-seqs", "2", "--max-num-batched-tokens", "2048"),
        *("--enable-chunked-prefill", "--enable-prefix-caching", "--generation-config", "vllm"),
        *("--tokenizer-mode", "auto"),
    ]
    assert list(ranks[1].command) == ["vllm", "serve", *group, "--node-rank", "1", "--headless"]
    rank0 = [
        *("--node-rank", "0", "--host", "127.0.0.1", "--port", "18000", "--tool-call-parser", "hermes"),
        *("--enable-auto-tool-choice", "--enable-prompt-tokens-details", "--enable-force-include-usage"),
    ]
    assert list(ranks[0].command) == ["vllm", "serve", *group, *rank0]


def test_upstream_profile_never_renders_the_forks_flags() -> None:
    fork_only = {"--engram-config", "--linear-backend", "--moe-backend", "--swa-block-size", "--speculative-config"}
    for container in render(upstream_deployment()).values():
        assert fork_only.isdisjoint(container.command)
        assert not any("deepseek_v41" in word or "dspark" in word for word in container.command)


def test_upstream_profile_keeps_images_per_prompt_when_set() -> None:
    deployment = with_serving(upstream_deployment(), images_per_prompt=2)
    command = list(render(deployment)[1].command)
    assert command[command.index("--limit-mm-per-prompt") + 1] == '{"image":2}'


def test_profile_is_part_of_the_config_hash() -> None:
    assert render()[1].config_hash() != render(upstream_deployment())[1].config_hash()


def test_a_dropped_variable_is_reported_only_if_the_reconciler_had_set_it() -> None:
    """A running container's environment holds its image's too (PATH): only what we set and no
    longer set is "dropped"; a container from before the names were recorded drops nothing."""
    from reconciler.components.ranks import describe_drift
    from tests.scenarios import running

    before = render(with_serving(reference_deployment(), extra_env={"OLD_KNOB": "1"}))[1]
    after = render(with_serving(reference_deployment(), extra_env={"NEW_KNOB": "2"}))[1]
    observed = running(before)
    observed = observed.model_copy(update={"env": {**observed.env, "PATH": "/usr/bin"}})
    drift = describe_drift(after, observed)
    assert "-OLD_KNOB" in drift
    assert "+NEW_KNOB" in drift
    assert "PATH" not in drift
    unlabelled = observed.model_copy(
        update={"labels": {k: v for k, v in observed.labels.items() if "env-names" not in k}}
    )
    assert "-OLD_KNOB" not in describe_drift(after, unlabelled)
