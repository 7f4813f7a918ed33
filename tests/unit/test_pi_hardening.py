"""Pi's config stays whole: odd files are refused with a located error before anything is written,
and the files we do edit keep every byte outside our provider (CRLF, a byte-order mark, symlinks)."""

from __future__ import annotations

import errno
import json
import os
import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType

import pytest

from reconciler.errors import PiConfigError
from reconciler.facts.pi import gather_pi
from reconciler.pi import agent as pi_agent
from reconciler.pi import config as pi_config
from reconciler.pi import files as pi_files
from reconciler.pi import jsonc
from reconciler.pi.agent import package_of
from reconciler.pi.config import MODELS, SETTINGS
from tests.unit.test_pi_config import EXISTING_MODELS, EXISTING_SETTINGS, PROVIDER, REF, target

CRLF_MODELS = EXISTING_MODELS.replace("\n", "\r\n").encode()
CRLF_SETTINGS = EXISTING_SETTINGS.replace("\n", "\r\n").encode()


def snapshot(root: Path) -> dict[str, bytes | str]:
    """Every entry under root: a file's bytes, a link's target, or a kind; what 'nothing written' compares."""
    entries: dict[str, bytes | str] = {}
    for path in sorted(root.rglob("*")):
        name = str(path.relative_to(root))
        if path.is_symlink():
            entries[name] = "-> " + os.readlink(path)
        elif path.is_file():
            entries[name] = path.read_bytes()
        else:
            entries[name] = "dir" if path.is_dir() else "special"
    return entries


def install_into(directory: Path, set_default: bool = False) -> list[str]:
    changes = pi_config.install_changes(pi_files.read_files(directory, PROVIDER), target(set_default=set_default))
    return pi_files.write_changes(directory, changes, PROVIDER, stamp="20261129-210000")


def uninstall_from(directory: Path) -> None:
    changes = pi_config.uninstall_changes(pi_files.read_files(directory, PROVIDER), PROVIDER)
    pi_files.write_changes(directory, changes, PROVIDER, stamp="20261129-220000")


def inserted(before: bytes, after: bytes) -> bytes:
    """What an edit put in, asserting it only inserted: the bytes before and after stay as they were."""
    prefix = 0
    while prefix < min(len(before), len(after)) and before[prefix] == after[prefix]:
        prefix += 1
    suffix = 0
    while suffix < len(before) - prefix and before[-1 - suffix] == after[-1 - suffix]:
        suffix += 1
    assert prefix + suffix == len(before), "bytes outside the inserted text changed"
    return after[prefix : len(after) - suffix]


def bare_lf(data: bytes) -> int:
    return data.count(b"\n") - data.count(b"\r\n")


@pytest.fixture
def permissions_apply(monkeypatch: pytest.MonkeyPatch) -> None:
    """Root writes anywhere; as root, judge access by the owner's mode bits as for the owner."""
    if os.geteuid() != 0:
        return

    def owner_access(path: str | os.PathLike[str], mode: int, **_: object) -> bool:
        try:
            bits = (os.stat(path).st_mode >> 6) & 0o7
        except OSError:
            return False
        return bits & mode == mode

    monkeypatch.setattr(os, "access", owner_access)


@pytest.fixture
def read_only_dirs() -> Iterator[Callable[[Path], None]]:
    """chmod a-w, undone afterwards so tmp_path can be cleaned up."""
    made: list[Path] = []

    def make(path: Path) -> None:
        path.chmod(0o555)
        made.append(path)

    yield make
    for path in made:
        path.chmod(0o755)


# --- CRLF and a byte-order mark: every other byte stays ---------------------------------------------


def test_a_crlf_models_json_stays_crlf_byte_for_byte_outside_our_entry(tmp_path: Path) -> None:
    (tmp_path / MODELS).write_bytes(CRLF_MODELS)
    install_into(tmp_path)
    after = (tmp_path / MODELS).read_bytes()
    added = inserted(CRLF_MODELS, after)
    assert f'"{PROVIDER}"'.encode() in added
    assert bare_lf(after) == 0
    assert jsonc.loads(after.decode())["providers"][PROVIDER] == pi_config.provider_entry(target())
    uninstall_from(tmp_path)
    assert (tmp_path / MODELS).read_bytes() == CRLF_MODELS


@pytest.mark.parametrize("set_default", [False, True])
def test_a_crlf_settings_json_stays_crlf_and_uninstall_restores_it(tmp_path: Path, set_default: bool) -> None:
    (tmp_path / MODELS).write_bytes(CRLF_MODELS)
    (tmp_path / SETTINGS).write_bytes(CRLF_SETTINGS)
    install_into(tmp_path, set_default)
    settings = (tmp_path / SETTINGS).read_bytes()
    assert bare_lf(settings) == 0
    assert REF in json.loads(settings)["enabledModels"]
    uninstall_from(tmp_path)
    assert ((tmp_path / MODELS).read_bytes(), (tmp_path / SETTINGS).read_bytes()) == (CRLF_MODELS, CRLF_SETTINGS)


