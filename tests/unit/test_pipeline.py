"""The pipelined distribution: boards, feeds, the group runner, and the copy taking files as they come."""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Callable, Mapping
from pathlib import Path

import pytest

from reconciler import apply
from reconciler.actions import Action, Copy, Download, Reassemble, Shard, Step, Verify, action
from reconciler.components import checkpoint_run
from reconciler.errors import ApplyError, NodeCommandError, ReconcilerError
from reconciler.execution import ApplyContext
from reconciler.pipeline import BATCH_BYTES, Boards, Feed, Outcome, run_group
from reconciler.plan import plan, render_text
from reconciler.record import replace
from reconciler.repofiles import HubFile
from tests.scenarios import empty_facts, reference_deployment
from tests.unit.test_rsync import RecordingHead, copy_context, sources_of

MIB = 1024 * 1024
SHARD = "model-00005-of-00006.safetensors"
PARTS = [f"{SHARD}.part00", f"{SHARD}.part01"]


def download_on(node: str = "spark-head") -> Action:
    payload = Download(repo="r", commit="c" * 40, model_dir="/m", files=[HubFile(path="a", size=1)])
    return action(payload, node, "create", "download", "test")


def verify_on(node: str, after: str) -> Action:
    payload = Verify(model_dir="/m", files={}, manifest="m", cache="/c", deep=False)
    return action(payload, node, "run", "verify", "test", (after,))


def copy_to(node: str, source: str, after: str, sizes: dict[str, int], destination: str = "/w") -> Action:
    payload = Copy(
        source_node=source,
        source_dir="/m",
        destination_dir=destination,
        files=None,
        bytes=sum(sizes.values()),
        sizes=sizes,
        fabric=None,
        pipelined=True,
    )
    return action(payload, node, "create", "copy", "test", (after,))


# ---- feeds --------------------------------------------------------------------------------------


def test_a_feed_hands_out_only_published_files_the_biggest_ready_first() -> None:
    boards = Boards()
    board = boards.board("spark-head")
    sizes = {"small": 100 * MIB, "big": 300 * MIB, "middle": 200 * MIB}
    feed = Feed(board, sizes)
    board.publish(["small", "middle"])
    assert feed.take(2) == ["middle"], "the biggest of the ready files; the unpublished bigger one waits"
    assert feed.take(2) == ["small"]
    board.publish(["big"])
    assert feed.take(2) == ["big"]
    assert feed.take(2) is None, "every wanted file handed out once"


def test_small_ready_files_go_together_up_to_a_batch() -> None:
    board = Boards().board("spark-head")
    sizes = {f"exl3/L{n:02d}": 256 * 1024 for n in range(8)} | {"shard": 2 * BATCH_BYTES}
    feed = Feed(board, sizes)
    board.publish([f"exl3/L{n:02d}" for n in range(8)])
    assert sorted(feed.take(2) or []) == sorted(f"exl3/L{n:02d}" for n in range(8))


def test_a_released_feed_hands_everything_out_split_like_a_plain_copy() -> None:
    board = Boards().board("spark-head")
    sizes = {"a": 300 * MIB, "b": 200 * MIB, "c": 100 * MIB}
    feed = Feed(board, sizes)
    feed.release()
    first = feed.take(2)
    assert first == ["a"], "two streams: the biggest alone in the first"
    assert feed.take(1) == ["b", "c"]


def test_a_failed_board_stops_its_consumers_instead_of_leaving_them_waiting() -> None:
    board = Boards().board("spark-head")
    feed = Feed(board, {"a": 1})
    board.fail("checkpoint.download@spark-head failed: HTTP 503")
    with pytest.raises(NodeCommandError, match=r"spark-head did not get its files ready: .*HTTP 503"):
        feed.take(1)
    with pytest.raises(NodeCommandError, match="HTTP 503"):
        feed.wait_for(["a"])


def test_a_feed_outside_a_pipelined_group_has_every_file_ready_at_once() -> None:
    boards = Boards()
    copy = copy_to("spark-worker", "spark-head", "x", {"a": 1, "b": 2})
    feed = boards.feed(copy, "spark-head", {"a": 1, "b": 2})
    assert feed.all_ready()


# ---- the group runner ---------------------------------------------------------------------------


def publishing(boards: Boards, names: list[str]) -> Callable[[Action], str]:
    def body(_act: Action) -> str:
        boards.board("spark-head").publish(names)
        return "ok"

    return body


