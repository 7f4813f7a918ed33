"""Build a small checkpoint shaped like `0xSero/DeepSeek-V4.1-Flash-Spark`, for the stand-in Hub to serve.

TEST STAND-IN, not part of the product: the weights are deterministic pseudo-random bytes, not a model.
The *shape* follows the real repo and what the reference download and launcher expect of it:

- `config.json`, `model.safetensors.index.json` whose `weight_map` names six shards
  `model-0000N-of-00006.safetensors`; every shard is a valid safetensors file
  (8-byte little-endian header length, JSON header, data);
- shards 5 and 6 exist in the repo *only* as `…safetensors.partNN` pieces (the real repo splits them because
  of the Hub's 50 GB per-file limit); concatenating the parts gives the native shard;
- `reassemble.sh` cats the parts into the shards and sha256-checks them against `sha256-manifest.txt`
  (`sha256sum` format, all six native shards);
- EXL3 banks `exl3/qn`, `exl3/q31`, `exl3/q31s` with `L??.part.safetensors` files and
  `exl3/plan/J268-ho-v31-K5n.json` whose `qdir` is a colon list of bank paths.

`config.json` carries `"checkpoint_tag"` (default "A") so that a test can tell revisions apart from what an
engine loaded. `build_revision(base, out)` derives a second commit ("B") from a built one, the way a model
repo's next commit looks: exactly one native shard among 1-4 (default `model-00003-of-00006.safetensors`)
holds other data of the same size (same safetensors header, so `model.safetensors.index.json` stays valid and
byte-identical), `config.json` says `"checkpoint_tag": "B"`, and `sha256-manifest.txt` names the new shard
hash; every other file is a hardlink to the base's (byte-identical, no extra disk).

Output layout: `<out>/repo/…` holds the repo files, `<out>/standin-index.json` the `RepoInfo`
(pinned commit, per-file size, git blob id, sha256, LFS flag) that `serve` loads.
"""

from __future__ import annotations

import fnmatch
import hashlib
import itertools
import json
import os
import shutil
import struct
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .repo import (
    DEFAULT_REPO_ID,
    FILES_DIR,
    INDEX_NAME,
    RepoFile,
    RepoInfo,
    compute_commit,
    describe_file,
    load_repo_info,
    save_repo_info,
)

MIB = 1 << 20
SHARD_COUNT = 6
PARTED_SHARDS = (5, 6)
# Shards 5 and 6 are the big ones in the real checkpoint (that is why only they are split).
BIG_SHARD_FACTOR = 1.5
LAYERS_PER_SHARD = 2
BANKS = ("qn", "q31", "q31s")
BANK_LAYERS = 3
BANK_FILE_BYTES = 32 * 1024
PLAN_NAME = "J268-ho-v31-K5n.json"
MANIFEST_NAME = "sha256-manifest.txt"
CONFIG_NAME = "config.json"
INDEX_JSON_NAME = "model.safetensors.index.json"
DEFAULT_TAG = "A"
REVISION_TAG = "B"
REVISION_SHARD = 3  # the shard `build_revision` regenerates by default
# What the Hub stores through LFS: matched by .gitattributes, or simply large.
LFS_PATTERNS = ("*.safetensors", "*.safetensors.part[0-9][0-9]")
LFS_SIZE_THRESHOLD = MIB
MAX_PARTS = 100  # the part suffix has two digits
_BLOCK = MIB

REASSEMBLE_SH = """#!/usr/bin/env bash
# Rebuild shards 5 and 6 from their .partNN pieces, then sha256-check them (test stand-in of the real script).
set -euo pipefail
cd "$(dirname "$0")"
for n in 5 6; do
  shard="model-0000${n}-of-00006.safetensors"
  if [ -f "$shard" ] && grep -E " ${shard}\\$" sha256-manifest.txt | sha256sum -c --status -; then
    echo "$shard: already assembled"
    continue
  fi
  cat "$shard".part[0-9][0-9] > "$shard.tmp"
  mv "$shard.tmp" "$shard"
done
grep -E 'model-0000[56]-of-00006\\.safetensors$' sha256-manifest.txt | sha256sum -c -
"""

GITATTRIBUTES = "".join(f"{pattern} filter=lfs diff=lfs merge=lfs -text\n" for pattern in LFS_PATTERNS)

README = """---
license: other
---
# DeepSeek-V4.1-Flash-Spark (test stand-in)

Pseudo-random bytes shaped like the real checkpoint, built by spark-reconciler's tests
(`python3 -m tests.testbed.hub build`). Not a model.
"""


