"""The desired state of a deployment, as pydantic models.

Every default here is a value known to serve the model on two Sparks with the default image
(docs/sources.md says where they come from), so a spec that names only the nodes is complete.
The model is strict: an unknown key is an error, not a silently ignored typo, because a typo
in a serving flag would otherwise cost a 12-minute restart to discover.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from reconciler.nodeside.statedir import StateDir
from reconciler.spec.values import (
    _DIGEST_RE,
    _REPO_RE,
    GIB,
    MAX_NODES,
    ArgValue,
    BindIPv4,
    Bytes,
    EnvName,
    EnvValue,
    ExtraArg,
    FabricIPv4,
    FileName,
    HcaName,
    HostName,
    HostPath,
    IfName,
    ImageRef,
    Listen,
    Name,
    NotifyWord,
    Port,
    PositiveInt,
    Revision,
    Seconds,
    Size,
    Tokens,
    Url,
    UserName,
    _problem,
    names_api_key,
)

REFERENCE_IMAGE = (
    "ghcr.io/0xsero/deepseek-v4.1-flash-spark@sha256:5668e35e5ee021da4b9ce88a1964caf0e082e8ca01d81d1d64b6213a55c6add5"
)
# The official HAProxy 3.0 (LTS) image, 3.0.28 on Alpine: the digest of its multi-arch index
# (linux/arm64 for the Sparks, linux/amd64 among the others), as docker-library publishes it.
FRONT_IMAGE = "haproxy:3.0-alpine@sha256:c76d0e66c19908aa3fccc72203c156a09e2aac07a148bf45f40586894d83c4d9"


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


# What a change of a field does to a running deployment, said the same way wherever it is the
# same (read off the components: what each one's config hash or plan covers). Every field's
# description says it in a sentence starting "A change" (tests/unit/test_schema.py holds them to it).
GROUP_RESTART = "A change restarts the serving group (11-13 min without the API)."
REFERENCE_RESTART = (
    "A change restarts the serving group (11-13 min without the API); profile upstream does not render it."
)
FRONT_ONLY = "A change replaces the front only (seconds); the ranks keep serving."
GUARD_ONLY = "A change restarts the memory guards only (seconds); the ranks keep serving."
NEXT_PASS = "A change takes effect at the next pass; nothing restarts."
NEXT_START = "A change applies from the next group start; nothing restarts."
NEXT_TRANSFER = "A change applies to the next download or copy; nothing restarts."
CONNECTION = "A change only changes how the reconciler connects; nothing restarts."
PI_CONFIG = "A change rewrites Pi's config on this machine at the next pass (apply or the loop's); nothing restarts."


class StrictModel(BaseModel):
    """Unknown keys are errors; values are immutable once loaded; no type is guessed.

    Strict: a string is never read as a number or a boolean (`keep_parts: "yes"` is an error, not
    True), so what YAML hands over is exactly what the field gets.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)

    # Collection defaults are plain values, not factories: pydantic copies them for each model,
    # and only a plain default reaches the JSON schema, which editors and docs/spec.md show.


class SshTarget(StrictModel):
    """How the head reaches a node over SSH (host keys are always checked). A field left out
    comes from the head user's ~/.ssh/config for `host`, then from the default shown."""

    host: HostName = Field(
        description=(
            "Address, name or ~/.ssh/config Host alias; use the node's fabric address (a copy over SSH takes it). "
            f"{CONNECTION}"
        )
    )
    port: Port = Field(default=22, description=f"The node's SSH port. {CONNECTION}")
    user: UserName | None = Field(
        default=None,
        description=f"Login user; default: the ssh config's User, else the user running the reconciler. {CONNECTION}",
    )
    identity_file: HostPath | None = Field(
        default=None,
        description=f"Private key file on the head; default: the ssh config's IdentityFile, else ssh's usual keys. "
        f"{CONNECTION}",
    )
    known_hosts: HostPath = Field(
        default="~/.ssh/known_hosts",
        description=f"The file of host keys checked on every connection; a key is never added. {CONNECTION}",
    )
    connect_timeout_s: float = Field(
        default=10.0, gt=0, le=600, description=f"Seconds to connect, like ssh's ConnectTimeout. {CONNECTION}"
    )

    @property
    def login(self) -> str:
        """`[user@]host`, as the user gave it to ssh."""
        return f"{self.user + '@' if self.user else ''}{self.host}"


