"""Checkpoint distribution: the copy to a worker against one plain rsync, in the same run.

A checkpoint of the reference's shape (four native shards, two 1.5x shards as the reassembled
ones, many small EXL3 bank files; parts are never sent to a worker) is written on the head of
the testbed, then copied to the worker over the fabric address, 3 rounds, interleaved:

- `plain`: one `rsync -a` over the same ssh route (OpenSSH's default cipher);
- `before`: the copy as it ran before parallel streams (one rsync, the same flags as ours:
  --protect-args --partial --info=progress2, the parts and .cache excludes, progress parsed);
- `one_stream`: ours as one stream (the same flags, AES-GCM preferred);
- `ssh_streams`: the copy executor's streams over SSH (when the fabric addresses are unknown);
- `ours`: the copy executor as apply runs it: parallel streams to an rsync daemon started on the
  worker's fabric address for the copy (nodeside/copydaemon.py);
- `four_streams`: the same as if the head had 4 cores (4 streams), for the stream count.

`copy_vs_rsync` = plain / ours (goal >= 2.0 on the 2-core testbed). The breakdown says where the
time goes: `before` vs `plain` is the cost of our flags and progress parsing, `one_stream` vs
`before` the cipher, `ssh_streams` vs `one_stream` the streams, `ours` vs `ssh_streams` ssh
itself. `old_bench_setup_s` is what the old copy bench (checkpoint_bench --copy) timed besides
the copy: a fresh interpreter with the reconciler's imports, the SSH session and a full fact
gathering.

`bringup_vs_download` (2, 3 and 4 nodes): the same shape served by a Hub stand-in throttled below
the fabric's rate (each connection capped at `--hub-mib-s`, default 7 MiB/s: the head's eight
downloads at once, `model.download_streams`' default, come to about 52 MB/s, well below what
this 2-core testbed copies and hashes), the time from an empty checkpoint
on every node to every node verified (the plan's checkpoint staging as apply runs it: the head's
download, reassembly and verify, each worker's copy and verify, pipelined) over the head's
download alone (`hub.fetch` into an empty directory, the same client and file order, no hashing)
(goals <= 1.15, <= 1.25 and <= 1.35). `head_upload_over_checkpoint_N_nodes` (N = 2, 3, 4) is what the
head's fabric port sent during the N-node bring-up over the checkpoint's size: about 1 whatever N,
since the workers copy in a chain (goal <= 1.5).

Run (root, brings the testbed up): `.venv/bin/python bench/distribution_bench.py [--json]`.
Inside a node it runs as `... measure SPEC SOURCE DESTINATION` and `... bringup SPEC2 SPEC3 SPEC4
ROUNDS` (used by the outer run).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import shlex
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MIB = 1024 * 1024
MODEL = "/srv/spark/models/DeepSeek-V4.1-Flash-Spark"
DESTINATION = "/srv/spark/bench-copy"
PYTHON = str(ROOT / ".venv/bin/python")


def checkpoint_shape(shard_mib: int) -> dict[str, int]:
    """name -> bytes: the reference checkpoint's files at a small scale."""
    shape = {f"model-0000{n}-of-00006.safetensors": shard_mib * MIB for n in range(1, 5)}
    shape.update({f"model-0000{n}-of-00006.safetensors": shard_mib * 3 // 2 * MIB for n in (5, 6)})
    for bank in ("qn", "q31", "q31s"):
        shape.update({f"exl3/{bank}/L{layer:02d}.part.safetensors": 256 * 1024 for layer in range(28)})
    shape.update({"config.json": 4096, "model.safetensors.index.json": 64 * 1024, "sha256-manifest.txt": 600})
    shape["exl3/plan/J268-ho-v31-K5n.json"] = 90_000
    return shape


WRITE_TREE = """
import json, os, sys
root, shape = sys.argv[1], json.loads(sys.argv[2])
for name, size in shape.items():
    path = os.path.join(root, name)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as handle:
        left = size
        while left:
            chunk = os.urandom(min(left, 1 << 22))
            handle.write(chunk)
            left -= len(chunk)
"""


def timed(action: Callable[[], object]) -> float:
    started = time.perf_counter()
    action()
    return time.perf_counter() - started


def measure(spec_path: str, source: str, destination: str, rounds: int) -> dict[str, Any]:
    """On the head: each variant copies `source` into a fresh `destination` on the worker."""
    from reconciler.actions import Copy, action
    from reconciler.components.checkpoint_run import _copy
    from reconciler.components.routing import fabric_pair
    from reconciler.components.rsync import CIPHER_OPTION, rsync_argv, stream_count
    from reconciler.execution import ApplyContext, Progress
    from reconciler.facts.gather import gather
    from reconciler.pipeline import split_streams
    from reconciler.record import replace
    from reconciler.spec import load_spec
    from reconciler.transport.connect import close_all, connect_all
    from reconciler.transport.local import LocalTransport
    from reconciler.transport.sshroute import openssh_command, route_for

    deployment = load_spec(Path(spec_path)).deployment
    worker = deployment.ranked_nodes[1][1]
    assert worker.ssh is not None
    route = route_for(worker.name, worker.ssh)
    ssh = openssh_command(route)
    remote = f"{route.target.user}@{route.target.name}:{destination}/"
    sizes = {str(p.relative_to(source)): p.stat().st_size for p in Path(source).rglob("*") if p.is_file()}
    head = LocalTransport("bench")

    def clear() -> None:
        subprocess.run([*ssh, route.target.name, f"rm -rf {shlex.quote(destination)} && sync"], check=True)
        os.sync()

    def plain() -> None:
        subprocess.run(["rsync", "-a", "-e", shlex.join(ssh), f"{source}/", remote], check=True)

    def before() -> None:
        argv = rsync_argv(route, source, destination, None)
        old_ssh = argv.index("-e") + 1
        argv[old_ssh] = shlex.join(ssh)  # the route without the cipher preference, as before
        result = head.run(["sh", "-c", 'exec "$@" 1>&2', "rsync", *argv], timeout=3600, on_line=lambda _line: None)
        assert result.returncode == 0, result.stderr[-2000:]

    def one_stream() -> None:
        argv = rsync_argv(route, source, destination, None)
        result = head.run(["sh", "-c", 'exec "$@" 1>&2', "rsync", *argv], timeout=3600, on_line=lambda _line: None)
        assert result.returncode == 0, result.stderr[-2000:]

    transports = connect_all(deployment)
    try:
        started = time.perf_counter()
        facts = gather(deployment, transports)
        setup = time.perf_counter() - started
        fabric = fabric_pair(facts, deployment.head, worker)
        assert fabric is not None, "the testbed's fabric addresses are detected"
        ctx = ApplyContext(deployment, facts, transports, Progress(io.StringIO()))
        payload = Copy(
            source_node=deployment.head.name,
            source_dir=source,
            destination_dir=destination,
            files=None,
            bytes=sum(sizes.values()),
            sizes=sizes,
            fabric=fabric,
        )
        ssh_payload = replace(payload, fabric=None)
        copy = action(payload, worker.name, "create", "bench copy", "bench")
        over_ssh = action(ssh_payload, worker.name, "create", "bench", "bench")
        variants: dict[str, Callable[[], object]] = {
            "plain": plain,
            "before": before,
            "one_stream": one_stream,
            "ssh_streams": lambda: _copy(ctx, over_ssh, ssh_payload),
            "ours": lambda: _copy(ctx, copy, payload),
            "four_streams": lambda: _with_cores(4, lambda: _copy(ctx, copy, payload)),
        }
        times: dict[str, list[float]] = {name: [] for name in variants}
        for _ in range(rounds):
            for name, run in variants.items():
                clear()
                times[name].append(timed(run))
    finally:
        close_all(transports)
    median = {name: statistics.median(values) for name, values in times.items()}
    streams = split_streams(sizes, stream_count(os.cpu_count(), len(sizes)))
    return {
        "bytes": sum(sizes.values()),
        "files": len(sizes),
        "head_cores": os.cpu_count(),
        "streams": len(streams),
        "stream_bytes": [sum(sizes[name] for name in stream) for stream in streams],
        "cipher_option": CIPHER_OPTION,
        "seconds": median,
        "runs_s": times,
        "gather_s": setup,
        "copy_vs_rsync": median["plain"] / median["ours"],
        "before_vs_rsync": median["plain"] / median["before"],
        "one_stream_vs_rsync": median["plain"] / median["one_stream"],
        "ssh_streams_vs_rsync": median["plain"] / median["ssh_streams"],
        "four_streams_vs_rsync": median["plain"] / median["four_streams"],
        "rate_MBps": {name: sum(sizes.values()) / seconds / 1e6 for name, seconds in median.items()},
    }


FABRIC_PORT = "enp1s0f1np1"


def bringup(spec_paths: list[str], rounds: int) -> dict[str, Any]:
    """On the head: per round, the head's download alone, then the bring-up with each spec
    (2, 3 and 4 nodes), every checkpoint emptied before each."""
    from reconciler import hub
    from reconciler.actions import Step
    from reconciler.apply import apply_plan
    from reconciler.execution import ApplyContext, Progress
    from reconciler.facts.gather import gather
    from reconciler.facts.revisions import revision_dir
    from reconciler.pipeline import GROUP_STEPS
    from reconciler.plan import Plan, plan
    from reconciler.spec import load_spec
    from reconciler.transport.connect import close_all, connect_all

    deployments = [load_spec(Path(path)).deployment for path in spec_paths]
    widest = max(deployments, key=lambda deployment: len(deployment.nodes))
    transports = connect_all(widest)
    times: dict[str, list[float]] = {"download": [], **{f"bringup_{len(d.nodes)}": [] for d in deployments}}
    uploads: dict[int, list[float]] = {}
    size = 0
    try:

        def clear() -> None:
            state = widest.state_dir
            for node in widest.nodes:
                command = f"rm -rf {shlex.quote(node.model_dir)} {shlex.quote(node.model_dir)}@* {state}/hashcache.json"
                result = transports[node.name].run(
                    ["sh", "-c", f"{command} {state}/checkpoint.json {state}/plans; sync"]
                )
                assert result.returncode == 0, result.stderr[-2000:]

        def download_alone() -> float:
            model = widest.model
            commit = hub.resolve(model)
            target = revision_dir(widest.head.model_dir, commit)
            return timed(lambda: hub.fetch(model, target, commit=commit, report=lambda _line: None))

        def staging(deployment: Any) -> tuple[float, int, int]:
            """Seconds to run the checkpoint's staging, the head's fabric bytes sent, the checkpoint size."""
            facts = gather(deployment, {node.name: transports[node.name] for node in deployment.nodes})
            actions = [item for item in plan(deployment, facts).actions if item.step in GROUP_STEPS]
            copies = [item.payload for item in actions if item.step is Step.COPY]
            ctx = ApplyContext(deployment, facts, transports, Progress(io.StringIO()))
            sent = _tx_bytes()
            seconds = timed(lambda: apply_plan(ctx, Plan(deployment.name, [], actions)))
            return seconds, _tx_bytes() - sent, max(getattr(copy, "bytes", 0) for copy in copies)

        for _ in range(rounds):
            clear()
            times["download"].append(download_alone())
            for deployment in deployments:
                clear()
                seconds, sent, size = staging(deployment)
                times[f"bringup_{len(deployment.nodes)}"].append(seconds)
                uploads.setdefault(len(deployment.nodes), []).append(sent / size)
        clear()
    finally:
        close_all(transports)
    median = {name: statistics.median(values) for name, values in times.items()}
    report: dict[str, Any] = {"seconds": median, "runs_s": times, "checkpoint_bytes": size}
    for deployment in deployments:
        count = len(deployment.nodes)
        report[f"bringup_vs_download_{count}_nodes"] = median[f"bringup_{count}"] / median["download"]
    for count, ratios in uploads.items():
        report[f"head_upload_over_checkpoint_{count}_nodes"] = statistics.median(ratios)
    report["download_MBps"] = size / median["download"] / 1e6
    return report


def _tx_bytes() -> int:
    """Bytes this node (the head) has sent on its fabric port."""
    result = subprocess.run(["ip", "-s", "-j", "link", "show", FABRIC_PORT], capture_output=True, check=True)
    return int(json.loads(result.stdout)[0]["stats64"]["tx"]["bytes"])


def build_hub_checkpoint(out: Path, shard_mib: int, part_mib: int) -> int:
    """The copy bench's shape as a Hub repo for the stand-in: shards 5 and 6 as `.partNN` files,
    the manifest of the six native shards, a real EXL3 plan (the staging rewrites it). Built once
    per shape; returns its size."""
    from tests.testbed.hub.checkpoint import describe_repo, plan_document
    from tests.testbed.hub.repo import DEFAULT_REPO_ID, FILES_DIR, INDEX_NAME, save_repo_info

    shape = checkpoint_shape(shard_mib)
    stamp = out / "bench-shape.json"
    wanted = json.dumps({"shape": shape, "part_mib": part_mib}, sort_keys=True)
    if (out / INDEX_NAME).is_file() and stamp.is_file() and stamp.read_text() == wanted:
        return sum(shape.values())
    files = out / FILES_DIR
    subprocess.run(["rm", "-rf", str(files)], check=True)
    manifest: dict[str, str] = {}
    for name, size in shape.items():
        path = files / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if name.endswith("plan/J268-ho-v31-K5n.json"):
            path.write_text(json.dumps(plan_document()))
        elif name.endswith(".json"):
            path.write_text(json.dumps({"bench": True, "padding": "x" * max(0, size - 40)}))
        elif name == "sha256-manifest.txt":
            continue
        elif name.startswith("model-0000") and name[10] in "56":
            manifest[name] = _write_parts(path, size, part_mib * MIB)
        else:
            manifest_digest = _write_random(path, size)
            if name.startswith("model-"):
                manifest[name] = manifest_digest
    lines = "".join(f"{digest}  {name}\n" for name, digest in sorted(manifest.items()))
    (files / "sha256-manifest.txt").write_text(lines)
    save_repo_info(out, describe_repo(DEFAULT_REPO_ID, files))
    stamp.write_text(wanted)
    return sum(shape.values())


def _write_random(path: Path, size: int) -> str:
    import hashlib

    digest = hashlib.sha256()
    with path.open("wb") as handle:
        left = size
        while left:
            chunk = os.urandom(min(left, 1 << 22))
            handle.write(chunk)
            digest.update(chunk)
            left -= len(chunk)
    return digest.hexdigest()


def _write_parts(path: Path, size: int, part_bytes: int) -> str:
    """The shard as `<name>.part00`, `.part01`, ... of `part_bytes`; the whole shard's sha256."""
    import hashlib

    digest = hashlib.sha256()
    index, left = 0, size
    while left:
        count = min(left, part_bytes)
        part = path.with_name(f"{path.name}.part{index:02d}")
        with part.open("wb") as handle:
            done = 0
            while done < count:
                chunk = os.urandom(min(count - done, 1 << 22))
                handle.write(chunk)
                digest.update(chunk)
                done += len(chunk)
        index, left = index + 1, left - count
    return digest.hexdigest()


def _with_cores(cores: int, run: Callable[[], object]) -> object:
    """Our copy as it would run on a head with `cores` cores (the stream count follows them)."""
    real = os.cpu_count
    os.cpu_count = lambda: cores
    try:
        return run()
    finally:
        os.cpu_count = real


def planned_head_upload(workers: int) -> float:
    """The head's uploaded bytes over the checkpoint size in the plan for a fresh deployment of
    the reference spec with this many workers (each like the reference worker, on the fabric)."""
    from reconciler.actions import Copy, Step
    from reconciler.plan import plan
    from tests.scenarios import empty_facts, reference_deployment

    deployment, facts = reference_deployment(), empty_facts()
    worker = deployment.nodes[1]
    extra = [
        worker.model_copy(
            update={"name": f"w{n}", "fabric": worker.fabric.model_copy(update={"ip": f"10.10.10.{20 + n}"})}
        )
        for n in range(workers - 1)
    ]
    nodes = {**facts.nodes, **{node.name: facts.nodes[worker.name] for node in extra}}
    deployment = deployment.model_copy(update={"nodes": [*deployment.nodes, *extra]})
    copies = [
        a.payload for a in plan(deployment, facts.model_copy(update={"nodes": nodes})).actions if a.step is Step.COPY
    ]
    sent = sum(p.bytes for p in copies if isinstance(p, Copy) and p.source_node == deployment.head.name)
    return sent / max(p.bytes for p in copies if isinstance(p, Copy))


BENCH_HUB_PORT = 5091


def on_testbed(shard_mib: int, rounds: int, hub_mib_s: float) -> dict[str, Any]:
    from tests.e2e.conftest import FOURTH_NODE, TB_ROOT, THIRD_NODE, write_spec
    from tests.testbed import specfile
    from tests.testbed.hub.control import StandinControl
    from tests.testbed.services import start_hub, stop_hub
    from tests.testbed.testbed import Testbed

    testbed = Testbed(TB_ROOT)
    testbed.up(nodes=4)
    try:
        engine = testbed.images()["engine"]
        spec = write_spec(ROOT / "specs/testbed.yaml", testbed.layout.specs / "bench-distribution.yaml", engine)
        shape = checkpoint_shape(shard_mib)
        testbed.exec("spark-head", ["python3", "-c", WRITE_TREE, MODEL, json.dumps(shape)], timeout=900)
        imports = "import reconciler.commands, reconciler.facts.gather, reconciler.components.checkpoint_run"
        interpreter = statistics.median(
            timed(lambda: testbed.exec("spark-head", [PYTHON, "-c", imports])) for _ in range(3)
        )
        argv = [PYTHON, str(Path(__file__).resolve()), "measure", str(spec), MODEL, DESTINATION, str(rounds)]
        result = testbed.exec("spark-head", argv, timeout=3600)
        report: dict[str, Any] = json.loads(result.stdout)
        testbed.exec("spark-head", ["rm", "-rf", MODEL], timeout=300)

        build = testbed.layout.root / "bench-hub"
        build_hub_checkpoint(build, shard_mib, part_mib=128)
        start_hub(testbed.layout, root=build, port=BENCH_HUB_PORT)
        endpoint = f"http://{_hub_host()}:{BENCH_HUB_PORT}"
        text = spec.read_text(encoding="utf-8").replace("http://198.19.0.1:5080", endpoint)
        two = testbed.layout.specs / "bench-bringup-2.yaml"
        two.write_text(text, encoding="utf-8")
        wider = []
        for count, added in ((3, THIRD_NODE), (4, THIRD_NODE + FOURTH_NODE)):
            path = testbed.layout.specs / f"bench-bringup-{count}.yaml"
            with_more = text.replace("\nmodel:\n", "\n" + added + "model:\n", 1)
            path.write_text(specfile.render(with_more, testbed.layout, engine), encoding="utf-8")
            wider.append(str(path))
        control = StandinControl(endpoint)
        control.rate(int(hub_mib_s * MIB))
        try:
            argv = [PYTHON, str(Path(__file__).resolve()), "bringup", str(two), *wider, str(rounds)]
            bringup_report = json.loads(testbed.exec("spark-head", argv, timeout=3600).stdout)
        finally:
            control.clear_faults()
            stop_hub(testbed.layout, BENCH_HUB_PORT)
    finally:
        testbed.down()
    report["old_bench_setup_s"] = interpreter + report.pop("gather_s")
    report["checkpoint_shape"] = "4 shards + 2 at 1.5x (the reassembled ones) + 84 EXL3 bank files + metadata"
    report["goal_copy_vs_rsync"] = 2.0
    report["head_upload_over_checkpoint_3_nodes_planned"] = planned_head_upload(2)
    report["head_upload_over_checkpoint_8_nodes_planned"] = planned_head_upload(7)
    report["goal_head_upload_3_nodes"] = 1.5
    report["bringup"] = bringup_report
    report["hub_rate_per_connection_MiBps"] = hub_mib_s
    for nodes, goal in ((2, 1.15), (3, 1.25), (4, 1.35)):
        report[f"bringup_vs_download_{nodes}_nodes"] = bringup_report[f"bringup_vs_download_{nodes}_nodes"]
        report[f"goal_bringup_vs_download_{nodes}_nodes"] = goal
        upload = f"head_upload_over_checkpoint_{nodes}_nodes"
        report[upload] = bringup_report.get(upload)
    return report


def _hub_host() -> str:
    from tests.testbed.config import HOST_IP

    return HOST_IP


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command")
    inner = sub.add_parser("measure", help="(inside the head) time the variants")
    inner.add_argument("spec")
    inner.add_argument("source")
    inner.add_argument("destination")
    inner.add_argument("rounds", type=int)
    parser.add_argument("--json", action="store_true", help="print only the JSON report")
    parser.add_argument("--shard-mib", type=int, default=160, help="native shard size (default 160: ~1.2 GB)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--hub-mib-s", type=float, default=7.0, help="the Hub stand-in's cap per connection (default 7 MiB/s)"
    )
    up = sub.add_parser("bringup", help="(inside the head) time the bring-up against the download alone")
    up.add_argument("specs", nargs="+")
    up.add_argument("rounds", type=int)
    args = parser.parse_args()
    if args.command == "measure":
        print(json.dumps(measure(args.spec, args.source, args.destination, args.rounds)))
        return
    if args.command == "bringup":
        print(json.dumps(bringup(args.specs, args.rounds)))
        return
    # The testbed says what it brings up and down on stdout; with --json only the report goes there.
    with contextlib.redirect_stdout(sys.stderr) if args.json else contextlib.nullcontext():
        report = on_testbed(args.shard_mib, args.rounds, args.hub_mib_s)
    if not args.json:
        seconds = report["seconds"]
        print(
            f"copy of {report['bytes'] / 1e9:.2f} GB, {report['files']} files: plain rsync {seconds['plain']:.2f} s, "
            f"before {seconds['before']:.2f} s, one stream {seconds['one_stream']:.2f} s, "
            f"ours {seconds['ours']:.2f} s in {report['streams']} streams; copy_vs_rsync {report['copy_vs_rsync']:.2f}"
            f" (goal >= 2.0)",
            file=sys.stderr,
        )
        for nodes in (2, 3, 4):
            print(
                f"{nodes} nodes: bring-up over the download alone {report[f'bringup_vs_download_{nodes}_nodes']:.2f} "
                f"(goal <= {report[f'goal_bringup_vs_download_{nodes}_nodes']}), head upload "
                f"{report[f'head_upload_over_checkpoint_{nodes}_nodes']:.2f}x the checkpoint (goal <= 1.5)",
                file=sys.stderr,
            )
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