def test_a_byte_order_mark_is_kept_as_pi_1_6_reads_it(tmp_path: Path) -> None:
    original = b"\xef\xbb\xbf" + EXISTING_MODELS.encode()
    (tmp_path / MODELS).write_bytes(original)
    install_into(tmp_path)
    after = (tmp_path / MODELS).read_bytes()
    assert after.startswith(b"\xef\xbb\xbf{")
    assert f'"{PROVIDER}"'.encode() in inserted(original, after)
    uninstall_from(tmp_path)
    assert (tmp_path / MODELS).read_bytes() == original


# --- read-only and symlinked targets: found before the first byte ------------------------------------


@pytest.mark.usefixtures("permissions_apply")
def test_a_symlink_into_a_read_only_directory_is_refused_before_anything_is_written(
    tmp_path: Path, read_only_dirs: Callable[[Path], None]
) -> None:
    dotfiles, agent = tmp_path / "dotfiles", tmp_path / "agent"
    dotfiles.mkdir()
    agent.mkdir()
    (dotfiles / MODELS).write_text(EXISTING_MODELS, encoding="utf-8")
    (agent / MODELS).symlink_to(dotfiles / MODELS)
    read_only_dirs(dotfiles)
    before = snapshot(tmp_path)
    with pytest.raises(PiConfigError) as caught:
        install_into(agent)
    assert f"directory {dotfiles} is not writable" in caught.value.message
    assert "Nothing was written" in caught.value.hint
    assert snapshot(tmp_path) == before


@pytest.mark.usefixtures("permissions_apply")
@pytest.mark.parametrize("where", ["the Pi dir", "extensions", "models.json itself"])
def test_a_read_only_target_is_refused_before_anything_is_written(
    tmp_path: Path, read_only_dirs: Callable[[Path], None], where: str
) -> None:
    (tmp_path / MODELS).write_text(EXISTING_MODELS, encoding="utf-8")
    (tmp_path / "extensions").mkdir()
    if where == "models.json itself":
        (tmp_path / MODELS).chmod(0o444)
        expected = f"{tmp_path / MODELS} is read-only"
    else:
        locked = tmp_path if where == "the Pi dir" else tmp_path / "extensions"
        read_only_dirs(locked)
        expected = f"directory {locked} is not writable"
    before = snapshot(tmp_path)
    with pytest.raises(PiConfigError) as caught:
        install_into(tmp_path)
    assert expected in caught.value.message
    assert snapshot(tmp_path) == before


@pytest.mark.usefixtures("permissions_apply")
def test_pi_install_checks_the_config_before_installing_pi(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, read_only_dirs: Callable[[Path], None]
) -> None:
    monkeypatch.setenv("PI_CODING_AGENT_DIR", str(tmp_path))
    read_only_dirs(tmp_path)

    def no_npm() -> pi_agent.PiAgent:
        raise AssertionError("Pi was installed although the config cannot be written")

    monkeypatch.setattr(pi_agent, "ensure_pi", no_npm)
    with pytest.raises(PiConfigError, match="is not writable"):
        pi_agent.install(target())
    assert snapshot(tmp_path) == {}


def test_a_symlink_to_a_writable_file_is_written_through_and_kept(tmp_path: Path) -> None:
    dotfiles, agent = tmp_path / "dotfiles", tmp_path / "agent"
    dotfiles.mkdir()
    agent.mkdir()
    (dotfiles / MODELS).write_bytes(CRLF_MODELS)
    (agent / MODELS).symlink_to(dotfiles / MODELS)
    (backup,) = install_into(agent)
    assert (agent / MODELS).is_symlink()
    assert Path(backup).read_bytes() == CRLF_MODELS
    assert f'"{PROVIDER}"'.encode() in inserted(CRLF_MODELS, (dotfiles / MODELS).read_bytes())


def test_a_dangling_symlink_is_refused_and_nothing_is_written(tmp_path: Path) -> None:
    (tmp_path / MODELS).symlink_to(tmp_path / "gone.json")
    before = snapshot(tmp_path)
    with pytest.raises(PiConfigError) as caught:
        install_into(tmp_path)
    assert f"{tmp_path / MODELS} is a symbolic link to {str(tmp_path / 'gone.json')!r}" in caught.value.message
    assert snapshot(tmp_path) == before


def test_a_link_that_dangles_by_write_time_is_refused_by_the_check(tmp_path: Path) -> None:
    (tmp_path / "real.json").write_text(EXISTING_MODELS, encoding="utf-8")
    (tmp_path / MODELS).symlink_to(tmp_path / "real.json")
    changes = pi_config.install_changes(pi_files.read_files(tmp_path, PROVIDER), target())
    (tmp_path / "real.json").unlink()
    before = snapshot(tmp_path)
    with pytest.raises(PiConfigError, match="leads nowhere"):
        pi_files.write_changes(tmp_path, changes, PROVIDER)
    assert snapshot(tmp_path) == before