class Fabric(StrictModel):
    """The node's RoCE fabric, the link the ranks talk over: what is left empty is detected on the
    node. A change of any field restarts the serving group."""

    ip: FabricIPv4 | None = Field(
        default=None,
        description="The node's fabric IPv4 address, its rank's VLLM_HOST_IP (the head's is also the group's "
        f"master address); default: detected. {GROUP_RESTART}",
    )
    ifname: IfName | None = Field(
        default=None,
        description=f"The fabric's network interface (NCCL/GLOO_SOCKET_IFNAME); default: detected. {GROUP_RESTART}",
    )
    hcas: list[HcaName] | None = Field(
        default=None,
        min_length=1,
        max_length=16,
        description="RDMA devices carrying the fabric address (NCCL_IB_HCA); default: detected, unset when none is "
        f"proven (NCCL chooses). {GROUP_RESTART}",
    )
    gid_index: int = Field(
        default=3, ge=0, le=255, description=f"RoCE v2 GID index (NCCL_IB_GID_INDEX). {GROUP_RESTART}"
    )


class Node(StrictModel):
    """One Spark. Rank 0 is the head; workers take ranks 1.. in list order."""

    name: Name = Field(
        description="What plans, status and logs call the node (lowercase letters, digits and '-'). "
        "A change (a rename) restarts nothing."
    )
    role: Literal["head", "worker"] = Field(
        default="worker",
        description="head: rank 0, which serves the API through the front (exactly one node); worker: ranks 1.. in "
        "list order. A change moves the ranks, so it restarts the serving group (11-13 min without the API).",
    )
    ssh: SshTarget | None = Field(
        default=None,
        description=f"How to reach the node; absent means the machine running the reconciler. {CONNECTION}",
    )
    model_dir: HostPath = Field(
        default="~/models/DeepSeek-V4.1-Flash-Spark",
        description="Where the checkpoint is on the node: a link to the served revision, <model_dir>@<commit>. "
        "A change brings the checkpoint to the new place (download or copy), then restarts the serving group onto it.",
    )
    model_source: Literal["peer", "hub"] | None = Field(
        default=None,
        description="Workers only: copy the checkpoint from a peer (peer) or download it from the Hub (hub); default: "
        f"model.worker_source. {NEXT_TRANSFER}",
    )
    image_source: Literal["registry", "peer"] | None = Field(
        default=None,
        description="Workers only: pull the serving image from its registry (registry) or take it from a peer over "
        "the fabric (peer: from the head, or the worker before it in a chain; for a node with no route to the "
        "registry); default: image.worker_source. A change applies to the next image transfer; nothing restarts.",
    )
    fabric: Fabric = Fabric()