@dataclass(frozen=True)
class Tensor:
    name: str
    dtype: str
    shape: tuple[int, ...]
    nbytes: int


def shard_name(n: int) -> str:
    return f"model-{n:05d}-of-{SHARD_COUNT:05d}.safetensors"


def part_name(shard: str, index: int) -> str:
    return f"{shard}.part{index:02d}"


def is_lfs(path: str, size: int) -> bool:
    name = path.rsplit("/", 1)[-1]
    return size > LFS_SIZE_THRESHOLD or any(fnmatch.fnmatch(name, p) for p in LFS_PATTERNS)


def random_blocks(seed: int, label: str, nbytes: int) -> Iterator[bytes]:
    """Deterministic pseudo-random bytes, stable across Python versions and platforms (SHAKE-256 per block)."""
    index = 0
    while nbytes > 0:
        size = min(_BLOCK, nbytes)
        yield hashlib.shake_256(f"{seed}:{label}:{index}".encode()).digest(size)
        nbytes -= size
        index += 1


def _bf16(name: str, nbytes: int) -> Tensor:
    return Tensor(name, "BF16", (nbytes // 256, 128), nbytes)


def _u8(name: str, nbytes: int) -> Tensor:
    return Tensor(name, "U8", (nbytes,), nbytes)


def shard_tensors(n: int, data_bytes: int) -> list[Tensor]:
    """Tensor names of shard `n`, sized to fill `data_bytes`; the last (U8) tensor takes the remainder."""
    names = [f"model.layers.{layer}.{kind}" for layer in _shard_layers(n) for kind in ("self_attn.wq.weight", "ffn.w")]
    if n == 1:
        names.insert(0, "model.embed.weight")
    if n == SHARD_COUNT:
        names.append("lm_head.weight")
    each = max(256, data_bytes // len(names) // 256 * 256)
    tensors = [_bf16(name, each) for name in names[:-1]]
    tensors.append(_u8(names[-1], max(1, data_bytes - each * (len(names) - 1))))
    return tensors


def _shard_layers(n: int) -> range:
    return range((n - 1) * LAYERS_PER_SHARD, n * LAYERS_PER_SHARD)


def safetensors_header(tensors: list[Tensor], metadata: dict[str, str]) -> bytes:
    """`<u64 little-endian length><JSON header>`, header space-padded to 8 bytes as the safetensors writer does."""
    header: dict[str, Any] = {"__metadata__": metadata}
    offset = 0
    for t in tensors:
        header[t.name] = {"dtype": t.dtype, "shape": list(t.shape), "data_offsets": [offset, offset + t.nbytes]}
        offset += t.nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw


def safetensors_chunks(tensors: list[Tensor], seed: int, label: str) -> Iterator[bytes]:
    yield safetensors_header(tensors, {"format": "pt", "standin": "spark-reconciler test checkpoint"})
    yield from random_blocks(seed, label, sum(t.nbytes for t in tensors))


def write_file(path: Path, chunks: Iterable[bytes]) -> str:
    """Write chunks to `path`; return the sha256 of what was written."""
    digest = hashlib.sha256()
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("wb") as out:
        for chunk in chunks:
            digest.update(chunk)
            out.write(chunk)
    return digest.hexdigest()


def _split(chunks: Iterable[bytes], part_bytes: int, digest: hashlib._Hash) -> Iterator[tuple[int, memoryview]]:
    """(part index, piece) pairs cutting the stream every `part_bytes`; feeds `digest` the whole stream."""
    offset = 0
    for chunk in chunks:
        digest.update(chunk)
        view = memoryview(chunk)
        while view:
            take = min(part_bytes - offset % part_bytes, len(view))
            yield offset // part_bytes, view[:take]
            offset, view = offset + take, view[take:]


def write_parts(base: Path, chunks: Iterable[bytes], part_bytes: int) -> str:
    """Split the stream into `<base>.part00`, `.part01`, … of `part_bytes` each; return the whole stream's sha256."""
    digest = hashlib.sha256()
    for index, pieces in itertools.groupby(_split(chunks, part_bytes, digest), key=lambda pair: pair[0]):
        with base.with_name(part_name(base.name, index)).open("wb") as out:
            for _, piece in pieces:
                out.write(piece)
    return digest.hexdigest()


def _shard_bytes(n: int, shard_mib: float) -> int:
    factor = BIG_SHARD_FACTOR if n in PARTED_SHARDS else 1.0
    return max(4096, int(shard_mib * factor * MIB))


def _write_shards(files: Path, shard_mib: float, part_bytes: int, seed: int) -> tuple[dict[str, str], dict[str, str]]:
    """Write the six shards (5 and 6 as parts only). Returns (shard -> sha256, tensor -> shard)."""
    manifest: dict[str, str] = {}
    weight_map: dict[str, str] = {}
    for n in range(1, SHARD_COUNT + 1):
        name = shard_name(n)
        tensors = shard_tensors(n, _shard_bytes(n, shard_mib))
        weight_map.update(dict.fromkeys((t.name for t in tensors), name))
        chunks = safetensors_chunks(tensors, seed, name)
        if n in PARTED_SHARDS:
            manifest[name] = write_parts(files / name, chunks, part_bytes)
        else:
            manifest[name] = write_file(files / name, chunks)
    return manifest, weight_map


def _write_banks(files: Path, seed: int) -> None:
    for bank in BANKS:
        for layer in range(BANK_LAYERS):
            rel = f"exl3/{bank}/L{layer:02d}.part.safetensors"
            tensors = [_u8(f"model.layers.{layer}.ffn.exl3.{bank}.trellis", BANK_FILE_BYTES)]
            write_file(files / rel, safetensors_chunks(tensors, seed, rel))


def plan_document() -> dict[str, Any]:
    banks = ":".join(f"/home/build/exl3/{bank}" for bank in BANKS)
    return {
        "name": PLAN_NAME.removesuffix(".json"),
        "qdir": banks,
        "layers": SHARD_COUNT * LAYERS_PER_SHARD,
        "bank_of_layer": {str(layer): BANKS[layer % len(BANKS)] for layer in range(SHARD_COUNT * LAYERS_PER_SHARD)},
        "head_bits": 6,
        "standin": True,
    }


def config_document(tag: str | None = DEFAULT_TAG) -> dict[str, Any]:
    """The repo's `config.json`; `checkpoint_tag` names the revision (the engine stand-in reports it)."""
    document: dict[str, Any] = {
        "architectures": ["DeepseekV4ForCausalLM"],
        "model_type": "deepseek_v4",
        "num_hidden_layers": SHARD_COUNT * LAYERS_PER_SHARD,
        "torch_dtype": "bfloat16",
        "standin": "spark-reconciler test checkpoint; not a model",
    }
    if tag is not None:
        document["checkpoint_tag"] = tag
    return document


def _write_json(path: Path, document: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def manifest_text(manifest: dict[str, str]) -> str:
    """`sha256sum` lines, sorted by shard name."""
    return "".join(f"{sha}  {name}\n" for name, sha in sorted(manifest.items()))


def read_manifest(path: Path) -> dict[str, str]:
    """shard name -> sha256 of a `sha256-manifest.txt`."""
    pairs = (line.split("  ", 1) for line in path.read_text(encoding="utf-8").splitlines() if line.strip())
    return {name: sha for sha, name in pairs}


def _write_metadata(
    files: Path, manifest: dict[str, str], weight_map: dict[str, str], total: int, tag: str | None
) -> None:
    _write_json(files / CONFIG_NAME, config_document(tag))
    _write_json(files / INDEX_JSON_NAME, {"metadata": {"total_size": total}, "weight_map": weight_map})
    (files / MANIFEST_NAME).write_text(manifest_text(manifest))
    (files / "reassemble.sh").write_text(REASSEMBLE_SH)
    (files / "reassemble.sh").chmod(0o755)
    (files / ".gitattributes").write_text(GITATTRIBUTES)
    (files / "README.md").write_text(README)
    _write_json(files / "exl3" / "plan" / PLAN_NAME, plan_document())


def describe_repo(repo_id: str, files: Path) -> RepoInfo:
    paths = sorted(p.relative_to(files).as_posix() for p in files.rglob("*") if p.is_file())
    described: list[RepoFile] = []
    for path in paths:
        size = (files / path).stat().st_size
        described.append(describe_file(files, path, lfs=is_lfs(path, size)))
    return RepoInfo(repo_id=repo_id, commit=compute_commit(repo_id, described), files=tuple(described), files_dir=files)


def _check_sizes(shard_mib: float, part_mib: float) -> int:
    if shard_mib <= 0 or part_mib <= 0:
        raise ValueError(f"shard_mib and part_mib must be positive (got {shard_mib}, {part_mib})")
    part_bytes = int(part_mib * MIB)
    biggest = max(_shard_bytes(n, shard_mib) for n in PARTED_SHARDS) + 64 * 1024
    if biggest // part_bytes >= MAX_PARTS:
        raise ValueError(f"part_mib={part_mib} would split a shard into more than {MAX_PARTS} parts")
    return part_bytes


def build_checkpoint(
    out: Path,
    shard_mib: float = 4.0,
    part_mib: float = 2.5,
    seed: int = 0,
    repo_id: str = DEFAULT_REPO_ID,
    tag: str | None = DEFAULT_TAG,
) -> RepoInfo:
    """Write the checkpoint under `out/repo`, its index to `out/standin-index.json`, and return its `RepoInfo`.

    Shards 1-4 are `shard_mib` MiB of tensor data, shards 5-6 are 1.5x that and split every `part_mib` MiB.
    `config.json` gets `"checkpoint_tag": tag` (left out when `tag` is None).
    Rebuilding replaces `out/repo` and the index (nothing else in `out` is touched).
    """
    part_bytes = _check_sizes(shard_mib, part_mib)
    files = _fresh_output(out)
    manifest, weight_map = _write_shards(files, shard_mib, part_bytes, seed)
    total = sum(t.nbytes for n in range(1, SHARD_COUNT + 1) for t in shard_tensors(n, _shard_bytes(n, shard_mib)))
    _write_banks(files, seed)
    _write_metadata(files, manifest, weight_map, total, tag)
    info = describe_repo(repo_id, files)
    save_repo_info(out, info)
    return info


def _fresh_output(out: Path) -> Path:
    files = out / FILES_DIR
    if files.exists():
        shutil.rmtree(files)
    (out / INDEX_NAME).unlink(missing_ok=True)
    files.mkdir(parents=True)
    return files


def _link_or_copy(source: Path, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(source, target)
    except OSError:  # another file system, or links not allowed: a copy is byte-identical too
        shutil.copy2(source, target)


def _regenerate_shard(source: Path, target: Path, label: str) -> str:
    """Same safetensors header and size as `source`, other tensor data; returns the new sha256."""
    with source.open("rb") as stream:
        prefix = stream.read(8)
        (header_len,) = struct.unpack("<Q", prefix)
        header = prefix + stream.read(header_len)
    data_bytes = source.stat().st_size - len(header)
    return write_file(target, itertools.chain([header], random_blocks(0, label, data_bytes)))


def build_revision(base: Path, out: Path, *, tag: str = REVISION_TAG, shard: int = REVISION_SHARD) -> RepoInfo:
    """Derive the next commit of the checkpoint built in `base`, write it like `build_checkpoint` into `out`.

    It differs from the base in exactly three repo files: native shard `shard` (1-4: a shard that exists
    whole, not as parts) regenerated with other data of the same size and header, `config.json` with
    `"checkpoint_tag": tag`, and `sha256-manifest.txt` with the new shard's hash. Every other file is
    hardlinked from the base (copied if a link is impossible), so it is byte-identical.
    `model.safetensors.index.json` is one of those: the shard's tensors keep their names and sizes.
    Reproducible: the same base and arguments give the same bytes and commit. `out` must not be `base`.
    """
    if shard in PARTED_SHARDS or not 1 <= shard <= SHARD_COUNT:
        whole = [n for n in range(1, SHARD_COUNT + 1) if n not in PARTED_SHARDS]
        raise ValueError(f"shard must be one of the whole shards {whole}, not {shard}")
    if out.resolve() == base.resolve():
        raise ValueError(f"build_revision needs an output directory other than its base {base}")
    base_info = load_repo_info(base)
    name = shard_name(shard)
    base_file = base_info.file(name)
    if base_file is None:
        raise ValueError(f"{base} has no {name}")
    changed = {name, CONFIG_NAME, MANIFEST_NAME}
    files = _fresh_output(out)
    kept: list[RepoFile] = []
    for f in base_info.files:
        if f.path not in changed:
            _link_or_copy(base_info.local_path(f), files / f.path)
            kept.append(f)
    new_sha = _regenerate_shard(base_info.local_path(base_file), files / name, f"revision {tag} of {base_file.sha256}")
    config = json.loads((base_info.files_dir / CONFIG_NAME).read_text(encoding="utf-8"))
    config["checkpoint_tag"] = tag
    _write_json(files / CONFIG_NAME, config)
    manifest = read_manifest(base_info.files_dir / MANIFEST_NAME)
    manifest[name] = new_sha
    (files / MANIFEST_NAME).write_text(manifest_text(manifest))
    described = kept + [describe_file(files, path, lfs=is_lfs(path, (files / path).stat().st_size)) for path in changed]
    described.sort(key=lambda f: f.path)
    repo_id = base_info.repo_id
    info = RepoInfo(repo_id=repo_id, commit=compute_commit(repo_id, described), files=tuple(described), files_dir=files)
    save_repo_info(out, info)
    return info
