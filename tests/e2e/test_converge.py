"""Converge a two-node deployment on the testbed for real, then change it, stop it, start it.

The module's deployment fetches from a Hub stand-in that requires a token (the head's token
file), so the secret scan has both secrets to look for. Each test converges first when it
needs a serving group (`converged`), so the tests run in any order.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes

from tests.e2e import secretscan
from tests.e2e.conftest import STATE_DIR, Bed, reset_bed, running_loop, wait_until
from tests.testbed import services
from tests.testbed.config import HOST_IP, node_named
from tests.testbed.testbed import Testbed

pytestmark = pytest.mark.testbed

HEAD, WORKER = "spark-head", "spark-worker"
TOKEN_HUB_PORT = 5081
TOKEN_FILE = "/srv/spark/hf_token"  # on the head, beside the state dir
HF_TOKEN = "hf_e2eScanTokenQ7vX2mLp9RtW4kZs8NdYb"


def write_token(bed: Bed) -> None:
    bed.node(HEAD, "sh", "-c", f"umask 077 && printf %s {HF_TOKEN} > {TOKEN_FILE}")


@pytest.fixture(scope="module")
def bed(shared_testbed: Testbed, tmp_path_factory: pytest.TempPathFactory) -> Bed:
    """The testbed spec as a user's demo has it: the engine stand-in shuts down in 11 s."""
    return reset_bed(shared_testbed, tmp_path_factory.mktemp("spec"), nodes=2, slow_shutdown=True)


@pytest.fixture(scope="module")
def tokened(bed: Bed) -> Bed:
    """The module's spec fetches from a Hub stand-in that answers only with the token."""
    host_token = bed.spec.parent / "hub-token"
    host_token.write_text(HF_TOKEN, encoding="utf-8")
    services.start_hub(bed.testbed.layout, port=TOKEN_HUB_PORT, token_file=host_token)
    write_token(bed)
    endpoint = f"  endpoint: http://{HOST_IP}:{TOKEN_HUB_PORT}\n  token_file: {TOKEN_FILE}"
    text = bed.spec.read_text(encoding="utf-8").replace("  endpoint: http://198.19.0.1:5080", endpoint)
    bed.spec.write_text(text, encoding="utf-8")
    return bed


@pytest.fixture
def converged(tokened: Bed) -> Bed:
    tokened.converged()
    return tokened


def chat(bed: Bed, key: str, prompt: str) -> Any:
    """A completion through the API, sent from inside the head like a local client."""
    body = json.dumps({"model": "deepseek-v4.1-flash", "messages": [{"role": "user", "content": prompt}]})
    script = (
        "import sys, urllib.request\n"
        "req = urllib.request.Request('http://127.0.0.1:8000/v1/chat/completions', data=sys.argv[1].encode(),"
        " headers={'Authorization': 'Bearer ' + sys.stdin.read().strip(), 'Content-Type': 'application/json'})\n"
        "print(urllib.request.urlopen(req, timeout=30).read().decode())\n"
    )
    result = bed.testbed.exec(HEAD, ["python3", "-c", script, body], input_text=key, check=True)
    return json.loads(result.stdout)


def test_converges_from_empty(tokened: Bed) -> None:
    bed = tokened
    bed.fresh()
    services.start_hub(bed.testbed.layout, port=TOKEN_HUB_PORT, token_file=bed.spec.parent / "hub-token")
    write_token(bed)
    # The testbed pre-pulls the engine image; remove it on the worker so the pull is ours.
    image_id = bed.node(WORKER, "docker", "image", "inspect", "--format", "{{.Id}}", engine_ref(bed)).stdout.strip()
    bed.node(WORKER, "docker", "rmi", "-f", image_id)
    planned = bed.reconciler("plan").stdout
    assert "image on spark-worker: pull" in planned
    assert "image on spark-head" not in planned
    started = time.monotonic()
    script = f"{bed.spec.parent}/apply-events.jsonl"
    result = bed.reconciler("apply", "--yes", "--events", script)
    print(f"converged from empty in {time.monotonic() - started:.1f} s")
    assert "Apply complete" in result.stdout
    assert "start dsv41-r1" in result.stdout
    events = [json.loads(line) for line in Path(script).read_text(encoding="utf-8").splitlines()]
    steps = {(e["step"], e["node"]) for e in events if e["kind"] == "step" and e["outcome"] == "done"}
    assert {("checkpoint.download", HEAD), ("ranks.start", WORKER), ("ranks.start", HEAD)} <= steps, steps
    (finished,) = [e for e in events if e["kind"] == "pass"]
    assert (finished["doing"], finished["outcome"]) == ("reconciler apply", "converged"), finished
    history = json.loads(bed.reconciler("events", "--json").stdout)["events"]
    assert [e for e in history if e["kind"] == "pass"][-1]["outcome"] == "converged"
    assert "progress" not in {e["kind"] for e in history}, "the history keeps the steps, not their progress"
    for node in (HEAD, WORKER):
        state = bed.docker_json(node, "inspect", "--format", "{{json .State}}", f"dsv41-r{0 if node == HEAD else 1}")
        assert isinstance(state, dict)
        assert state["Running"] is True
    assert bed.plan_exit() == 0