class Model(StrictModel):
    """The checkpoint and where it comes from."""

    repo: str = Field(
        default="0xSero/DeepSeek-V4.1-Flash-Spark",
        pattern=_REPO_RE,
        max_length=96,
        description="The checkpoint's Hub repository (owner/name). A change brings the new checkpoint to every node "
        "(download, copy), then restarts the serving group onto it.",
    )
    revision: Revision = Field(
        default="main",
        description=(
            "A branch or tag, resolved once and pinned on the head (`apply --update-revision` moves it), or a "
            "40-hex commit, served exactly. A change stages the new revision beside the served one (unchanged files "
            "hardlinked, the rest downloaded and copied), then restarts the serving group onto it."
        ),
    )
    endpoint: Url | None = Field(
        default=None,
        description="Hub endpoint or mirror (HF_ENDPOINT semantics); default: $HF_ENDPOINT or the Hub. "
        "A change applies to the next request to the Hub; nothing restarts.",
    )
    token_file: HostPath | None = Field(
        default=None,
        description="Hub token file on the head; default: $HF_TOKEN or the Hub client's saved token. "
        "A change applies to the next request to the Hub; nothing restarts.",
    )
    manifest: FileName = Field(
        default="sha256-manifest.txt",
        description="The checkpoint's sha256 manifest, a file name in the model dir, that files are verified "
        "against. A change fetches it and verifies every node's files again; nothing restarts.",
    )
    keep_parts: bool = Field(
        default=False,
        description="Keep the .partNN files after reassembly (else removed once the shards verify). "
        "A change takes effect at the next pass (false removes parts left over); nothing restarts.",
    )
    exl3_plan: FileName = Field(
        default="J268-ho-v31-K5n.json",
        description="The EXL3 plan, a file name in the checkpoint's exl3/plan/, staged for the ranks (ST_EXL3_PLAN). "
        "A change stages the new plan on every node and restarts the serving group (11-13 min without the API).",
    )
    keep_revisions: int = Field(
        default=1,
        ge=0,
        le=16,
        description="Previous revisions kept beside the served one (for a rollback without a download). "
        "A change takes effect at the next pass (a lower value removes the older ones); nothing restarts.",
    )
    worker_source: Literal["peer", "hub"] = Field(
        default="peer",
        description="Where workers without their own model_source get the checkpoint: copied from a peer (peer) or "
        f"downloaded from the Hub (hub). {NEXT_TRANSFER}",
    )
    download_streams: int = Field(
        default=8,
        ge=1,
        le=64,
        description=(
            "Connections the head downloads with: a file of 32 MiB or more comes in byte ranges, one per "
            "connection, smaller files whole, several at once. More fill a link whose Hub caps each connection; 1 "
            f"fetches every file whole, one at a time (for a Hub or proxy that mangles Range answers). {NEXT_TRANSFER}"
        ),
    )
    copy_transport: Literal["fabric", "ssh"] = Field(
        default="fabric",
        description=(
            "How a worker's copy travels: fabric, parallel rsync streams to a one-time rsync daemon on the "
            "worker's fabric address (fast; unencrypted on the fabric cable, like NCCL's traffic, and verified at "
            "both ends); ssh, the same streams over SSH (encrypted, bound by the cipher's CPU cost; the head then "
            "serves every worker). "
            f"{NEXT_TRANSFER}"
        ),
    )


class Image(StrictModel):
    """The serving image; pinned by digest so both ranks run the same bytes."""

    allow_unpinned: bool = Field(
        default=False,
        description="Accept a tag instead of a sha256 digest in image.ref and api.front_image (a tag may give two "
        "nodes different bytes). A change only changes what the spec accepts; nothing restarts.",
    )
    ref: ImageRef = Field(
        default=REFERENCE_IMAGE,
        description="The image every rank runs: registry/name@sha256:<digest>. A change pulls it on every node, "
        "then restarts the serving group onto it (11-13 min without the API).",
    )
    worker_source: Literal["registry", "peer"] = Field(
        default="registry",
        description="Where workers without their own image_source get the image: pulled from its registry by each "
        "worker (registry), or sent from the head over the fabric, worker to worker in a chain (peer: the head "
        "fetches it once, only layers a node lacks travel, compared by the pinned digest). A change applies to the "
        "next image transfer; nothing restarts.",
    )
    keep_previous: int = Field(
        default=1,
        ge=0,
        le=8,
        description="Serving images the reconciler pulled that stay on each node after a newer one serves (for a "
        "rollback without a transfer); older ones it pulled are removed, an image it did not pull never is. "
        "A change takes effect once the next image serves; nothing restarts.",
    )

    @field_validator("ref")
    @classmethod
    def _pinned(cls, value: str, info: ValidationInfo) -> str:
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
    """DSpark speculative decoding: each field is a key of --speculative-config. Profile reference
    only; a change of any field restarts the serving group."""

    method: ArgValue = Field(
        default="dspark", description=f"The speculative decoding method (dspark: the fork's). {REFERENCE_RESTART}"
    )
    num_speculative_tokens: int = Field(
        default=7,
        ge=1,
        le=32,
        description="Draft tokens proposed per step, in tokens; the default CUDA graph capture sizes follow it. "
        f"{REFERENCE_RESTART}",
    )
    draft_tensor_parallel_size: int | None = Field(
        default=None,
        ge=1,
        le=MAX_NODES,
        description=f"The draft's tensor-parallel size; default: the number of nodes. {REFERENCE_RESTART}",
    )
    attention_backend: ArgValue = Field(
        default="B12X", description=f"The draft's attention backend. {REFERENCE_RESTART}"
    )
    draft_sample_method: ArgValue = Field(
        default="greedy", description=f"How draft tokens are sampled. {REFERENCE_RESTART}"
    )
    rejection_sample_method: ArgValue = Field(
        default="standard", description=f"How proposed tokens are accepted or rejected. {REFERENCE_RESTART}"
    )
    enable_adaptive_verification: bool = Field(
        default=True, description=f"Adaptive verification of the drafts (a dspark option). {REFERENCE_RESTART}"
    )