def run_fake(boards: Boards, group: list[Action], bodies: Mapping[str, Callable[[Action], str]]) -> list[Outcome]:
    def run(act: Action) -> Outcome:
        try:
            return bodies[act.id](act), 0.0, None
        except ReconcilerError as error:
            return "", 0.0, error

    return run_group(boards, group, run)


def test_the_copy_takes_each_file_only_after_it_is_published_while_the_download_runs() -> None:
    boards = Boards()
    download = download_on()
    verify = verify_on("spark-head", download.id)
    copy = copy_to("spark-worker", "spark-head", verify.id, {"a": 3, "b": 2, "c": 1})
    events: list[str] = []
    lock = threading.Lock()
    taken = threading.Event()

    def note(event: str) -> None:
        with lock:
            events.append(event)

    def downloading(_act: Action) -> str:
        board = boards.board("spark-head")
        for name in ("b", "a"):
            note(f"published {name}")
            board.publish([name])
        # The copy must have taken something while the download still runs (it is pipelined).
        taken.wait()
        note("download done")
        return "downloaded"

    def copying(act: Action) -> str:
        feed = boards.feed(act, "spark-head", {"a": 3, "b": 2, "c": 1})
        while (batch := feed.take(1)) is not None:
            note(f"sent {','.join(batch)}")
            taken.set()
        return "copied"

    outcomes = run_fake(
        boards, [download, verify, copy], {download.id: downloading, verify.id: lambda _a: "ok", copy.id: copying}
    )
    assert [error for _, _, error in outcomes] == [None, None, None]
    sent = [event for event in events if event.startswith("sent")]
    for event in sent:
        for name in event.removeprefix("sent ").split(","):
            if name != "c":
                assert events.index(f"published {name}") < events.index(event), events
    assert events.index(sent[0]) < events.index("download done"), "the first file went during the download"
    assert "sent c" in events[events.index("download done") :], "c, never published, went once the verify ended"


def test_a_failed_download_fails_the_copy_behind_it_and_apply_names_the_download() -> None:
    boards = Boards()
    download = download_on()
    verify = verify_on("spark-head", download.id)
    copy = copy_to("spark-worker", "spark-head", verify.id, {"a": 1, "b": 1})
    worker_verify = verify_on("spark-worker", copy.id)

    def failing(_act: Action) -> str:
        boards.board("spark-head").publish(["a"])
        raise NodeCommandError("spark-head: Hub answered 503", "retry")

    def copying(act: Action) -> str:
        feed = boards.feed(act, "spark-head", {"a": 1, "b": 1})
        while feed.take(1) is not None:
            pass
        return "copied"

    bodies = {download.id: failing, verify.id: lambda _a: "ok", copy.id: copying, worker_verify.id: lambda _a: "ok"}
    outcomes = run_fake(boards, [download, verify, copy, worker_verify], bodies)
    errors = [error.message if error else None for _, _, error in outcomes]
    assert errors[0] == "spark-head: Hub answered 503"
    assert errors[1] is not None
    assert "not started" in errors[1]
    assert errors[2] is not None
    assert "stopped: spark-head did not get its files ready" in errors[2]
    assert errors[3] is not None
    assert "not started" in errors[3]


def test_a_chained_copy_takes_from_the_worker_before_it_and_stops_when_that_copy_fails() -> None:
    boards = Boards()
    download = download_on()
    verify = verify_on("spark-head", download.id)
    first = copy_to("spark-worker", "spark-head", verify.id, {"a": 1})
    first_verify = verify_on("spark-worker", first.id)
    second = copy_to("spark-3", "spark-worker", first_verify.id, {"a": 1})
    seen: list[str] = []

    def copy_fails(act: Action) -> str:
        boards.feed(act, "spark-head", {"a": 1}).take(1)
        raise NodeCommandError("spark-worker: rsync failed", "retry")

    def chained(act: Action) -> str:
        feed = boards.feed(act, "spark-worker", {"a": 1})
        seen.append(feed.board.node)
        feed.take(1)
        return "copied"

    bodies = {
        download.id: publishing(boards, ["a"]),
        verify.id: lambda _a: "ok",
        first.id: copy_fails,
        first_verify.id: lambda _a: "ok",
        second.id: chained,
    }
    outcomes = run_fake(boards, [download, verify, first, first_verify, second], bodies)
    assert seen == ["spark-worker"]
    assert outcomes[0][2] is None
    assert outcomes[4][2] is not None
    assert "spark-worker did not get its files ready" in outcomes[4][2].message


