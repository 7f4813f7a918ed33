"""The desired state of a deployment, and how it is read from YAML.

Every default here is a value known to serve the model on two Sparks with the default image
(docs/sources.md says where they come from), so a spec that names only the nodes is complete.
The model is strict: an unknown key is an error, not a silently ignored typo, because a typo
in a serving flag would otherwise cost a 12-minute restart to discover.

Problems are reported with file:line:column, the field path and a hint, never a traceback.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
from typing import Annotated, Any, Literal, get_args, get_origin

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
)
from pydantic_core import PydanticCustomError

from reconciler.constants import DEFAULT_SPEC_PATH, SPEC_PATH_ENV
from reconciler.errors import SpecError, SpecProblem, UntrustedTextError, YamlError
from reconciler.record import Record
from reconciler.safeio import read_untrusted_text
from reconciler.yamlpos import LocatedDocument, load_located

REFERENCE_IMAGE = (
    "ghcr.io/0xsero/deepseek-v4.1-flash-spark@sha256:5668e35e5ee021da4b9ce88a1964caf0e082e8ca01d81d1d64b6213a55c6add5"
)

# The container environment both ranks get by default, minus the values that
# are derived per node (fabric, GID index, EXL3 plan path): those are computed, never typed.
REFERENCE_ENV: dict[str, str] = {
    "CUDA_VISIBLE_DEVICES": "0",
    "CUTE_DSL_ARCH": "sm_121a",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_WORKER_MULTIPROC_METHOD": "spawn",
    "VLLM_USE_V2_MODEL_RUNNER": "1",
    "VLLM_USE_BREAKABLE_CUDAGRAPH": "0",
    "VLLM_USE_FLASHINFER_SAMPLER": "1",
    "VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS": "1",
    "VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1",
    "OMP_NUM_THREADS": "16",
    "MALLOC_ARENA_MAX": "2",
    "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
    "SAFETENSORS_FAST_GPU": "1",
    "VLLM_ENABLE_PCIE_ALLREDUCE": "0",
    "NCCL_IB_DISABLE": "0",
    "NCCL_NET_PLUGIN": "none",
    "NCCL_IB_MERGE_NICS": "1",
    "NCCL_DEBUG": "WARN",
    "VLLM_ENABLE_ROCE_ALLREDUCE": "1",
    "VLLM_ROCE_ALLREDUCE_MAX_SIZE": "2MB",
    "VLLM_ROCE_ALLGATHER_MAX_SIZE": "16MB",
    "B12X_ROCE_CACHE_DIR": "/cache/b12x-roce",
    "B12X_ROCE_TRAFFIC_CLASS": "106",
    "NCCL_IB_TC": "106",
    "B12X_COMPILE_CACHE_DIR": "/cache/b12x",
    "XDG_CACHE_HOME": "/cache",
    "ST_EXL3_PREFILL": "st",
    "ST_EXL3_PREFILL_MIN_ROWS": "1",
}

# Set by the reconciler from fabric facts and the spec; typing them by hand is how
# two-Spark setups end up binding NCCL to Wi-Fi, so the spec refuses them.
DERIVED_ENV = {
    "VLLM_HOST_IP": "nodes[].fabric.ip",
    "NCCL_SOCKET_IFNAME": "nodes[].fabric.ifname",
    "GLOO_SOCKET_IFNAME": "nodes[].fabric.ifname",
    "NCCL_IB_HCA": "nodes[].fabric.hcas",
    "NCCL_IB_GID_INDEX": "nodes[].fabric.gid_index",
    "ST_EXL3_PLAN": "model.exl3_plan",
    "VLLM_API_KEY": "api.key_file",
}

# Pattern strings, not compiled objects: `re` compiles each on first use (and caches it), so a
# command that never validates that field never pays for it.
_NAME_RE = r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$"
_IFNAME_RE = r"^[A-Za-z0-9_.:-]{1,15}$"
_HCA_RE = r"^[A-Za-z0-9_]{1,64}$"
_ENV_RE = r"^[A-Za-z_][A-Za-z0-9_]*$"
_REPO_RE = r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$"
_HOST_RE = r"^[A-Za-z0-9]([A-Za-z0-9.-]{0,252})$"
_DIGEST_RE = r"@sha256:[0-9a-f]{64}$"
_COMMIT_RE = r"^[0-9a-f]{40}$"
_SIZE_RE = r"^[1-9][0-9]{0,15}[bkmg]?$"
_FILE_NAME_RE = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,254}$"
_USER_RE = r"^[A-Za-z_][A-Za-z0-9_.-]{0,31}$"
_REVISION_RE = r"^[A-Za-z0-9._/-]{1,255}$"
_IMAGE_RE = r"^[a-z0-9][A-Za-z0-9._/:@-]{0,511}$"
MAX_PATH = 1024
MAX_ARG = 256
MAX_TEXT = 4096
# Sizes that make sense on a Spark: one node has 128 GB of memory; nobody runs 64 of them.
MAX_NODES = 64
GIB = 1024**3


def _problem(kind: str, message: str, hint: str, **context: object) -> PydanticCustomError:
    return PydanticCustomError(kind, message, {"hint": hint.format(**context), **context})


def _check_name(value: str) -> str:
    if not re.match(_NAME_RE, value):
        raise _problem(
            "name",
            "'{value}' is not a valid name",
            "use 1-63 lowercase letters, digits and '-', starting and ending with a letter or digit",
            value=value,
        )
    return value


def _check_host_path(value: str) -> str:
    if not (value.startswith("/") or value == "~" or value.startswith("~/")):
        raise _problem(
            "path",
            "'{value}' is not an absolute path",
            "write an absolute path (/data/models/...) or one under the node's home (~/...)",
            value=value,
        )
    if any(not char.isprintable() for char in value):
        raise _problem("path", "the path holds a control character", "remove it", value=value)
    if any(char in value for char in "'\"\\"):
        raise _problem(
            "path",
            "'{value}' holds a quote or a backslash",
            "rename the directory, or point the spec at a symlink without them (ssh and systemd read them differently)",
            value=value,
        )
    if ":" in value:
        raise _problem(
            "path",
            "'{value}' holds ':', which Docker reads as the end of a bind mount's source",
            "rename the directory, or point the spec at a symlink without ':'",
            value=value,
        )
    if ".." in value.split("/"):
        raise _problem(
            "path",
            "'{value}' has a '..' component",
            "write the path without '..' (where it leads depends on symlinks on each node)",
            value=value,
        )
    if len(value) > MAX_PATH:
        raise _problem("path", "the path is longer than {limit} characters", "shorten it", value=value, limit=MAX_PATH)
    return value


def _check_file_name(value: str) -> str:
    """A plain file name inside the model dir: never a path that could lead out of it."""
    if not re.match(_FILE_NAME_RE, value) or value in {".", ".."}:
        raise _problem(
            "file_name",
            "'{value}' is not a plain file name",
            "write the file's name alone (letters, digits, '.', '_', '-'), e.g. J268-ho-v31-K5n.json; "
            "it is looked up inside the model dir",
            value=value,
        )
    return value


def _check_arg_value(value: str) -> str:
    """A value rendered as one `vllm serve` argument: never mistaken for a flag, never split."""
    if (
        not value
        or len(value) > MAX_ARG
        or value.startswith("-")
        or any(not c.isprintable() or c.isspace() for c in value)
    ):
        raise _problem(
            "arg_value",
            "'{value}' cannot be passed as a `vllm serve` value",
            "use 1-{limit} printable characters without spaces, not starting with '-'",
            value=value,
            limit=MAX_ARG,
        )
    return value


def _check_user(value: str) -> str:
    if not re.match(_USER_RE, value):
        raise _problem(
            "user",
            "'{value}' is not a user name",
            "write the login name alone (letters, digits, '_', '.', '-'; up to 32); the host goes in host:",
            value=value,
        )
    return value


def _check_revision(value: str) -> str:
    if not re.match(_REVISION_RE, value) or value.startswith("-") or ".." in value or value.endswith("/"):
        raise _problem(
            "revision",
            "'{value}' is not a branch, tag or commit",
            "write a 40-hex commit (best), or a branch or tag name such as main",
            value=value,
        )
    return value


def _check_fabric_ip(value: str) -> str:
    try:
        address = ipaddress.IPv4Address(value)
    except ValueError:
        raise _problem(
            "ipv4",
            "'{value}' is not an IPv4 address",
            "write the fabric address as four numbers, e.g. 10.10.10.11 (see `ip -br addr`)",
            value=value,
        ) from None
    reasons = {
        "loopback": address.is_loopback,
        "link-local (169.254.0.0/16, an unconfigured port)": address.is_link_local,
        "unspecified": address.is_unspecified,
        "multicast": address.is_multicast,
        "broadcast": address == ipaddress.IPv4Address("255.255.255.255"),
    }
    for reason, applies in reasons.items():
        if applies:
            raise _problem(
                "fabric_ip",
                "'{value}' is " + reason + " and cannot carry tensor-parallel traffic",
                "give the QSFP port a static address (netplan) and use that; `ip -br addr` shows it",
                value=value,
            )
    return value


def _check_bind_ip(value: str) -> str:
    try:
        ipaddress.IPv4Address(value)
    except ValueError:
        raise _problem(
            "ipv4",
            "'{value}' is not an IPv4 address",
            "use 0.0.0.0 for every interface, or one address of the head",
            value=value,
        ) from None
    return value


def _check_ifname(value: str) -> str:
    if not re.match(_IFNAME_RE, value):
        raise _problem(
            "ifname",
            "'{value}' is not a network interface name",
            "use the name `ip -br link` prints, e.g. enp1s0f1np1 (at most 15 characters)",
            value=value,
        )
    return value


def _check_hca(value: str) -> str:
    if not re.match(_HCA_RE, value):
        raise _problem(
            "hca",
            "'{value}' is not an RDMA device name",
            "use the names `rdma link` prints before '/', e.g. rocep1s0f1",
            value=value,
        )
    return value


def _check_env_name(value: str) -> str:
    if not re.match(_ENV_RE, value):
        raise _problem(
            "env_name",
            "'{value}' is not an environment variable name",
            "use letters, digits and '_', not starting with a digit",
            value=value,
        )
    return value


def _check_host(value: str) -> str:
    if not re.match(_HOST_RE, value) or ".." in value:
        raise _problem(
            "host",
            "'{value}' is not a host name or IPv4 address",
            "write the worker's fabric address (e.g. 10.10.10.11) or a resolvable name; "
            "put the user in `user:`, not in `host:`",
            value=value,
        )
    return value


def _check_text(value: str) -> str:
    if len(value) > MAX_TEXT or any(not char.isprintable() for char in value):
        raise _problem(
            "text",
            "the value is longer than {limit} characters or holds a control character",
            "shorten it and remove line breaks, tabs and other control characters",
            limit=MAX_TEXT,
        )
    return value


def names_api_key(arg: str) -> bool:
    """Whether a `vllm serve` argument sets the API key, in any spelling vLLM accepts.

    vLLM's parser turns '_' into '-' in a flag's name (up to a '.'), takes `--flag=value`, and
    argparse accepts an unambiguous prefix (`--api-k`).
    """
    if not arg.startswith("--"):
        return False
    name = arg[2:].split("=", 1)[0].split(".", 1)[0].replace("_", "-").lower()
    return name == "api-key" or (len(name) >= len("api-k") and "api-key".startswith(name))


def size_bytes(text: str) -> int:
    """'32g' -> bytes (Docker's units are powers of 1024)."""
    units = {"b": 1, "k": 1024, "m": 1024**2, "g": 1024**3}
    lowered = text.lower()
    if lowered[-1:] in units:
        return int(lowered[:-1]) * units[lowered[-1]]
    return int(lowered)


Name = Annotated[str, AfterValidator(_check_name)]
EnvValue = Annotated[str, AfterValidator(_check_text)]
ExtraArg = Annotated[str, Field(min_length=1), AfterValidator(_check_text)]
HostPath = Annotated[str, AfterValidator(_check_host_path)]
FileName = Annotated[str, AfterValidator(_check_file_name)]
ArgValue = Annotated[str, AfterValidator(_check_arg_value)]
UserName = Annotated[str, AfterValidator(_check_user)]
Revision = Annotated[str, AfterValidator(_check_revision)]
FabricIPv4 = Annotated[str, AfterValidator(_check_fabric_ip)]
BindIPv4 = Annotated[str, AfterValidator(_check_bind_ip)]
IfName = Annotated[str, AfterValidator(_check_ifname)]
HcaName = Annotated[str, AfterValidator(_check_hca)]
EnvName = Annotated[str, AfterValidator(_check_env_name)]
HostName = Annotated[str, AfterValidator(_check_host)]
Port = Annotated[int, Field(ge=1, le=65535)]
PositiveInt = Annotated[int, Field(ge=1)]
Seconds = Annotated[int, Field(ge=1, le=86_400)]
Tokens = Annotated[int, Field(ge=1, le=2**21)]


class StrictModel(BaseModel):
    """Unknown keys are errors; values are immutable once loaded; no type is guessed.

    Strict: a string is never read as a number or a boolean (`keep_parts: "yes"` is an error, not
    True), so what YAML hands over is exactly what the field gets.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)

    # List defaults are `lambda: []`, not `list`: pydantic reads a factory's signature, and a
    # builtin's is parsed from its text, which costs start-up (5 ms for the first one).


class SshTarget(StrictModel):
    """How the head reaches a node over SSH (host keys are always checked). A field left out
    comes from the head user's ~/.ssh/config for `host`, then from the default shown."""

    host: HostName = Field(description="Address, name or ~/.ssh/config Host alias; use the node's fabric address.")
    port: Port = 22
    user: UserName | None = Field(default=None, description="Login user; default: the current one.")
    identity_file: HostPath | None = Field(default=None, description="Private key on the head.")
    known_hosts: HostPath = Field(
        default="~/.ssh/known_hosts", description="Host keys checked on connect; never auto-added."
    )
    connect_timeout_s: float = Field(
        default=10.0, gt=0, le=600, description="Seconds to connect, like ssh's ConnectTimeout."
    )


class Fabric(StrictModel):
    """Overrides for the RoCE fabric; empty fields are detected on the node."""

    ip: FabricIPv4 | None = Field(default=None, description="The node's fabric IPv4 address, its rank's VLLM_HOST_IP.")
    ifname: IfName | None = Field(default=None, description="The fabric's network interface (NCCL/GLOO_SOCKET_IFNAME).")
    hcas: list[HcaName] | None = Field(
        default=None, min_length=1, max_length=16, description="RDMA devices carrying the fabric address (NCCL_IB_HCA)."
    )
    gid_index: int = Field(default=3, ge=0, le=255, description="RoCE v2 GID index (NCCL_IB_GID_INDEX).")


class Node(StrictModel):
    """One Spark. Rank 0 is the head; workers take ranks 1.. in list order."""

    name: Name
    role: Literal["head", "worker"] = "worker"
    ssh: SshTarget | None = Field(
        default=None,
        description="How to reach the node; absent means the machine running the reconciler.",
    )
    model_dir: HostPath = Field(
        default="~/models/DeepSeek-V4.1-Flash-Spark",
        description="The checkpoint on the node: a link to the served revision, <model_dir>@<commit>.",
    )
    model_source: Literal["peer", "hub"] | None = Field(
        default=None,
        description="Workers only: copy from the head (peer) or download (hub); default model.worker_source.",
    )
    fabric: Fabric = Fabric()


class Model(StrictModel):
    """The checkpoint and where it comes from."""

    repo: str = Field(default="0xSero/DeepSeek-V4.1-Flash-Spark", pattern=_REPO_RE, max_length=96)
    revision: Revision = Field(default="main", description="Pin a 40-hex commit for reproducible bytes.")
    endpoint: str | None = Field(
        default=None,
        description="Hub endpoint or mirror (HF_ENDPOINT semantics); default: $HF_ENDPOINT or the Hub.",
    )
    token_file: HostPath | None = Field(
        default=None, description="HF token file; default: $HF_TOKEN or the client's token."
    )
    manifest: FileName = Field(default="sha256-manifest.txt", description="In the model dir.")
    keep_parts: bool = Field(
        default=False, description="Keep the .partNN files after reassembly (else removed once the shards verify)."
    )
    exl3_plan: FileName = Field(
        default="J268-ho-v31-K5n.json", description="The EXL3 plan in the checkpoint's exl3/plan/ (ST_EXL3_PLAN)."
    )
    keep_revisions: int = Field(
        default=1,
        ge=0,
        le=16,
        description="Previous revisions kept beside the served one (for a rollback without a download).",
    )
    worker_source: Literal["peer", "hub"] = Field(default="peer", description="Default for nodes[].model_source.")
    download_streams: int = Field(
        default=8,
        ge=1,
        le=64,
        description=(
            "Connections the head downloads with (the Hub client's default, 8). A file of 32 MiB or "
            "more comes in byte ranges, one per connection, so files finish one after another at the "
            "full rate and the pipelined copy to the workers follows close behind; smaller files come "
            "whole, several at once. More fill a link whose Hub caps each connection; 1 fetches every "
            "file whole, one at a time (for a Hub or proxy that mangles Range answers)."
        ),
    )
    copy_transport: Literal["fabric", "ssh"] = Field(
        default="fabric",
        description=(
            "How a worker's copy travels: parallel rsync streams to a one-time rsync daemon on the "
            "worker's fabric address (fast; the bytes cross the fabric cable unencrypted, like NCCL's, "
            "and are verified at both ends), or the same streams over SSH (encrypted, bound by the "
            "cipher's CPU cost; the head then serves every worker)."
        ),
    )

    @field_validator("endpoint")
    @classmethod
    def _endpoint_is_url(cls, value: str | None) -> str | None:
        if value is not None and (
            not re.match(r"^https?://[^\s/]+", value) or len(value) > 2048 or any(c.isspace() for c in value)
        ):
            raise _problem(
                "url",
                "'{value}' is not an http(s) URL",
                "write the mirror's base URL, e.g. https://hf-mirror.example.org",
                value=value,
            )
        return value


class Image(StrictModel):
    """The serving image; pinned by digest so both ranks run the same bytes."""

    allow_unpinned: bool = Field(default=False, description="Accept a tag instead of a digest.")
    ref: str = Field(default=REFERENCE_IMAGE, min_length=1)

    @field_validator("ref")
    @classmethod
    def _pinned(cls, value: str, info: ValidationInfo) -> str:
        if not re.match(_IMAGE_RE, value):
            raise _problem(
                "image_ref",
                "'{value}' is not an image reference",
                "write registry/name@sha256:<digest>, e.g. the default ghcr.io/0xsero/...@sha256:...",
                value=value,
            )
        if not info.data.get("allow_unpinned", False) and not re.search(_DIGEST_RE, value):
            raise _problem(
                "unpinned_image",
                "image '{value}' is not pinned by digest",
                "append @sha256:<digest> (see `docker image inspect --format '{{{{index .RepoDigests 0}}}}'`), "
                "or set image.allow_unpinned: true to accept a moving tag",
                value=value,
            )
        return value


class Speculative(StrictModel):
    """DSpark speculative decoding (default: 7 draft tokens, adaptive verification)."""

    method: ArgValue = "dspark"
    num_speculative_tokens: int = Field(default=7, ge=1, le=32)
    draft_tensor_parallel_size: int | None = Field(
        default=None, ge=1, le=MAX_NODES, description="Default: the number of nodes (2 for a pair of Sparks)."
    )
    attention_backend: ArgValue = "B12X"
    draft_sample_method: ArgValue = "greedy"
    rejection_sample_method: ArgValue = "standard"
    enable_adaptive_verification: bool = True


class CudaGraph(StrictModel):
    """CUDA graph capture; capture sizes default to a rule from the draft tokens and max_num_seqs."""

    mode: Literal["FULL_DECODE_ONLY", "FULL", "PIECEWISE", "FULL_AND_PIECEWISE", "NONE"] = "FULL_DECODE_ONLY"
    custom_ops: list[ArgValue] = Field(default_factory=lambda: ["all"], max_length=64)
    capture_sizes: list[PositiveInt] | None = Field(
        default=None,
        min_length=1,
        max_length=512,
        description="Batch sizes to capture. Default: 1..d, then every 4th up to max_num_seqs*d, d = draft tokens + 1.",
    )


class Engram(StrictModel):
    """Engram tables (default: kept on disk)."""

    cpu_offload: bool = False
    table_memory: ArgValue = "disk"
    disk_resident_scales: bool = False
    disk_prefetch_max_tokens: int = Field(default=0, ge=0, le=2**21)
    projection_tp: bool = False


class Backends(StrictModel):
    """B12X Spark kernels."""

    attention: ArgValue = "B12X"
    linear: ArgValue = "b12x"
    moe: ArgValue = "b12x"


# Values that only the default image's vLLM fork knows; stock vLLM refuses them.
REFERENCE_IMAGE_VALUES = {"deepseek_v41"}
# Serving fields the upstream profile does not render: the default image's GPU tuning and
# its fork-only features. Setting one under `profile: upstream` earns a warning.
REFERENCE_PROFILE_ONLY_FIELDS = (
    "kv_cache_dtype",
    "block_size",
    "swa_block_size",
    "kv_bytes",
    "gpu_util",
    "speculative",
    "cudagraph",
    "engram",
    "backends",
    "safetensors_load_strategy",
)
UPSTREAM_ALTERNATIVES = {
    "tokenizer_mode": "auto",
    "reasoning_parser": "null (no reasoning parser) or an upstream parser such as deepseek_r1",
    "tool_call_parser": "an upstream parser such as hermes",
}


class Serving(StrictModel):
    """Everything both ranks are started with."""

    profile: Literal["reference", "upstream"] = Field(
        default="reference",
        description=(
            "Which `vllm serve` flags are rendered. reference: every flag of the GB10 tuning, fork-only ones "
            "included (needs the default image's vLLM fork). upstream: only flags upstream vLLM accepts (any stock "
            "vLLM build)."
        ),
    )
    served_model_name: ArgValue = "deepseek-v4.1-flash"
    dtype: ArgValue = "bfloat16"
    kv_cache_dtype: ArgValue = "fp8"
    block_size: int = Field(default=256, ge=1, le=4096)
    swa_block_size: int = Field(default=128, ge=1, le=4096)
    kv_bytes: int = Field(
        default=2_700_000_000,
        ge=1,
        le=128 * GIB,
        description="--kv-cache-memory-bytes per rank (the default holds 2,023,717 tokens).",
    )
    gpu_util: float = Field(
        default=0.88, gt=0, le=1, description="--gpu-memory-utilization: the share of memory a rank may take."
    )
    max_model_len: Tokens = 262_144
    max_num_seqs: int = Field(default=2, ge=1, le=1024)
    max_num_batched_tokens: Tokens = 2048
    speculative: Speculative = Speculative()
    cudagraph: CudaGraph = CudaGraph()
    engram: Engram = Engram()
    backends: Backends = Backends()
    safetensors_load_strategy: ArgValue = "lazy"
    generation_config: ArgValue = "vllm"
    tokenizer_mode: ArgValue = Field(default="deepseek_v41", validate_default=True)
    reasoning_parser: ArgValue | None = Field(
        default="deepseek_v41", validate_default=True, description="null: no --reasoning-parser."
    )
    tool_call_parser: ArgValue = Field(default="deepseek_v41", validate_default=True)
    images_per_prompt: int = Field(default=1, ge=0, le=64)
    port: Port = 8000
    master_port: Port = 29655
    shm_size: str = Field(default="32g", description="Docker --shm-size.")
    privileged: bool = Field(
        default=True,
        description="Docker --privileged, so the ranks reach the RDMA devices; false needs them passed explicitly.",
    )
    memlock: int = Field(
        default=-1, ge=-1, le=2**50, description="Docker --ulimit memlock in bytes; -1 = unlimited (RDMA needs it)."
    )
    gpus: Literal["all", "none"] = Field(
        default="all", description="Docker --gpus; 'none' only for test beds without the NVIDIA runtime."
    )
    stop_timeout_s: int = Field(
        default=60, ge=1, le=3600, description="Grace before SIGKILL; vLLM needs more than Docker's 10 s."
    )
    env: dict[EnvName, EnvValue] = Field(default_factory=lambda: dict(REFERENCE_ENV), max_length=512)
    extra_env: dict[EnvName, EnvValue] = Field(
        default_factory=dict, max_length=512, description="Added over env on both ranks."
    )
    extra_args: list[ExtraArg] = Field(
        default_factory=lambda: [],
        max_length=256,
        description="Extra `vllm serve` arguments, appended to rank 0's args.",
    )

    @field_validator("env", "extra_env")
    @classmethod
    def _no_derived_env(cls, value: dict[str, str]) -> dict[str, str]:
        for name in value:
            if name in DERIVED_ENV:
                raise _problem(
                    "derived_env",
                    "{name} is set by the reconciler",
                    "remove it here and set {source} instead",
                    name=name,
                    source=DERIVED_ENV[name],
                )
        return value

    @field_validator("tokenizer_mode", "reasoning_parser", "tool_call_parser")
    @classmethod
    def _upstream_values(cls, value: str | None, info: ValidationInfo) -> str | None:
        if info.data.get("profile") == "upstream" and value in REFERENCE_IMAGE_VALUES:
            field = info.field_name or ""
            raise _problem(
                "reference_only_value",
                "'{value}' exists only in the default image's vLLM fork; upstream vLLM rejects it",
                "with profile: upstream set {field} to {alternative}",
                value=value,
                field=field,
                alternative=UPSTREAM_ALTERNATIVES.get(field, "an upstream value"),
            )
        return value

    @field_validator("extra_args")
    @classmethod
    def _no_key_in_args(cls, value: list[str]) -> list[str]:
        if any(names_api_key(arg) for arg in value):
            raise _problem(
                "secret_in_argv",
                "--api-key would put the API key in the process list and `docker inspect`",
                "remove it (in any spelling: vLLM reads --api_key and --api-k as --api-key); "
                "the key is read from api.key_file through a read-only mount",
            )
        return value

    @field_validator("shm_size")
    @classmethod
    def _size(cls, value: str) -> str:
        if not re.match(_SIZE_RE, value.lower()) or size_bytes(value) > 128 * GIB:
            raise _problem(
                "size", "'{value}' is not a size up to 128g", "write e.g. 32g, 512m or 1073741824", value=value
            )
        return value


class MemGuard(StrictModel):
    """Stops the ranks before the shared CPU/GPU memory pool runs dry and wedges the host."""

    enabled: bool = True
    floor_gib: float = Field(
        default=1.0,
        gt=0,
        le=64,
        description="MemAvailable floor in GiB; below it the guard kills the ranks. Fractions allowed.",
    )
    interval_s: float = Field(default=1.0, ge=0.1, le=60)


class Api(StrictModel):
    """The OpenAI-compatible API on the head."""

    key_file: HostPath | None = Field(default=None, description="Default: <state_dir>/api_key.")
    bind: BindIPv4 = Field(default="0.0.0.0", description="vLLM --host.")


class Startup(StrictModel):
    """How long a group start may take, and what it must pass, before it counts as failed."""

    timeout_s: Seconds = Field(default=2700, description="45 minutes; a first start takes 11-13 min.")
    poll_s: Seconds = Field(default=15, description="Seconds between readiness polls.")
    smoke: Literal["all", "protocol", "off"] = Field(
        default="all",
        description="Smoke checks `apply` runs after (re)starting the group: all (a sum, a tool call and an image, "
        "plus the protocol checks), protocol (models, 401, streaming only: for models that cannot answer, such as "
        "random weights), or off.",
    )
    smoke_timeout_s: Seconds = Field(
        default=600,
        description="Longest wait for one smoke request after a start: an engine that hangs then fails the "
        "smoke instead of holding `apply` and the loop for the 3600 s a smoke request may take.",
    )


class Loop(StrictModel):
    """`reconciler run`: when it looks again, and how it probes that the engine still works."""

    resync_s: Seconds = Field(default=300, description="Full pass at least this often, events or not.")
    liveness_s: Seconds = Field(
        default=60, description="One-token completion with the key this often (/health lies when the engine is dead)."
    )
    liveness_timeout_s: Seconds = Field(default=60, description="A completion slower than this counts as failed.")
    failure_threshold: int = Field(
        default=3, ge=1, le=100, description="Consecutive failed probes before a group restart."
    )
    max_backoff_s: Seconds = Field(default=1800, description="Longest wait between failing group restarts.")


class Pi(StrictModel):
    """The Pi coding agent provider on the machine running the reconciler."""

    enabled: bool = True
    provider: Name = "dsv41-sparks"
    set_default: bool = Field(
        default=False, description="Make this model Pi's default (defaultProvider, defaultModel)."
    )


class Deployment(StrictModel):
    """A DeepSeek-V4.1-Flash deployment over DGX Spark nodes."""

    name: Name = Field(default="dsv41", description="Prefix of container names (<name>-r<rank>).")
    state_dir: HostPath = Field(
        default="~/.dsv41-two-sparks", description="The reconciler's files on every node (key, guard, plans, caches)."
    )
    nodes: list[Node] = Field(
        min_length=2, max_length=MAX_NODES, description="Exactly one head; workers take ranks 1.. in order."
    )
    model: Model = Model()
    image: Image = Image()
    serving: Serving = Serving()
    memguard: MemGuard = MemGuard()
    api: Api = Api()
    startup: Startup = Startup()
    loop: Loop = Loop()
    pi: Pi = Pi()

    @property
    def head(self) -> Node:
        return next(node for node in self.nodes if node.role == "head")

    @property
    def ranked_nodes(self) -> list[tuple[int, Node]]:
        """(rank, node): the head is rank 0, workers follow in list order."""
        workers = [node for node in self.nodes if node.role == "worker"]
        return [(0, self.head), *((rank, node) for rank, node in enumerate(workers, start=1))]

    def node(self, name: str) -> Node:
        return next(node for node in self.nodes if node.name == name)

    def key_file(self) -> str:
        return self.api.key_file or f"{self.state_dir.rstrip('/')}/api_key"

    def source_of(self, node: Node) -> Literal["head", "peer", "hub"]:
        if node.role == "head":
            return "head"
        return node.model_source or self.model.worker_source


def expand_home(path: str, home: str) -> str:
    """Resolve '~' against a node's own home: the worker's home is not the head's."""
    if path == "~":
        return home
    if path.startswith("~/"):
        return f"{home.rstrip('/')}/{path[2:]}"
    return path


class LoadedSpec(Record):
    """A valid spec, where it came from, and warnings that do not block it."""

    deployment: Deployment
    path: str
    warnings: list[SpecProblem]


# A deployment spec is a few kilobytes: the cap keeps a wrong --spec (a log, a disk image)
# from being parsed for minutes.
MAX_SPEC_BYTES = 1024 * 1024


def load_spec(path: str | os.PathLike[str]) -> LoadedSpec:
    """Read, parse and validate a spec file; raise SpecError listing every problem."""
    return parse_spec(read_spec_text(path), str(path))


def read_spec_text(path: str | os.PathLike[str]) -> str:
    """The text of a spec file; a SpecError, located, if it is not a small UTF-8 text file."""
    try:
        return read_untrusted_text(path, what="spec", limit=MAX_SPEC_BYTES)
    except UntrustedTextError as exc:
        hint = exc.hint or f"pass --spec PATH or set ${SPEC_PATH_ENV}; the default is {DEFAULT_SPEC_PATH}"
        raise SpecError([SpecProblem(str(path), exc.line, exc.column, "", exc.message, hint)]) from None


def parse_spec(text: str, filename: str) -> LoadedSpec:
    """Parse and validate spec text; `filename` only labels the problems."""
    try:
        document = load_located(text)
    except YamlError as exc:
        path = _render_path(exc.path)
        problem = SpecProblem(filename, exc.mark.line, exc.mark.column, path, exc.message, exc.hint)
        raise SpecError([problem]) from None
    problems = _duplicate_problems(document, filename)
    if not isinstance(document.data, dict):
        mark = document.mark_for(())
        message = "the spec is empty" if document.data is None else "the spec must be a mapping of keys"
        problems.append(SpecProblem(filename, mark.line, mark.column, "", message, "start from specs/deployment.yaml"))
        raise SpecError(problems)
    try:
        deployment = Deployment.model_validate(document.data)
    except ValidationError as exc:
        problems += [_locate(error, document, filename) for error in exc.errors()]
        raise SpecError(sorted(problems, key=lambda problem: (problem.line, problem.column))) from None
    problems += [_at(document, filename, loc, message, hint) for loc, message, hint in cross_check(deployment)]
    if problems:
        raise SpecError(sorted(problems, key=lambda problem: (problem.line, problem.column)))
    return LoadedSpec(deployment, filename, _warnings(deployment, document, filename))


def _duplicate_problems(document: LocatedDocument, filename: str) -> list[SpecProblem]:
    return [
        SpecProblem(
            filename,
            mark.line,
            mark.column,
            _render_path(path),
            "duplicate key",
            "YAML would silently keep only the last one; remove one of them",
        )
        for path, mark in document.duplicates
    ]


Located = tuple[tuple[str | int, ...], str, str]


def cross_check(deployment: Deployment) -> list[Located]:
    """Rules that span several fields; each result is (path, message, hint)."""
    return [*_check_roles(deployment), *_check_unique_nodes(deployment), *_check_ports(deployment)]


def _check_roles(deployment: Deployment) -> list[Located]:
    heads = [index for index, node in enumerate(deployment.nodes) if node.role == "head"]
    problems: list[Located] = []
    if len(heads) != 1:
        where = ("nodes", heads[1], "role") if len(heads) > 1 else ("nodes",)
        problems.append(
            (
                where,
                f"exactly one node must have role: head, found {len(heads)}",
                "mark the Spark that serves the API as head",
            )
        )
    for index, node in enumerate(deployment.nodes):
        if node.role == "head" and node.model_source is not None:
            problems.append(
                (
                    ("nodes", index, "model_source"),
                    "the head always downloads from the Hub",
                    "remove model_source from the head",
                )
            )
    return problems


def _check_unique_nodes(deployment: Deployment) -> list[Located]:
    problems: list[Located] = []
    seen: dict[str, int] = {}
    fabric_ips: dict[str, int] = {}
    locals_: list[int] = []
    for index, node in enumerate(deployment.nodes):
        if node.name in seen:
            problems.append(
                (
                    ("nodes", index, "name"),
                    f"node name '{node.name}' is used twice",
                    f"rename one; nodes[{seen[node.name]}] has it",
                )
            )
        seen.setdefault(node.name, index)
        ip = node.fabric.ip
        if ip is not None and ip in fabric_ips:
            problems.append(
                (
                    ("nodes", index, "fabric", "ip"),
                    f"fabric ip {ip} is also nodes[{fabric_ips[ip]}]'s",
                    "each Spark needs its own fabric address",
                )
            )
        if ip is not None:
            fabric_ips.setdefault(ip, index)
        if node.ssh is None:
            locals_.append(index)
    if len(locals_) > 1:
        problems.append(
            (
                ("nodes", locals_[1]),
                "more than one node has no ssh: (only the machine running the reconciler is local)",
                "add an ssh: target to every remote node",
            )
        )
    return problems


def _check_ports(deployment: Deployment) -> list[Located]:
    serving = deployment.serving
    problems: list[Located] = []
    if serving.port == serving.master_port:
        problems.append(
            (
                ("serving", "master_port"),
                f"master_port equals the API port {serving.port}",
                "use two different ports (the defaults: 8000 and 29655)",
            )
        )
    sizes = serving.cudagraph.capture_sizes
    limit = serving.max_num_seqs * (serving.speculative.num_speculative_tokens + 1)
    if sizes is not None and max(sizes, default=0) > limit:
        problems.append(
            (
                ("serving", "cudagraph", "capture_sizes"),
                f"capture size {max(sizes)} exceeds max_num_seqs*(num_speculative_tokens+1) = {limit}",
                "drop the larger sizes or raise max_num_seqs",
            )
        )
    return problems


def _warnings(deployment: Deployment, document: LocatedDocument, filename: str) -> list[SpecProblem]:
    warnings: list[SpecProblem] = _profile_warnings(deployment.serving, document, filename)
    if not re.match(_COMMIT_RE, deployment.model.revision):
        warnings.append(
            _at(
                document,
                filename,
                ("model", "revision"),
                f"model revision '{deployment.model.revision}' is a branch, not a commit",
                "pin the 40-hex commit so every node and every rerun gets the same bytes",
            )
        )
    return warnings


def _profile_warnings(serving: Serving, document: LocatedDocument, filename: str) -> list[SpecProblem]:
    """Fields the chosen profile never renders: say so rather than ignore them silently."""
    if serving.profile != "upstream":
        return []
    unused = [name for name in REFERENCE_PROFILE_ONLY_FIELDS if name in serving.model_fields_set]
    return [
        _at(
            document,
            filename,
            ("serving", name),
            f"serving.{name} has no effect with profile: upstream",
            "remove it, or use profile: reference (with the default image's vLLM fork) where it is rendered",
        )
        for name in unused
    ]


def _at(document: LocatedDocument, filename: str, loc: tuple[str | int, ...], message: str, hint: str) -> SpecProblem:
    mark = document.mark_for(loc)
    return SpecProblem(filename, mark.line, mark.column, _render_path(loc), message, hint)


def _render_path(loc: tuple[str | int, ...]) -> str:
    text = ""
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


def _locate(error: Any, document: LocatedDocument, filename: str) -> SpecProblem:
    loc = _document_path(error["loc"], document)
    context = error.get("ctx") or {}
    message = error["msg"]
    hint = str(context.get("hint") or _generic_hint(error, loc))
    if error["type"] in _BOUND_ERRORS:
        message = f"{error['input']!r:.80} is out of range: {message[:1].lower()}{message[1:]}"
    elif error["type"] == "extra_forbidden":
        message = f"unknown key '{loc[-1]}'"
    elif error["type"] == "missing":
        message = f"required key '{loc[-1]}' is missing"
    return _at(document, filename, loc, message, hint)


_BOUND_ERRORS = {"greater_than_equal", "less_than_equal", "greater_than", "less_than"}


def _document_path(loc: tuple[str | int, ...], document: LocatedDocument) -> tuple[str | int, ...]:
    """Pydantic's location without the union member names it inserts ('str', 'function-after[...]');
    a part that is a key of the document (`list:` typed by mistake) is kept, whatever it looks like."""
    kept: tuple[str | int, ...] = ()
    for part in loc:
        if not _is_union_tag(part) or (*kept, part) in document.marks:
            kept = (*kept, part)
    return kept


def _is_union_tag(part: object) -> bool:
    return isinstance(part, str) and ("[" in part or part in {"str", "int", "float", "bool", "list", "dict"})


def _generic_hint(error: Any, loc: tuple[str | int, ...]) -> str:
    kind = error["type"]
    if kind == "extra_forbidden":
        allowed = _allowed_keys(loc[:-1])
        import difflib  # only to suggest a name for a misspelt key

        close = difflib.get_close_matches(str(loc[-1]), allowed, n=1)
        suggestion = f"did you mean '{close[0]}'? " if close else ""
        return f"{suggestion}allowed keys here: {', '.join(allowed)}"
    if kind == "missing":
        return "add it; see schemas/deployment.schema.json for its meaning"
    if kind in _BOUND_ERRORS:
        return "use a value inside the allowed range"
    if kind == "literal_error":
        return "use one of the listed values"
    if kind.endswith(("_type", "_parsing")):
        return "check the value's type: quote strings, write numbers without quotes"
    return "see schemas/deployment.schema.json for what this field accepts"


def _allowed_keys(loc: tuple[str | int, ...]) -> list[str]:
    model: Any = Deployment
    for part in loc:
        if isinstance(part, int):
            continue
        field = model.model_fields.get(part) if _is_model(model) else None
        if field is None:
            return []
        model = _model_inside(field.annotation)
    return list(model.model_fields) if _is_model(model) else []


def _is_model(candidate: Any) -> bool:
    return isinstance(candidate, type) and issubclass(candidate, BaseModel)


def _model_inside(annotation: Any) -> Any:
    """The model class inside Optional[...] or list[...], if any."""
    if _is_model(annotation):
        return annotation
    if get_origin(annotation) is not None:
        for argument in get_args(annotation):
            found = _model_inside(argument)
            if found is not None:
                return found
    return None


def schema_text() -> str:
    """The JSON Schema editors use to validate specs (yaml-language-server modeline)."""
    schema = Deployment.model_json_schema()
    schema = {**schema, "title": "spark-reconciler deployment"}
    schema = {"$schema": "https://json-schema.org/draft/2020-12/schema", **schema}
    return json.dumps(schema, indent=2, sort_keys=False) + "\n"