class CudaGraph(StrictModel):
    """CUDA graph capture, rendered as --compilation-config and --max-cudagraph-capture-size.
    Profile reference only; a change of any field restarts the serving group."""

    mode: Literal["FULL_DECODE_ONLY", "FULL", "PIECEWISE", "FULL_AND_PIECEWISE", "NONE"] = Field(
        default="FULL_DECODE_ONLY", description=f"The compilation config's cudagraph_mode. {REFERENCE_RESTART}"
    )
    custom_ops: list[ArgValue] = Field(
        default=["all"],
        max_length=64,
        description=f"The compilation config's custom_ops. {REFERENCE_RESTART}",
    )
    capture_sizes: list[PositiveInt] | None = Field(
        default=None,
        min_length=1,
        max_length=512,
        description="Batch sizes to capture; default: 1..d, then every 4th up to max_num_seqs*d, d = draft tokens + 1. "
        f"{REFERENCE_RESTART}",
    )


class Engram(StrictModel):
    """The Engram tables: each field is a key of --engram-config, a flag of the default image's vLLM
    fork. Profile reference only; a change of any field restarts the serving group."""

    cpu_offload: bool = Field(default=False, description=f"The engram config's cpu_offload. {REFERENCE_RESTART}")
    table_memory: ArgValue = Field(
        default="disk",
        description=f"Where the tables are held (disk: read from the checkpoint while serving). {REFERENCE_RESTART}",
    )
    disk_resident_scales: bool = Field(
        default=False, description=f"The engram config's disk_resident_scales. {REFERENCE_RESTART}"
    )
    disk_prefetch_max_tokens: int = Field(
        default=0,
        ge=0,
        le=2**21,
        description=f"The engram config's disk_prefetch_max_tokens, in tokens. {REFERENCE_RESTART}",
    )
    projection_tp: bool = Field(default=False, description=f"The engram config's projection_tp. {REFERENCE_RESTART}")