def test_the_reassembly_runs_alongside_the_download_and_the_verify_after_both() -> None:
    boards = Boards()
    download = download_on()
    payload = Reassemble(
        model_dir="/m",
        shards=[Shard(name=SHARD, parts=PARTS)],
        keep_parts=False,
        manifest="m",
        cache="/c",
        pipelined=True,
    )
    reassemble = action(payload, "spark-head", "create", "reassemble", "test", (download.id,))
    verify = verify_on("spark-head", reassemble.id)
    order: list[str] = []
    built = threading.Event()

    def downloading(_act: Action) -> str:
        boards.board("spark-head").publish(PARTS)
        built.wait()  # the shard is built while the download still runs
        order.append("download")
        return "ok"

    def reassembling(act: Action) -> str:
        boards.feed(act, "spark-head", dict.fromkeys(PARTS, 0)).wait_for(PARTS)
        order.append("reassemble")
        built.set()
        return "ok"

    def verifying(_act: Action) -> str:
        order.append("verify")
        return "ok"

    bodies = {
        download.id: downloading,
        reassemble.id: reassembling,
        verify.id: verifying,
    }
    outcomes = run_fake(boards, [download, reassemble, verify], bodies)
    assert [error for _, _, error in outcomes] == [None, None, None]
    assert order == ["reassemble", "download", "verify"]


# ---- the copy executor fed by a board -----------------------------------------------------------


def test_the_copy_never_sends_a_part_and_sends_a_shard_once_published(tmp_path: Path) -> None:
    head = RecordingHead()
    ctx, _ = copy_context(tmp_path, head)
    sizes = {SHARD: 300 * MIB, "config.json": 10}
    download = download_on()
    copy = copy_to("spark-worker", "spark-head", download.id, sizes, destination=str(tmp_path / "worker"))
    copy = replace(copy, payload=replace(copy.payload, bytes=2))

    def downloading(_act: Action) -> str:
        ctx.boards.board("spark-head").publish([*PARTS, "config.json", SHARD])
        return "ok"

    def run(act: Action) -> Outcome:
        try:
            if act.step is Step.COPY:
                return apply.EXECUTORS[Copy](ctx, act), 0.0, None
            return downloading(act), 0.0, None
        except ReconcilerError as error:
            return "", 0.0, error

    outcomes = run_group(ctx.boards, [download, copy], run)
    assert [error for _, _, error in outcomes] == [None, None]
    sent = [name for argv in head.argvs for name in sources_of(argv)]
    assert sorted(sent) == ["config.json", SHARD]
    assert not any(".part" in name and name.endswith(("part00", "part01")) for name in sent)


def test_a_failed_stream_stops_the_copy_behind_a_download_naming_the_worker(tmp_path: Path) -> None:
    ctx, _ = copy_context(tmp_path, RecordingHead(fail=True))
    sizes = {"a": 1, "b": 1, "c": 1}
    download = download_on()
    copy = copy_to("spark-worker", "spark-head", download.id, sizes, destination=str(tmp_path / "worker"))

    def run(act: Action) -> Outcome:
        try:
            if act.step is Step.COPY:
                return apply.EXECUTORS[Copy](ctx, act), 0.0, None
            ctx.boards.board("spark-head").publish(["a", "b", "c"])
            return "ok", 0.0, None
        except ReconcilerError as error:
            return "", 0.0, error

    outcomes = run_group(ctx.boards, [download, copy], run)
    error = outcomes[1][2]
    assert error is not None
    assert "rsync to spark-worker" in error.message


# ---- the plan and apply -------------------------------------------------------------------------


def test_a_fresh_plan_runs_the_head_staging_and_the_copy_as_one_pipelined_group() -> None:
    result = plan(reference_deployment(), empty_facts())
    groups = [
        batch for batch in apply.batches(list(result.actions)) if len(batch) > 1 and batch[0].step is not Step.PULL
    ]
    assert len(groups) == 1
    steps = {(a.step, a.node) for a in groups[0]}
    assert {(Step.DOWNLOAD, "spark-head"), (Step.REASSEMBLE, "spark-head"), (Step.COPY, "spark-worker")} <= steps
    copy = next(a for a in groups[0] if a.step is Step.COPY)
    assert isinstance(copy.payload, Copy)
    assert copy.payload.pipelined
    assert "as soon as it is complete and verified on spark-head" in copy.summary
    assert "alongside" in render_text(result)