def engine_ref(bed: Bed) -> str:
    return str(bed.testbed.images()["engine"])


def test_ranks_get_a_stop_timeout_well_above_docker_default(converged: Bed) -> None:
    bed = converged
    timeout = bed.node(HEAD, "docker", "inspect", "--format", "{{.Config.StopTimeout}}", "dsv41-r0").stdout.strip()
    assert int(timeout) >= 30


def test_a_wrong_key_mode_is_fixed_and_the_key_kept(converged: Bed) -> None:
    bed = converged
    key = bed.api_key()
    bed.node(HEAD, "chmod", "0644", "/srv/spark/state/api_key")
    planned = bed.reconciler("plan").stdout
    assert "apikey on spark-head: set mode 0600" in planned
    assert "0644" in planned
    bed.reconciler("apply", "--yes")
    assert bed.node(HEAD, "stat", "-c", "%a", "/srv/spark/state/api_key").stdout.strip() == "600"
    assert bed.api_key() == key
    assert bed.plan_exit() == 0


def test_the_api_answers_with_the_key_only(converged: Bed) -> None:
    bed = converged
    key = bed.api_key()
    assert len(key) == 43
    answer = chat(bed, key, "What is 17 * 23? Answer with the number.")
    assert "391" in answer["choices"][0]["message"]["content"]
    denied = bed.testbed.exec(
        HEAD, ["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "http://127.0.0.1:8000/v1/models"], check=False
    )
    assert denied.stdout == "401"


# From another machine on the LAN (the worker's namespace, to the head's management address):
# each route class without and with the key, and rank 0's own port.
LAN_PROBE = """
import json, sys, urllib.request, urllib.error
key = sys.stdin.read().strip()
def status(url, method="GET", key=None):
    body = json.dumps({"model": "deepseek-v4.1-flash", "messages": [{"role": "user", "content": "hi"}]})
    data = body.encode() if method == "POST" else None
    headers = {"Content-Type": "application/json", **({"Authorization": "Bearer " + key} if key else {})}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data, headers, method=method), timeout=10) as answer:
            return answer.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError as exc:  # urllib wraps the socket's error in a URLError
        return type(getattr(exc, "reason", exc)).__name__
routes = ["GET /v1/models", "POST /v1/chat/completions", "POST /invocations", "POST /tokenize", "GET /metrics",
          "GET /version", "GET /load", "GET /docs", "GET /_standin/loaded"]
api = "http://%s:8000" % sys.argv[1]
found = {}
for route in routes:
    method, path = route.split(" ", 1)
    found[route] = [status(api + path, method), status(api + path, method, "wrong"), status(api + path, method, key)]
found["GET /health"] = [status(api + "/health")]
found["rank 0 direct"] = [status("http://%s:18000/v1/models" % sys.argv[1], "GET", key)]
print(json.dumps(found))
"""


def test_from_the_lan_only_the_front_answers_and_only_with_the_key(converged: Bed) -> None:
    bed = converged
    head = node_named(HEAD)
    for address in (head.mgmt_ip, head.fabric_ip):
        probe = bed.testbed.exec(WORKER, ["python3", "-c", LAN_PROBE, address], input_text=bed.api_key(), check=True)
        found = json.loads(probe.stdout)
        refused = {route: answers[:2] for route, answers in found.items() if len(answers) == 3}
        assert all(answers == [401, 401] for answers in refused.values()), found
        assert {route: answers[2] for route, answers in found.items() if len(answers) == 3} == {
            "GET /v1/models": 200,
            "POST /v1/chat/completions": 200,
            "POST /invocations": 200,
            "POST /tokenize": 200,
            "GET /metrics": 200,
            "GET /version": 200,
            "GET /load": 200,
            "GET /docs": 404,  # the stand-in serves no docs; the front let the keyed request through
            "GET /_standin/loaded": 200,
        }, found
        assert found["GET /health"] == [200]
        assert found["rank 0 direct"] == ["ConnectionRefusedError"], found


CA_ON_WORKER = "/srv/spark/front.pem"  # a LAN client's copy of the front's certificate
TLS_PROBE = """
import json, ssl, sys, urllib.request, urllib.error
url, cafile = sys.argv[1], sys.argv[2]
def status(path, context):
    try:
        with urllib.request.urlopen(url + path, timeout=10, context=context) as answer:
            return answer.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError as exc:
        return type(getattr(exc, "reason", exc)).__name__
pinned = ssl.create_default_context(cafile=cafile)
print(json.dumps({"pinned /health": status("/health", pinned), "pinned /v1/models": status("/v1/models", pinned),
                  "unpinned /health": status("/health", ssl.create_default_context())}))
"""


def test_tls_replaces_the_front_alone_and_the_reconcilers_clients_follow(converged: Bed) -> None:
    """api.tls: {} makes a self-signed pair once; the front alone is replaced and serves HTTPS;
    smoke and status go through it pinning the certificate; a LAN client must pin it too."""
    bed = converged
    original = bed.spec.read_text(encoding="utf-8")
    ranks = {node: bed.container_id(node, f"dsv41-r{0 if node == HEAD else 1}") for node in (HEAD, WORKER)}
    bed.spec.write_text(original.replace("\napi:\n", "\napi:\n  tls: {}\n", 1), encoding="utf-8")
    try:
        planned = bed.reconciler("plan").stdout
        assert "front on spark-head: create a self-signed TLS pair" in planned
        assert "HAProxy, HTTPS on 0.0.0.0:8000" in planned
        bed.reconciler("apply", "--yes")
        assert bed.plan_exit() == 0
        assert {node: bed.container_id(node, f"dsv41-r{0 if node == HEAD else 1}") for node in (HEAD, WORKER)} == ranks
        assert bed.node(HEAD, "stat", "-c", "%a", f"{STATE_DIR}/tls.key").stdout.strip() == "600"
        smoke = bed.reconciler("smoke", "--checks", "protocol")
        assert "3/3 checks passed against https://127.0.0.1:8000" in smoke.stdout
        status = bed.reconciler("status").stdout
        cert = bed.node(HEAD, "cat", f"{STATE_DIR}/tls.pem").stdout
        fingerprint = x509.load_pem_x509_certificate(cert.encode()).fingerprint(hashes.SHA256()).hex(":").upper()
        assert f"tls: sha256 fingerprint {fingerprint}" in status
        assert "health: 200" in status
        bed.testbed.exec(WORKER, ["sh", "-c", f"cat > {CA_ON_WORKER}"], input_text=cert)
        head = node_named(HEAD).mgmt_ip
        probe = bed.node(WORKER, "python3", "-c", TLS_PROBE, f"https://{head}:8000", CA_ON_WORKER).stdout
        assert json.loads(probe) == {
            "pinned /health": 200,
            "pinned /v1/models": 401,
            "unpinned /health": "SSLCertVerificationError",
        }
    finally:
        bed.spec.write_text(original, encoding="utf-8")
        bed.node(WORKER, "rm", "-f", CA_ON_WORKER)
    bed.reconciler("apply", "--yes")
    assert bed.plan_exit() == 0
    assert {node: bed.container_id(node, f"dsv41-r{0 if node == HEAD else 1}") for node in (HEAD, WORKER)} == ranks


def test_a_rotated_key_replaces_the_front_and_leaves_the_ranks_running(converged: Bed) -> None:
    """The owner writes a new key into the key file: the front alone is replaced, in a second,
    and from then on only the new key opens the door."""
    bed = converged
    old_key = bed.api_key()
    ranks = {node: bed.container_id(node, f"dsv41-r{0 if node == HEAD else 1}") for node in (HEAD, WORKER)}
    front = bed.container_id(HEAD, "dsv41-front")
    assert front
    new_key = "rotated-" + old_key[8:]
    bed.node(HEAD, "sh", "-c", f"umask 077 && printf '%s\\n' {new_key} > {STATE_DIR}/api_key")
    planned = bed.reconciler("plan").stdout
    assert "front on spark-head: start dsv41-front" in planned
    assert "the key file (or the TLS pair) changed since the front read it" in planned
    assert "Plan: 0 to add, 0 to change, 1 to replace, 0 to destroy, 0 to run." in planned
    # A script's apply (no terminal to ask) does nothing disruptive unless told so with --yes.
    piped = bed.reconciler("apply", check=False)
    assert piped.returncode == 1, piped.stdout + piped.stderr
    assert "nobody to ask (stdin is not a terminal)" in piped.stderr
    assert "add --yes to the same command" in piped.stderr
    assert bed.container_id(HEAD, "dsv41-front") == front
    bed.reconciler("apply", "--yes")
    assert bed.plan_exit() == 0
    assert {node: bed.container_id(node, f"dsv41-r{0 if node == HEAD else 1}") for node in (HEAD, WORKER)} == ranks
    assert bed.container_id(HEAD, "dsv41-front") not in {"", front}
    assert "391" in chat(bed, new_key, "What is 17 * 23? Answer with the number.")["choices"][0]["message"]["content"]
    with pytest.raises(subprocess.CalledProcessError):
        chat(bed, old_key, "What is 17 * 23?")


def test_no_secret_appears_anywhere_in_any_encoding(converged: Bed) -> None:
    """The API key and the HF token, as plain text, base64, hex, URL-encoded or JSON-escaped, in
    no command's output, no file under any node's state dir or home, no container's inspect, no
    process's argv or environment (the engine's and the front's included: the front reads the key
    from its file, the engine never has it), and not in the loop's journal (its output) after a
    pass. The scan proves it can see: it finds the key where it must be (its file)."""
    bed = converged
    secrets = {"API key": bed.api_key(), "HF token": HF_TOKEN}
    assert bed.node(HEAD, "stat", "-c", "%a", f"{STATE_DIR}/api_key").stdout.strip() == "600"
    texts: dict[str, str] = {}
    for argv in (["plan"], ["plan", "--json"], ["status", "--json"], ["status", "--probe"], ["doctor", "--json"]):
        result = bed.reconciler(*argv, check=False)
        texts[f"reconciler {' '.join(argv)}"] = result.stdout + result.stderr
    for what in ("r0", "r1", "memguard"):
        result = bed.reconciler("logs", what, "--tail", "500")
        texts[f"reconciler logs {what}"] = result.stdout + result.stderr
    with running_loop(bed) as log:
        wait_until(lambda: "[loop] status: converged" in log.read_text(encoding="utf-8"), 90, "a loop pass")
    texts["the loop's journal"] = log.read_text(encoding="utf-8")
    key_file = ""
    for node in (HEAD, WORKER):
        texts[f"docker inspect on {node}"] = bed.node(node, "sh", "-c", "docker inspect $(docker ps -aq)").stdout
        for pid, process in processes(bed, node).items():
            texts[f"argv of {pid} on {node}"] = process["argv"]
            texts[f"environment of {pid} ({process['comm']}) on {node}"] = process["environ"]
        files = {**state_files(bed, node), **home_files(bed, node)}
        if node == HEAD:
            key_file = files[f"{STATE_DIR}/api_key"]
        assert len([path for path in files if path.startswith(f"{STATE_DIR}/")]) >= 3, (node, sorted(files))
        texts.update({f"{node}:{path}": content for path, content in files.items() if path not in SECRET_FILES})
    # The scan sees a secret where one is: in the key file.
    assert "API key as plain" in secretscan.leaks(key_file, secrets)
    found = {where: leaked for where, text in texts.items() if (leaked := secretscan.leaks(text, secrets))}
    assert found == {}


# Every process of the node: its name, argv, environment and cgroup (which container it is in).
PROCESSES = """
import json, os
found = {}
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        read = lambda name: open(f"/proc/{pid}/{name}", "rb").read().replace(b"\\0", b" ").decode("utf-8", "replace")
        found[pid] = {name: read(name) for name in ("comm", "cmdline", "environ", "cgroup")}
    except OSError:
        continue
    found[pid]["argv"] = found[pid].pop("cmdline")
print(json.dumps(found))
"""


def processes(bed: Bed, node: str) -> dict[str, dict[str, str]]:
    found: dict[str, dict[str, str]] = json.loads(bed.node(node, "python3", "-c", PROCESSES).stdout)
    return found


# The two files whose content is the secret itself.
SECRET_FILES = {f"{STATE_DIR}/api_key", TOKEN_FILE}
DUMP = "import json, sys; print(json.dumps({p: open(p, 'rb').read().decode('utf-8', 'replace') for p in sys.argv[1:]}))"


def state_files(bed: Bed, node: str) -> dict[str, str]:
    """Every file under the node's state dir, by path."""
    script = f"find {STATE_DIR} -type f -print0 | xargs -0 -r python3 -c {shlex.quote(DUMP)}"
    files: dict[str, str] = json.loads(bed.node(node, "sh", "-c", script).stdout or "{}")
    return files


def home_files(bed: Bed, node: str) -> dict[str, str]:
    """Every file under the node's home (the testbed keeps it on the host), by path."""
    home = bed.testbed.layout.home(node_named(node))
    return {str(path): path.read_bytes().decode("utf-8", "replace") for path in home.rglob("*") if path.is_file()}


def test_status_reports_nodes_health_and_memory(converged: Bed) -> None:
    bed = converged
    report: Any = json.loads(bed.reconciler("status", "--json").stdout)
    assert report["converged"] is True
    assert report["health"] == 200
    for node in (HEAD, WORKER):
        assert report["nodes"][node]["reachable"] is True
        assert report["nodes"][node]["mem_available_gib"] > 0
        assert report["nodes"][node]["guard"]["running"] is True


def test_stop_holds_the_group_and_start_brings_it_back(converged: Bed) -> None:
    bed = converged
    stopped = bed.reconciler("stop")
    for node, name in ((HEAD, "dsv41-r0"), (WORKER, "dsv41-r1")):
        found = bed.docker_json(node, "inspect", "--format", "{{json .State}}", name)
        assert isinstance(found, dict)
        # The engine took 11 s to shut down, past Docker's 10 s default: only a longer grace
        # lets it finish (a SIGKILL would have left 137).
        assert (found["Running"], found["ExitCode"], found["OOMKilled"]) == (False, 0, False), found
    assert bed.plan_exit() == 0, "a held group is converged: nothing to start"
    status = json.loads(bed.reconciler("status", "--json").stdout)
    assert status["nodes"][HEAD]["hold"] is not None
    started = bed.reconciler("start")
    assert bed.plan_exit() == 0
    assert "391" in chat(bed, bed.api_key(), "What is 17 * 23?")["choices"][0]["message"]["content"]
    for result in (stopped, started):
        # Each ends its Docker relays before it exits: a relay's pipe still running then died
        # with a thread traceback on the way out (about every other command).
        assert "Exception in thread" not in result.stderr, result.stderr


def test_a_second_apply_does_nothing(converged: Bed) -> None:
    bed = converged
    result = bed.reconciler("apply", "--yes")
    assert "No changes." in result.stdout
    assert not re.search(r"Apply complete", result.stdout)


def test_a_rank_that_exits_fails_the_apply_fast_with_every_ranks_logs(converged: Bed) -> None:
    bed = converged
    original = bed.spec.read_text(encoding="utf-8")
    broken = original.replace("  extra_env:\n", '  extra_env:\n    ENGINE_FAULT_EXIT_AFTER_S: "0.5"\n', 1)
    bed.spec.write_text(broken, encoding="utf-8")
    try:
        started = time.monotonic()
        failed = bed.reconciler("apply", "--yes", check=False)
        elapsed = time.monotonic() - started
        print(f"failed apply reported after {elapsed:.1f} s")
        assert failed.returncode == 1
        assert "ranks on spark-head: wait until GET /v1/models" in failed.stderr
        assert "a rank exited" in failed.stderr
        assert "r0| " in failed.stderr
        assert "r1| " in failed.stderr
        assert elapsed < 120, "fail fast: far below the startup timeout"
    finally:
        bed.spec.write_text(original, encoding="utf-8")
    bed.reconciler("apply", "--yes")
    assert bed.plan_exit() == 0