class Backends(StrictModel):
    """The kernels the ranks run (B12X: built for the Spark's GPU). Profile reference only; a change
    of any field restarts the serving group."""

    attention: ArgValue = Field(default="B12X", description=f"--attention-backend. {REFERENCE_RESTART}")
    linear: ArgValue = Field(default="b12x", description=f"--linear-backend, a fork flag. {REFERENCE_RESTART}")
    moe: ArgValue = Field(default="b12x", description=f"--moe-backend, a fork flag. {REFERENCE_RESTART}")


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
    """How the ranks are started: their `vllm serve` flags and containers. Most fields restart the
    serving group when changed; port and drain_s do not."""

    profile: Literal["reference", "upstream"] = Field(
        default="reference",
        description=(
            "Which `vllm serve` flags are rendered. reference: every flag of the GB10 tuning, fork-only ones "
            "included (needs the default image's vLLM fork). upstream: only flags upstream vLLM accepts (any stock "
            f"vLLM build). {GROUP_RESTART}"
        ),
    )
    served_model_name: ArgValue = Field(
        default="deepseek-v4.1-flash",
        description=f"The model name clients ask for (--served-model-name), also Pi's model id. {GROUP_RESTART}",
    )
    dtype: ArgValue = Field(default="bfloat16", description=f"--dtype: the type the model computes in. {GROUP_RESTART}")
    kv_cache_dtype: ArgValue = Field(default="fp8", description=f"--kv-cache-dtype. {REFERENCE_RESTART}")
    block_size: int = Field(
        default=256, ge=1, le=4096, description=f"--block-size: tokens per KV cache block. {REFERENCE_RESTART}"
    )
    swa_block_size: int = Field(
        default=128,
        ge=1,
        le=4096,
        description=f"--swa-block-size, a fork flag: tokens per sliding-window KV cache block. {REFERENCE_RESTART}",
    )
    kv_bytes: Bytes = Field(
        default=2_700_000_000,
        ge=1,
        le=128 * GIB,
        description=(
            "--kv-cache-memory-bytes per rank (the default, 2.7GB, holds 2,023,717 tokens): bytes, or with a "
            "unit: 2.7GB (1000s) or 2.5GiB (1024s). Lower it first when the memory guard trips. "
            f"{REFERENCE_RESTART}"
        ),
    )
    gpu_util: float = Field(
        default=0.88,
        gt=0,
        le=1,
        description=f"--gpu-memory-utilization: the share (0-1) of the node's memory a rank may take. "
        f"{REFERENCE_RESTART}",
    )
    max_model_len: Tokens = Field(
        default=262_144,
        description=f"--max-model-len: the longest prompt plus answer, in tokens; also Pi's context window. "
        f"{GROUP_RESTART}",
    )
    max_num_seqs: int = Field(
        default=2,
        ge=1,
        le=1024,
        description="--max-num-seqs: requests served at once; the default CUDA graph capture sizes follow it. "
        f"{GROUP_RESTART}",
    )
    max_num_batched_tokens: Tokens = Field(
        default=2048,
        description=f"--max-num-batched-tokens: the tokens one engine step takes (prefill in chunks). {GROUP_RESTART}",
    )
    speculative: Speculative = Speculative()
    cudagraph: CudaGraph = CudaGraph()
    engram: Engram = Engram()
    backends: Backends = Backends()
    safetensors_load_strategy: ArgValue = Field(
        default="lazy",
        description=f"--safetensors-load-strategy, a fork flag: how the ranks read the weights. {REFERENCE_RESTART}",
    )
    generation_config: ArgValue = Field(
        default="vllm",
        description="--generation-config: where sampling defaults come from (vllm: vLLM's own, not the "
        f"checkpoint's). {GROUP_RESTART}",
    )
    tokenizer_mode: ArgValue = Field(
        default="deepseek_v41",
        validate_default=True,
        description=f"--tokenizer-mode (deepseek_v41 is the fork's; upstream: auto). {GROUP_RESTART}",
    )
    reasoning_parser: ArgValue | None = Field(
        default="deepseek_v41",
        validate_default=True,
        description=f"Rank 0's --reasoning-parser; null: none. {GROUP_RESTART}",
    )
    tool_call_parser: ArgValue = Field(
        default="deepseek_v41",
        validate_default=True,
        description=f"Rank 0's --tool-call-parser (tool choice is automatic). {GROUP_RESTART}",
    )
    images_per_prompt: int = Field(
        default=1,
        ge=0,
        le=64,
        description=f"Images a prompt may carry (--limit-mm-per-prompt); 0: text only, and Pi is told. {GROUP_RESTART}",
    )
    port: Port = Field(
        default=8000,
        description="The API's port: the front listens on api.bind:port (rank 0 itself on api.engine_port). "
        f"{FRONT_ONLY}",
    )
    master_port: Port = Field(
        default=29655,
        description=f"--master-port: where the ranks meet, on the head's fabric address. {GROUP_RESTART}",
    )
    shm_size: Size = Field(
        default="32g",
        description=f"Docker --shm-size of each rank: a number with k, m or g (powers of 1024). {GROUP_RESTART}",
    )
    privileged: bool = Field(
        default=True,
        description="Docker --privileged, so the ranks reach the RDMA devices; false needs them passed explicitly. "
        f"{GROUP_RESTART}",
    )
    memlock: int = Field(
        default=-1,
        ge=-1,
        le=2**50,
        description=f"Docker --ulimit memlock in bytes; -1 = unlimited (RDMA needs it). {GROUP_RESTART}",
    )
    gpus: Literal["all", "none"] = Field(
        default="all",
        description=f"Docker --gpus; 'none' only for test beds without the NVIDIA runtime. {GROUP_RESTART}",
    )
    stop_timeout_s: int = Field(
        default=60,
        ge=1,
        le=3600,
        description=f"Seconds a stopping rank gets before SIGKILL; vLLM needs more than Docker's 10 s. {GROUP_RESTART}",
    )
    # Two minutes: a long answer (4k tokens at ~50 tokens/s) takes about 80 s to finish.
    drain_s: int = Field(
        default=120,
        ge=0,
        le=3600,
        description="Seconds a planned group restart waits for requests in flight to finish (new requests get 503 "
        "with Retry-After meanwhile); 0 does not wait. A change applies to the next planned restart; nothing restarts.",
    )
    env: dict[EnvName, EnvValue] = Field(
        default=REFERENCE_ENV,
        max_length=512,
        description="The environment of both ranks' containers, as a whole (set extra_env to add to it); the "
        f"variables derived from the fabric, the EXL3 plan and the key are the reconciler's. {GROUP_RESTART}",
    )
    extra_env: dict[EnvName, EnvValue] = Field(
        default={}, max_length=512, description=f"Variables added over env on both ranks. {GROUP_RESTART}"
    )
    extra_args: list[ExtraArg] = Field(
        default=[],
        max_length=256,
        description="Extra `vllm serve` arguments, appended to rank 0's (never --api-key: the front checks the key). "
        f"{GROUP_RESTART}",
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


class MemGuard(StrictModel):
    """Stops the ranks before the shared CPU/GPU memory pool runs dry and wedges the host."""

    enabled: bool = Field(
        default=True,
        description="Run the memory guard on every node. A change starts or stops the guards (seconds); the ranks "
        "keep serving.",
    )
    floor_gib: float = Field(
        default=1.0,
        gt=0,
        le=64,
        description=f"MemAvailable floor in GiB (fractions allowed); below it the guard stops the ranks and the group "
        f"is held. {GUARD_ONLY}",
    )
    interval_s: float = Field(
        default=1.0, ge=0.1, le=60, description=f"Seconds between the guard's readings of MemAvailable. {GUARD_ONLY}"
    )
    record_s: float = Field(
        default=900,
        ge=0,
        le=7 * 86400,
        description=(
            "Seconds a rank config must have run before the guard's record of its lowest MemAvailable predicts "
            "what an edit of kv_bytes, gpu_util, max_num_seqs or max_model_len will leave (a first start takes "
            "11-13 minutes: the default holds it and a few minutes of serving). A change only changes which edits "
            "plans can predict; nothing restarts."
        ),
    )


class Tls(StrictModel):
    """TLS on the front. Without files of yours, a self-signed pair is made once on the head
    (<state_dir>/tls.pem and tls.key), kept like the API key; `status` shows its fingerprint."""

    cert_file: HostPath | None = Field(
        default=None,
        description=f"Your PEM certificate (and chain) on the head; default: <state_dir>/tls.pem, self-signed. "
        f"{FRONT_ONLY}",
    )
    key_file: HostPath | None = Field(
        default=None,
        description=f"Its PEM private key on the head, mode 0600; default: <state_dir>/tls.key. {FRONT_ONLY}",
    )


class Api(StrictModel):
    """The OpenAI-compatible API on the head, behind the front: a reverse proxy that is the only
    listener on bind:serving.port and lets through only requests with the key (and GET /health)."""

    key_file: HostPath | None = Field(
        default=None,
        description="The API key's file on the head, made with a random key when missing; default: "
        f"<state_dir>/api_key. {FRONT_ONLY} Clients then need the key in the new file.",
    )
    bind: BindIPv4 = Field(
        default="0.0.0.0",
        description=f"The IPv4 address the front listens on, with serving.port (0.0.0.0: every one). {FRONT_ONLY}",
    )
    engine_port: Port = Field(
        default=18000,
        description="Rank 0's own port, on 127.0.0.1 only: the front forwards to it. A change restarts the serving "
        "group (11-13 min without the API) and replaces the front.",
    )
    front_image: ImageRef = Field(
        default=FRONT_IMAGE,
        description="The front's image (HAProxy), pinned by digest unless image.allow_unpinned is set. A change pulls "
        "it on the head and replaces the front only (seconds); the ranks keep serving.",
    )
    tls: Tls | None = Field(
        default=None,
        description=f"null: plain HTTP. {{}}: HTTPS with a self-signed pair, or give your own files. {FRONT_ONLY}",
    )


class Startup(StrictModel):
    """How long a group start may take, and what it must pass, before it counts as failed."""

    timeout_s: Seconds = Field(
        default=2700,
        description="Seconds a group start may take until GET /v1/models answers (2700: 45 minutes; a first start "
        f"takes 11-13). {NEXT_START}",
    )
    poll_s: Seconds = Field(default=15, description=f"Seconds between readiness polls during a start. {NEXT_START}")
    smoke: Literal["all", "protocol", "off"] = Field(
        default="all",
        description="Smoke checks run after (re)starting the group: all (a sum, a tool call and an image, "
        "plus the protocol checks), protocol (models, 401, streaming only: for models that cannot answer, such as "
        f"random weights), or off. {NEXT_START}",
    )
    smoke_timeout_s: Seconds = Field(
        default=600,
        description="Longest wait, in seconds, for one smoke request after a start: an engine that hangs then fails "
        f"the smoke instead of holding `apply` and the loop for the 3600 s a smoke request may take. {NEXT_START}",
    )


class Loop(StrictModel):
    """`reconciler run`: when it looks again, and how it probes that the engine still works."""

    resync_s: Seconds = Field(
        default=300, description=f"Seconds between full passes when nothing else calls for one. {NEXT_PASS}"
    )
    liveness_s: Seconds = Field(
        default=60,
        description="Seconds between liveness probes: a one-token completion with the key (/health answers while "
        f"the engine is dead). {NEXT_PASS}",
    )
    liveness_timeout_s: Seconds = Field(
        default=60, description=f"Seconds a probe's completion may take before it counts as failed. {NEXT_PASS}"
    )
    failure_threshold: int = Field(
        default=3, ge=1, le=100, description=f"Failed probes in a row that restart the group. {NEXT_PASS}"
    )
    max_backoff_s: Seconds = Field(
        default=1800,
        description=f"Longest wait, in seconds, before a failed pass is retried (the wait doubles up to it). "
        f"{NEXT_PASS}",
    )
    # Three restarts in six hours: a first start takes 11-13 min on Sparks, so a group that
    # serves for minutes and dies again takes 15-90 min a cycle; a one-hour window would never
    # see three of them, and a fourth attempt after three failures in a row rarely goes better.
    max_restarts: int = Field(
        default=3,
        ge=1,
        le=100,
        description="Unplanned group restarts allowed within restart_window_s; one more holds the group (crash loop). "
        f"{NEXT_PASS}",
    )
    restart_window_s: Seconds = Field(
        default=21600, description=f"Seconds (6 h) in which unplanned group restarts are counted. {NEXT_PASS}"
    )
    take_upgrades: bool = Field(
        default=False,
        description=(
            "Restart a serving group by itself when only a reconciler upgrade changed how its ranks are "
            "rendered (11-13 min without the API); false: held as pending until `reconciler apply`. "
            "A change takes effect at the next pass (true then takes a pending upgrade's restart)."
        ),
    )
    metrics: Listen = Field(
        default="127.0.0.1:9464",
        description=(
            "Where `reconciler run` serves Prometheus metrics: address:port (loopback: open to this machine; "
            "any other address: the API key required, as a bearer token, over plain HTTP), or off. "
            "A change moves the endpoint at the next pass; nothing restarts."
        ),
    )
    notify: list[NotifyWord] | None = Field(
        default=None,
        min_length=1,
        max_length=64,
        description=(
            "A command `reconciler run` runs when the group is held (stop, crash loop, memory-guard trip), a "
            "memory guard or the crash-loop breaker trips, an incident is filed, and when the deployment is "
            "converged again after one of those: argv as a list (no shell), the event as one JSON object on its "
            "stdin, 30 s at most, its output in the loop's journal. A failing command never stops the loop. "
            "null: none. A change applies to the next event; nothing restarts."
        ),
    )


class Pi(StrictModel):
    """The Pi coding agent provider on the machine running the reconciler (`apply` configures a Pi
    that is installed; `reconciler pi install` installs one)."""

    enabled: bool = Field(
        default=True,
        description="Keep Pi's provider for this deployment configured; false leaves Pi's config as it is "
        f"(`reconciler pi uninstall` removes it). {PI_CONFIG}",
    )
    provider: Name = Field(default="dsv41-sparks", description=f"The provider's name in Pi's config. {PI_CONFIG}")
    set_default: bool = Field(
        default=False, description=f"Make this model Pi's default (defaultProvider, defaultModel). {PI_CONFIG}"
    )


class Deployment(StrictModel):
    """A DeepSeek-V4.1-Flash deployment over DGX Spark nodes."""

    name: Name = Field(
        default="dsv41",
        description=(
            "The deployment's name: its containers are <name>-r<rank> and <name>-front, labelled with it. A change "
            "starts a new deployment; the old name's containers are no longer this spec's and keep running, so take "
            "them down first: `reconciler uninstall` with the old spec (the checkpoint stays)."
        ),
    )
    state_dir: HostPath = Field(
        default="~/.dsv41-two-sparks",
        description=(
            "The reconciler's files on every node (API key, TLS pair, memory guard, EXL3 plans, kernel caches); '~' "
            "is each node's home. A change restarts the serving group (11-13 min without the API) and the front; "
            "nothing moves over, so a new API key is made unless api.key_file names the old one, and the memory "
            "guards started from the old state dir keep running: run `reconciler uninstall` with the old spec first."
        ),
    )
    nodes: list[Node] = Field(
        min_length=2,
        max_length=MAX_NODES,
        description="The Sparks: exactly one head; workers take ranks 1.. in list order. A change of the list (a node "
        "added, removed or moved) restarts the serving group, after the checkpoint reaches any new node.",
    )
    model: Model = Model()
    image: Image = Image()
    serving: Serving = Serving()
    memguard: MemGuard = MemGuard()
    api: Api = Api()
    startup: Startup = Startup()
    loop: Loop = Loop()
    pi: Pi = Pi()

    @field_validator("state_dir")
    @classmethod
    def _a_directory_of_its_own(cls, value: str) -> str:
        # `uninstall` removes what the reconciler wrote in it: the home or the root would mix it
        # with everything else there.
        if value.rstrip("/") in ("", "~"):
            raise _problem(
                "state_dir",
                "state_dir '{value}' is the home or the root, not a directory of the reconciler's own",
                "name a directory for it alone, e.g. ~/.dsv41-two-sparks",
                value=value,
            )
        return value

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
        return self.api.key_file or StateDir(self.state_dir).api_key

    def tls_files(self) -> tuple[str, str] | None:
        """The front's certificate and key on the head (as the spec writes them); None: no TLS."""
        tls = self.api.tls
        if tls is None:
            return None
        layout = StateDir(self.state_dir)
        return tls.cert_file or layout.tls_cert, tls.key_file or layout.tls_key

    def source_of(self, node: Node) -> Literal["head", "peer", "hub"]:
        if node.role == "head":
            return "head"
        return node.model_source or self.model.worker_source

    def image_source_of(self, node: Node) -> Literal["head", "peer", "registry"]:
        """Where a node's serving image comes from: the head always pulls from the registry
        itself ("head"); a worker as its image_source or image.worker_source says."""
        if node.role == "head":
            return "head"
        return node.image_source or self.image.worker_source


def expand_home(path: str, home: str) -> str:
    """Resolve '~' against a node's own home: the worker's home is not the head's."""
    if path == "~":
        return home
    if path.startswith("~/"):
        return f"{home.rstrip('/')}/{path[2:]}"
    return path