def test_apply_raises_the_producers_failure_not_the_consumers(monkeypatch: pytest.MonkeyPatch) -> None:
    download = download_on()
    verify = verify_on("spark-head", download.id)
    copy = copy_to("spark-worker", "spark-head", verify.id, {"a": 1})

    def executor(ctx: ApplyContext, act: Action) -> str:
        if act.step is Step.DOWNLOAD:
            raise NodeCommandError("spark-head: disk full", "free space")
        feed = ctx.boards.feed(act, "spark-head", {"a": 1})
        feed.take(1)
        return "copied"

    from tests.unit.test_apply import run

    error, _ = run(monkeypatch, [download, verify, copy], executor)
    assert isinstance(error, ApplyError)
    assert "disk full" in error.message
    assert "checkpoint on spark-head" in error.message


# ---- what lands is published once verified ------------------------------------------------------


def test_a_landed_file_is_published_only_once_its_sha256_matches(tmp_path: Path) -> None:
    ctx, _ = copy_context(tmp_path, RecordingHead())
    root = tmp_path / "worker"
    root.mkdir()
    contents = {"good": b"right bytes", "bad": b"flipped bytes", "plain.json": b"{}", PARTS[0]: b"part"}
    for name, data in contents.items():
        (root / name).write_bytes(data)
    expected = {
        "good": hashlib.sha256(b"right bytes").hexdigest(),
        "bad": hashlib.sha256(b"other bytes").hexdigest(),
        PARTS[0]: hashlib.sha256(b"not checked here").hexdigest(),
    }
    cache = tmp_path / "state" / "hashcache.json"
    with checkpoint_run.Landed(ctx, "spark-worker", str(root), str(cache), expected) as landed:
        landed.add(list(contents))
    ready = ctx.boards.board("spark-worker").ready
    assert ready == {"good", "plain.json", PARTS[0]}, "a mismatch is left to the verify, which re-fetches it"
    assert f"{root}/good" in json.loads(cache.read_text()), "hashed into the cache the verify reads"


def test_the_image_travels_beside_the_checkpoint_each_on_its_own_lane_of_a_node() -> None:
    """With image_source peer the head's fetch and the workers' image copies join the
    checkpoint's group: they start at once (the head's fetch does not wait for its download),
    the image copy waits only for the fetch, and the pull from the store waits for the copy."""
    deployment = reference_deployment()
    deployment = deployment.model_copy(update={"image": deployment.image.model_copy(update={"worker_source": "peer"})})
    actions = list(plan(deployment, empty_facts()).actions)
    group = next(batch for batch in apply.batches(actions) if any(a.step is Step.DOWNLOAD for a in batch))
    assert {Step.FETCH_IMAGE, Step.COPY_IMAGE} <= {a.step for a in group}
    assert Step.PULL not in {a.step for a in group}
    started: list[str] = []
    fetch_may_end = threading.Event()

    def run(item: Action) -> Outcome:
        started.append(item.id)
        if item.step is Step.DOWNLOAD:
            # The download ends only once the fetch on the same node has begun: no lane waits for the other.
            assert fetch_may_end.wait(5), "the head's fetch waited for its download"
        if item.step is Step.FETCH_IMAGE:
            fetch_may_end.set()
        if item.step is Step.COPY_IMAGE:
            assert "image.fetch@spark-head" in started
        return ("done", 0.0, None)

    outcomes = run_group(Boards(), group, run)
    assert all(error is None for _, _, error in outcomes)


def test_a_failed_image_fetch_stops_the_image_copies_but_no_checkpoint_step() -> None:
    deployment = reference_deployment()
    deployment = deployment.model_copy(update={"image": deployment.image.model_copy(update={"worker_source": "peer"})})
    group = next(batch for batch in apply.batches(list(plan(deployment, empty_facts()).actions)) if len(batch) > 3)
    ran: list[str] = []

    def run(item: Action) -> Outcome:
        ran.append(item.id)
        if item.step is Step.FETCH_IMAGE:
            return ("", 0.0, NodeCommandError("spark-head: the registry said 429", "later"))
        return ("done", 0.0, None)

    boards = Boards()
    outcomes = dict(zip([item.id for item in group], run_group(boards, group, run), strict=True))
    assert boards.board("spark-head").failure is None, "the head's checkpoint files still go to the workers"
    assert outcomes["image.copy@spark-worker"][2] is not None, "the copy waits for the fetch it needs"
    assert "image.copy@spark-worker" not in ran
    failed = [name for name, (_, _, error) in outcomes.items() if error is not None]
    assert sorted(failed) == ["image.copy@spark-worker", "image.fetch@spark-head"], failed
