"""Every spec value has a shape that makes sense on a Spark: ranges for numbers, plain names for
files in the model dir, paths Docker and rsync can carry, values that stay values in argv."""

from __future__ import annotations

import json
import tracemalloc

import pytest

from reconciler.actions import StartRank
from reconciler.components.rsync import rsync_argv
from reconciler.errors import SpecError, SpecProblem
from reconciler.plan import plan
from reconciler.spec import SshTarget, names_api_key, parse_spec
from reconciler.transport.sshroute import resolve_route
from tests.scenarios import empty_facts

NODES = """\
nodes:
  - name: spark-head
    role: head
  - name: spark-worker
    ssh: {host: 10.10.10.11, user: nvidia}
"""


def problem_of(extra: str) -> SpecProblem:
    with pytest.raises(SpecError) as caught:
        parse_spec(NODES + extra, "spec.yaml")
    problems = caught.value.problems
    assert len(problems) == 1, [p.render() for p in problems]
    return problems[0]


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        ("serving: {max_num_seqs: 50000000}\n", "serving.max_num_seqs"),
        ("serving: {speculative: {num_speculative_tokens: 100000}}\n", "serving.speculative.num_speculative_tokens"),
        ("serving: {cudagraph: {capture_sizes: [1, 2, 99999999]}}\n", "serving.cudagraph.capture_sizes"),
        ("serving: {max_model_len: 999999999999}\n", "serving.max_model_len"),
        ("serving: {kv_bytes: 999999999999999}\n", "serving.kv_bytes"),
        ("serving: {stop_timeout_s: 99999999}\n", "serving.stop_timeout_s"),
        ("serving: {images_per_prompt: 100000}\n", "serving.images_per_prompt"),
        ("serving: {shm_size: 99999999999999g}\n", "serving.shm_size"),
        ("startup: {timeout_s: 999999999}\n", "startup.timeout_s"),
        ("loop: {resync_s: 0}\n", "loop.resync_s"),
        ("memguard: {floor_gib: .inf}\n", "memguard.floor_gib"),
        ("memguard: {floor_gib: .nan}\n", "memguard.floor_gib"),
        ("memguard: {interval_s: 0.000001}\n", "memguard.interval_s"),
    ],
)
def test_numbers_outside_what_a_spark_can_use_are_refused(extra: str, field: str) -> None:
    problem = problem_of(extra)
    assert problem.path == field or problem.path.startswith(field), problem.render()
    assert problem.line == 6


def test_the_largest_valid_spec_plans_in_little_memory_and_bounded_work() -> None:
    """The repro was `max_num_seqs: 50000000`, which grew `plan` past 11 GB; at the caps the
    capture sizes are thousands, and planning stays cheap. The work is counted, not timed: a
    loaded machine plans as much, only slower."""
    spec = parse_spec(
        NODES + "serving: {max_num_seqs: 1024, speculative: {num_speculative_tokens: 32}}\n", "spec.yaml"
    ).deployment
    tracemalloc.start()
    planned = plan(spec, empty_facts())
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert peak < 64 * 1024 * 1024
    starts = [action.payload for action in planned.actions if isinstance(action.payload, StartRank)]
    assert len(starts) == 2
    for start in starts:
        argv = start.container.command
        config = json.loads(argv[argv.index("--compilation-config") + 1])
        # Steps of 33 tokens up to 1024 * 33: 1..33, every 4th from 33 to 33789, and 33792 itself.
        assert len(config["cudagraph_capture_sizes"]) == 32 + len(range(33, 33792, 4)) + 1  # 8473


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        ("model: {exl3_plan: ../../../../etc/cron.d/x}\n", "model.exl3_plan"),
        ("model: {exl3_plan: sub/plan.json}\n", "model.exl3_plan"),
        ("model: {manifest: /etc/shadow}\n", "model.manifest"),
        ("model: {manifest: ..}\n", "model.manifest"),
        ("state_dir: /srv/a:b\n", "state_dir"),
        ("state_dir: /srv/../etc\n", "state_dir"),
        ('state_dir: "/srv/it\'s"\n', "state_dir"),
        ("api: {key_file: /run/x:/etc/passwd}\n", "api.key_file"),
    ],
)
def test_names_and_paths_that_could_leave_their_directory_or_break_a_bind_are_refused(extra: str, field: str) -> None:
    assert problem_of(extra).path == field


def test_a_model_dir_with_a_colon_is_refused_with_the_reason() -> None:
    with pytest.raises(SpecError) as caught:
        parse_spec(NODES.replace("role: head", "role: head\n    model_dir: /data/m:ro"), "spec.yaml")
    [problem] = caught.value.problems
    assert problem.path == "nodes[0].model_dir"
    assert "bind mount" in problem.message


@pytest.mark.parametrize("user", ["evil@attacker.example:/tmp/x", "a b", "-oProxyCommand=x", "root;id", ""])
def test_ssh_user_must_be_a_user_name(user: str) -> None:
    with pytest.raises(SpecError) as caught:
        parse_spec(NODES.replace("user: nvidia", f"user: '{user}'"), "spec.yaml")
    assert [p.path for p in caught.value.problems] == ["nodes[1].ssh.user"]


@pytest.mark.parametrize(
    "extra",
    [
        "serving: {served_model_name: --api-key=x}\n",
        "serving: {dtype: -x}\n",
        "serving: {tool_call_parser: 'two words'}\n",
        "serving: {reasoning_parser: --enable-x}\n",
        "serving: {backends: {moe: --x}}\n",
        "serving: {speculative: {method: -m}}\n",
    ],
)
def test_a_free_text_argv_value_cannot_look_like_a_flag(extra: str) -> None:
    assert "cannot be passed as a `vllm serve` value" in problem_of(extra).message


@pytest.mark.parametrize(
    "arg",
    ["--api-key", "--api_key", "--api-key=x", "--api_key=x", "--API-KEY", "--api-k", "--api-ke=x", "--api_key.x=y"],
)
def test_the_api_key_flag_is_refused_in_every_spelling_vllm_accepts(arg: str) -> None:
    assert names_api_key(arg)
    problem = problem_of(f"serving: {{extra_args: ['{arg}', 'k']}}\n")
    assert problem.path == "serving.extra_args"


@pytest.mark.parametrize(
    "arg", ["--api-server-count", "--api", "--enable-api-keys", "api-key", "--disable-log-requests"]
)
def test_other_flags_are_not_mistaken_for_the_api_key(arg: str) -> None:
    assert not names_api_key(arg)


@pytest.mark.parametrize(
    "extra",
    [
        "model: {keep_parts: 'yes'}\n",
        "serving: {port: '8000'}\n",
        "serving: {gpu_util: '0.9'}\n",
        "memguard: {enabled: 1}\n",
    ],
)
def test_no_type_is_guessed_from_a_string_or_a_number(extra: str) -> None:
    problem_of(extra)


def test_remote_paths_are_protected_from_the_remote_shell() -> None:
    route = resolve_route("w", SshTarget(host="10.10.10.11", user="nvidia"), None, "me")
    argv = rsync_argv(route, "/m/x y;z", "/w/$(id)", None)
    assert "--protect-args" in argv
    assert argv[-2:] == ["/m/x y;z/", "nvidia@10.10.10.11:/w/$(id)/"]
    route = resolve_route("w", SshTarget(host="10.10.10.11"), None, "me")
    again = rsync_argv(route, "/m", "/w", ["model-00001-of-00006.safetensors"])
    assert again[-3:] == ["--ignore-times", "/m/./model-00001-of-00006.safetensors", "me@10.10.10.11:/w/"]
