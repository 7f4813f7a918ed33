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

    @property
    def login(self) -> str:
        """`[user@]host`, as the user gave it to ssh."""
        return f"{self.user + '@' if self.user else ''}{self.host}"


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
    endpoint: Url | None = Field(
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


class Image(StrictModel):
    """The serving image; pinned by digest so both ranks run the same bytes."""

    allow_unpinned: bool = Field(default=False, description="Accept a tag instead of a digest.")
    ref: ImageRef = REFERENCE_IMAGE

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
    kv_bytes: Bytes = Field(
        default=2_700_000_000,
        ge=1,
        le=128 * GIB,
        description=(
            "--kv-cache-memory-bytes per rank (the default, 2.7GB, holds 2,023,717 tokens); bytes, or with a "
            "unit: 2.7GB (1000s) or 2.5GiB (1024s). A change restarts the group."
        ),
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
    shm_size: Size = Field(default="32g", description="Docker --shm-size.")
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
    # Two minutes: a long answer (4k tokens at ~50 tokens/s) takes about 80 s to finish.
    drain_s: int = Field(
        default=120,
        ge=0,
        le=3600,
        description="A planned group restart first lets requests in flight finish, waiting at most this long "
        "(new requests get 503 with Retry-After meanwhile); 0 does not wait.",
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
    record_s: float = Field(
        default=900,
        ge=0,
        le=7 * 86400,
        description=(
            "How long a rank config must have run before the guard's record of its lowest MemAvailable predicts "
            "what an edit of kv_bytes, gpu_util, max_num_seqs or max_model_len will leave (a first start takes "
            "11-13 minutes: the default holds it and a few minutes of serving)."
        ),
    )


class Tls(StrictModel):
    """TLS on the front. Without files of yours, a self-signed pair is made once on the head
    (<state_dir>/tls.pem and tls.key), kept like the API key; `status` shows its fingerprint."""

    cert_file: HostPath | None = Field(default=None, description="Your PEM certificate (and chain) on the head.")
    key_file: HostPath | None = Field(default=None, description="Its PEM private key on the head, mode 0600.")


class Api(StrictModel):
    """The OpenAI-compatible API on the head, behind the front: a reverse proxy that is the only
    listener on bind:serving.port and lets through only requests with the key (and GET /health)."""

    key_file: HostPath | None = Field(default=None, description="Default: <state_dir>/api_key.")
    bind: BindIPv4 = Field(default="0.0.0.0", description="Where the front listens, on serving.port.")
    engine_port: Port = Field(
        default=18000, description="Rank 0's own port, on 127.0.0.1 only: the front forwards to it."
    )
    front_image: ImageRef = Field(
        default=FRONT_IMAGE,
        description="The front's image (HAProxy), pinned by digest unless image.allow_unpinned is set.",
    )
    tls: Tls | None = Field(default=None, description="null: plain HTTP. {}: HTTPS with a self-signed pair.")


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
    # Three restarts in six hours: a first start takes 11-13 min on Sparks, so a group that
    # serves for minutes and dies again takes 15-90 min a cycle; a one-hour window would never
    # see three of them, and a fourth attempt after three failures in a row rarely goes better.
    max_restarts: int = Field(
        default=3,
        ge=1,
        le=100,
        description="Unplanned group restarts allowed within restart_window_s; one more holds the group (crash loop).",
    )
    restart_window_s: Seconds = Field(
        default=21600, description="The window unplanned group restarts are counted in (6 h)."
    )
    take_upgrades: bool = Field(
        default=False,
        description=(
            "Restart a serving group by itself when only a reconciler upgrade changed how its ranks are "
            "rendered (11-13 min without the API); false: held as pending until `reconciler apply`."
        ),
    )
    metrics: Listen = Field(
        default="127.0.0.1:9464",
        description=(
            "Where `reconciler run` serves Prometheus metrics: address:port (loopback: open to this machine; "
            "any other address: the API key required, as a bearer token, over plain HTTP), or off."
        ),
    )


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


def expand_home(path: str, home: str) -> str:
    """Resolve '~' against a node's own home: the worker's home is not the head's."""
    if path == "~":
        return home
    if path.startswith("~/"):
        return f"{home.rstrip('/')}/{path[2:]}"
    return path