def test_a_dangling_extensions_link_is_refused_by_the_check(tmp_path: Path) -> None:
    (tmp_path / MODELS).write_text(EXISTING_MODELS, encoding="utf-8")
    (tmp_path / "extensions").symlink_to(tmp_path / "gone")
    before = snapshot(tmp_path)
    with pytest.raises(PiConfigError, match="leads nowhere"):
        install_into(tmp_path)
    assert snapshot(tmp_path) == before


def test_uninstall_removes_a_symlinked_extension_link_not_the_file_it_points_to(tmp_path: Path) -> None:
    install_into(tmp_path)
    extension = tmp_path / pi_config.extension_file(PROVIDER)
    kept = tmp_path / "dotfiles.ts"
    extension.rename(kept)
    extension.symlink_to(kept)
    uninstall_from(tmp_path)
    assert not os.path.lexists(extension)
    assert kept.read_text(encoding="utf-8") == pi_config.extension_text(PROVIDER, pi_config.DEFAULT_KEY_ENV)


def test_a_write_failing_after_the_check_is_an_error_not_a_traceback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def full(path: Path, text: str) -> None:
        del text
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))

    monkeypatch.setattr(pi_files, "_atomic_write", full)
    with pytest.raises(PiConfigError, match="No space left on device") as caught:
        install_into(tmp_path)
    assert "every file is whole" in caught.value.hint


# --- odd input: a located error, never a traceback, never a write -----------------------------------


def _fifo(path: Path) -> None:
    os.mkfifo(path)


def _huge(path: Path) -> None:
    with path.open("wb") as out:
        out.truncate(pi_files.MAX_FILE_BYTES + 1)  # sparse: size without the disk


ODD_FILES: dict[str, tuple[Callable[[Path], object], str]] = {
    "not UTF-8": (lambda p: p.write_bytes(b'{\n  "a": "\xff"\n}\n'), ":2: not UTF-8 text (byte 0xff at offset 10)"),
    "a NUL byte": (lambda p: p.write_bytes(b'{\n  "a": 1\x00\n}\n'), ":2:9: a NUL byte"),
    "a directory": (lambda p: p.mkdir(), " is a directory, not a file"),
    "a FIFO": (_fifo, " is a FIFO (named pipe), not a file"),
    "huge": (_huge, f" is larger than {pi_files.MAX_FILE_BYTES // 2**20} MiB"),
    "deeply nested": (lambda p: p.write_text('{"a": ' + "[" * 10000 + "]" * 10000 + "}"), ":1:"),
    "a huge integer": (lambda p: p.write_text('{\n  "a": ' + "1" * 5000 + "\n}"), ":2:8: an integer of 5000 digits"),
}


def _alarm(signum: int, frame: FrameType | None) -> None:
    del signum, frame
    raise TimeoutError("reading the file hung")


@pytest.fixture
def no_hang() -> Iterator[None]:
    previous = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(10)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


@pytest.mark.usefixtures("no_hang")
@pytest.mark.parametrize("name", [MODELS, SETTINGS])
@pytest.mark.parametrize("kind", sorted(ODD_FILES))
def test_an_odd_file_is_a_located_error_and_nothing_is_written(tmp_path: Path, name: str, kind: str) -> None:
    make, where = ODD_FILES[kind]
    make(tmp_path / name)
    before = snapshot(tmp_path)
    with pytest.raises(PiConfigError) as caught:
        install_into(tmp_path)
    assert f"{tmp_path / name}{where}" in caught.value.message
    assert "nothing was written" in caught.value.hint
    assert snapshot(tmp_path) == before


@pytest.mark.usefixtures("no_hang")
@pytest.mark.parametrize("kind", sorted(ODD_FILES))
def test_facts_turn_an_odd_file_into_an_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str) -> None:
    make, where = ODD_FILES[kind]
    make(tmp_path / MODELS)
    monkeypatch.setenv("PI_CODING_AGENT_DIR", str(tmp_path))
    facts = gather_pi(PROVIDER)
    assert facts.error is not None
    assert f"{tmp_path / MODELS}{where}" in facts.error


def test_facts_turn_a_dangling_symlink_into_an_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / SETTINGS).symlink_to(tmp_path / "gone.json")
    monkeypatch.setenv("PI_CODING_AGENT_DIR", str(tmp_path))
    assert "leads nowhere" in (gather_pi(PROVIDER).error or "")


def test_a_pi_dir_under_an_unknown_users_home_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PI_CODING_AGENT_DIR", "~no-such-user-here/pi")
    with pytest.raises(PiConfigError, match="names no home directory"):
        pi_files.agent_dir()
    facts = gather_pi(PROVIDER)
    assert facts.directory == "~no-such-user-here/pi"
    assert "names no home directory" in (facts.error or "")


def test_a_deeply_nested_package_json_names_no_package(tmp_path: Path) -> None:
    (tmp_path / "dist").mkdir()
    (tmp_path / "dist" / "cli.js").write_text("", encoding="utf-8")
    (tmp_path / "package.json").write_text("[" * 100000 + "]" * 100000, encoding="utf-8")
    assert package_of(tmp_path / "dist" / "cli.js") is None
