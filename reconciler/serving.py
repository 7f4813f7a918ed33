"""From spec and per-node facts to each rank's exact container: argv, environment, mounts.

Pure: no I/O. The default spec renders the `vllm serve` arguments and environment the default
image is tuned with, flag for flag (a golden test holds it to that), except where docs/internals.md's
"Deliberate differences" says otherwise — chiefly the API: rank 0 listens on 127.0.0.1 only,
behind the front (reconciler/front.py), which holds the key; the engine never sees it.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from reconciler.nodeside.statedir import StateDir
from reconciler.record import Record, field, replace
from reconciler.spec import Deployment, Node, Serving, expand_home

OWNER = "spark-reconciler"
LABEL_OWNER = "io.spark-reconciler.owner"
LABEL_DEPLOYMENT = "io.spark-reconciler.deployment"
LABEL_RANK = "io.spark-reconciler.rank"
LABEL_NODE = "io.spark-reconciler.node"
LABEL_CONFIG_HASH = "io.spark-reconciler.config-hash"
LABEL_COMMIT = "io.spark-reconciler.commit"
# The host a rank started on (written when it is created, never hashed): a rank that outlived
# its boot, or runs on a kernel or driver that changed since, says so.
LABEL_BOOT_ID = "io.spark-reconciler.boot-id"
LABEL_KERNEL = "io.spark-reconciler.kernel"
LABEL_DRIVER = "io.spark-reconciler.driver"
# What a rank was rendered from (the spec's serving parts and the node's facts), digested: a
# rank whose config hash differs while these are the same was changed by the reconciler's own
# rendering (an upgrade), not by the owner or the nodes.
LABEL_INPUTS = "io.spark-reconciler.inputs"
# The names of the environment variables the reconciler set: a running container's environment
# also holds its image's (PATH and the like), which a rendering that drops a variable of ours must
# not report as dropped.
LABEL_ENV_NAMES = "io.spark-reconciler.env-names"
# The spec's parts a rank's rendering reads (what the owner set of them: a default an upgrade
# changes is the upgrade's change, not the owner's).
RENDERED_PARTS: dict[str, Any] = {
    "name": True,
    "state_dir": True,
    "nodes": True,
    "model": True,
    "image": True,
    "serving": True,
    "api": {"engine_port"},
}
# What a container of ours is when it is not a rank (no label: a rank, as every container was
# before the front).
LABEL_ROLE = "io.spark-reconciler.role"
ROLE_FRONT = "front"
# Bumped only when the hashed fields change meaning, so that upgrading the reconciler
# does not recreate every container, as unstable hashes did to docker compose users
# (see docs/sources.md). v2: the checkpoint's commit is part of the hash.
HASH_SCHEME = "v2"

# Where the front's container finds the key file (read-only).
KEY_MOUNT = "/run/secrets/dsv41-api-key"
# `$0` names the wrapper in `ps`; the argv after it is the real vllm command.
PLAIN_WRAPPER = 'exec "$@"'


class ResolvedFabric(Record):
    """The fabric a rank binds to: spec overrides win over detection."""

    ifname: str
    ip: str
    hcas: tuple[str, ...]
    gid_index: int


class NodeContext(Record):
    """What rendering needs to know about a node beyond the spec: its home, its fabric, and
    where the revision to serve is (None: the spec's model_dir and STATE_DIR/plans)."""

    home: str
    fabric: ResolvedFabric
    model_path: str | None = None
    plans_path: str | None = None
    commit: str | None = None


class Mount(Record):
    source: str
    target: str
    read_only: bool


class RankContainer(Record):
    """Everything `docker run` needs for one rank; hashable into a config label."""

    name: str
    node: str
    rank: int
    image: str
    entrypoint: tuple[str, ...]
    command: tuple[str, ...]
    env: tuple[tuple[str, str], ...]
    mounts: tuple[Mount, ...]
    shm_size: str
    stop_timeout_s: int
    # The checkpoint's commit the rank serves ('' when unknown): a new revision is a new container.
    commit: str = ""
    network_mode: str = "host"
    ipc_mode: str = "host"
    privileged: bool = True
    gpus: str = "all"
    ulimits: tuple[tuple[str, int, int], ...] = (("memlock", -1, -1),)
    # A rank that Docker restarts alone can never rejoin the group;
    # the reconciler restarts the whole group in order instead.
    restart_policy: str = "no"
    labels: dict[str, str] = field(default_factory=dict, compare=False)

    @property
    def env_dict(self) -> dict[str, str]:
        return dict(self.env)

    def config_hash(self) -> str:
        """Versioned sha256 over the fields that require a new container when they change."""
        canonical = {
            "image": self.image,
            "entrypoint": list(self.entrypoint),
            "command": list(self.command),
            "env": sorted(self.env),
            "mounts": sorted((m.source, m.target, m.read_only) for m in self.mounts),
            "shm_size": self.shm_size,
            "stop_timeout_s": self.stop_timeout_s,
            "host": [self.network_mode, self.ipc_mode, self.privileged, self.gpus, self.restart_policy],
            "ulimits": sorted(self.ulimits),
            "commit": self.commit,
        }
        digest = hashlib.sha256(json.dumps(canonical, sort_keys=True, separators=(",", ":")).encode())
        return f"{HASH_SCHEME}:{digest.hexdigest()}"


def container_name(deployment: Deployment, rank: int) -> str:
    """<name>-r<rank>: by default dsv41-r0 on the head, dsv41-r1 on the first worker."""
    return f"{deployment.name}-r{rank}"


def capture_sizes(serving: Serving) -> list[int]:
    """The spec's sizes, else 1..d, every 4th from d up to max_num_seqs*d, and that maximum (d = drafts + 1)."""
    if serving.cudagraph.capture_sizes is not None:
        return sorted(set(serving.cudagraph.capture_sizes))
    step = serving.speculative.num_speculative_tokens + 1
    cap = max_capture_size(serving)
    sizes = set(range(1, min(step, cap) + 1)) | set(range(step, cap + 1, 4)) | {cap}
    return sorted(sizes)


def max_capture_size(serving: Serving) -> int:
    return serving.max_num_seqs * (serving.speculative.num_speculative_tokens + 1)


def _compact(value: object) -> str:
    return json.dumps(value, separators=(",", ":"))


def _compilation_config(serving: Serving) -> str:
    return _compact(
        {
            "cudagraph_mode": serving.cudagraph.mode,
            "custom_ops": serving.cudagraph.custom_ops,
            "cudagraph_capture_sizes": capture_sizes(serving),
        }
    )


def _speculative_config(deployment: Deployment) -> str:
    spec = deployment.serving.speculative
    return _compact(
        {
            "method": spec.method,
            "num_speculative_tokens": spec.num_speculative_tokens,
            "draft_tensor_parallel_size": spec.draft_tensor_parallel_size or len(deployment.nodes),
            "attention_backend": spec.attention_backend,
            "draft_sample_method": spec.draft_sample_method,
            "rejection_sample_method": spec.rejection_sample_method,
            "enable_adaptive_verification": spec.enable_adaptive_verification,
        }
    )


def group_args(deployment: Deployment, master_addr: str) -> list[str]:
    """Arguments every rank gets, in a fixed order (golden-tested).

    `profile: upstream` renders only flags stock vLLM accepts on any hardware: it drops the
    fork's flags (--engram-config, --linear-backend, --moe-backend, --swa-block-size, the dspark
    speculative config) and the GPU tuning that ties `profile: reference` to GB10 (KV bytes and
    dtype, block size, CUDA graphs, attention backend).
    """
    s = deployment.serving
    size = str(len(deployment.nodes))
    tuned = s.profile != "upstream"
    gb10_memory = [
        *("--kv-cache-dtype", s.kv_cache_dtype, "--block-size", str(s.block_size)),
        *("--swa-block-size", str(s.swa_block_size), "--kv-cache-memory-bytes", str(s.kv_bytes)),
        *("--gpu-memory-utilization", str(s.gpu_util)),
    ]
    cuda_graphs = [
        *("--max-cudagraph-capture-size", str(max_capture_size(s))),
        *("--compilation-config", _compilation_config(s)),
    ]
    fork = [
        *("--safetensors-load-strategy", s.safetensors_load_strategy),
        *("--engram-config", _compact(s.engram.model_dump())),
        *("--attention-backend", s.backends.attention),
        *("--linear-backend", s.backends.linear, "--moe-backend", s.backends.moe),
        *("--speculative-config", _speculative_config(deployment)),
    ]
    images = ["--limit-mm-per-prompt", _compact({"image": s.images_per_prompt})]
    return [
        "/model",
        *("--served-model-name", s.served_model_name, "--dtype", s.dtype),
        *("--tensor-parallel-size", size, "--nnodes", size),
        *("--master-addr", master_addr, "--master-port", str(s.master_port)),
        *(gb10_memory if tuned else []),
        *("--max-model-len", str(s.max_model_len), "--max-num-seqs", str(s.max_num_seqs)),
        *("--max-num-batched-tokens", str(s.max_num_batched_tokens)),
        *(cuda_graphs if tuned else []),
        "--enable-chunked-prefill",
        *(["--async-scheduling"] if tuned else []),
        "--enable-prefix-caching",
        *(fork if tuned else []),
        *("--generation-config", s.generation_config, "--tokenizer-mode", s.tokenizer_mode),
        *(images if tuned or s.images_per_prompt > 0 else []),
    ]


# Rank 0's API answers the head only: the front is the door from anywhere else.
ENGINE_HOST = "127.0.0.1"


def rank_args(deployment: Deployment, rank: int) -> list[str]:
    """Rank 0 serves the API (on loopback, behind the front); every other rank runs headless."""
    if rank != 0:
        return ["--node-rank", str(rank), "--headless"]
    s = deployment.serving
    reasoning = ["--reasoning-parser", s.reasoning_parser] if s.reasoning_parser is not None else []
    return [
        *("--node-rank", "0", "--host", ENGINE_HOST, "--port", str(deployment.api.engine_port)),
        *reasoning,
        *("--tool-call-parser", s.tool_call_parser),
        "--enable-auto-tool-choice",
        "--enable-prompt-tokens-details",
        "--enable-force-include-usage",
        *s.extra_args,
    ]


def vllm_argv(deployment: Deployment, rank: int, master_addr: str) -> list[str]:
    return ["vllm", "serve", *group_args(deployment, master_addr), *rank_args(deployment, rank)]


def rank_env(deployment: Deployment, fabric: ResolvedFabric) -> dict[str, str]:
    """serving.env with this node's fabric pinned, then the user's extras (serving.extra_env)."""
    env = {
        **deployment.serving.env,
        "NCCL_IB_GID_INDEX": str(fabric.gid_index),
        "NCCL_IB_HCA": ",".join(fabric.hcas),
        "NCCL_SOCKET_IFNAME": fabric.ifname,
        "GLOO_SOCKET_IFNAME": fabric.ifname,
        "ST_EXL3_PLAN": f"/plans/{deployment.model.exl3_plan}",
        "VLLM_HOST_IP": fabric.ip,
    }
    if not fabric.hcas:
        # No RoCE device proven to carry the fabric address: let NCCL choose rather than
        # pin a wrong HCA list, which ends in QP timeouts.
        del env["NCCL_IB_HCA"]
    return {**env, **deployment.serving.extra_env}


def rank_mounts(deployment: Deployment, rank: int, context: NodeContext) -> tuple[Mount, ...]:
    """The revision directory read-only at /model (never model_dir's link: a later switch of the
    link must not change what a running rank sees), its staged plans, the kernel caches."""
    node = _node_of_rank(deployment, rank)
    layout = StateDir(expand_home(deployment.state_dir, context.home))
    mounts = [
        Mount(context.model_path or expand_home(node.model_dir, context.home), "/model", read_only=True),
        Mount(context.plans_path or layout.plans, "/plans", read_only=True),
        Mount(layout.engine_cache, "/cache", read_only=False),
    ]
    return tuple(mounts)


def _node_of_rank(deployment: Deployment, rank: int) -> Node:
    return dict(deployment.ranked_nodes)[rank]


def render_rank(deployment: Deployment, rank: int, contexts: dict[str, NodeContext]) -> RankContainer:
    """The complete container of one rank; `contexts` holds every node's home and fabric."""
    node = _node_of_rank(deployment, rank)
    head = deployment.head
    context = contexts[node.name]
    container = RankContainer(
        name=container_name(deployment, rank),
        node=node.name,
        rank=rank,
        image=deployment.image.ref,
        entrypoint=("/bin/sh", "-c", PLAIN_WRAPPER, f"{deployment.name}-r{rank}"),
        command=tuple(vllm_argv(deployment, rank, contexts[head.name].fabric.ip)),
        env=tuple(rank_env(deployment, context.fabric).items()),
        mounts=rank_mounts(deployment, rank, context),
        commit=context.commit or "",
        shm_size=deployment.serving.shm_size,
        stop_timeout_s=deployment.serving.stop_timeout_s,
        gpus=deployment.serving.gpus,
        privileged=deployment.serving.privileged,
        ulimits=(("memlock", deployment.serving.memlock, deployment.serving.memlock),),
    )
    labels = {
        LABEL_OWNER: OWNER,
        LABEL_DEPLOYMENT: deployment.name,
        LABEL_RANK: str(rank),
        LABEL_NODE: node.name,
        LABEL_CONFIG_HASH: container.config_hash(),
        LABEL_COMMIT: context.commit or "",
        LABEL_INPUTS: inputs_digest(deployment, rank, contexts),
        LABEL_ENV_NAMES: ",".join(sorted(name for name, _ in container.env)),
    }
    return replace(container, labels=labels)


def _context_values(context: NodeContext) -> list[object]:
    """A node's context as plain values: a renamed field in a later version is no new input."""
    fabric = context.fabric
    return [
        context.home,
        [fabric.ifname, fabric.ip, list(fabric.hcas), fabric.gid_index],
        context.model_path,
        context.plans_path,
        context.commit,
    ]


def inputs_digest(deployment: Deployment, rank: int, contexts: dict[str, NodeContext]) -> str:
    """The digest of everything a rank is rendered from (see LABEL_INPUTS)."""
    inputs = {
        "spec": deployment.model_dump(mode="json", include=RENDERED_PARTS, exclude_unset=True),
        "rank": rank,
        "contexts": {name: _context_values(contexts[name]) for name in sorted(contexts)},
    }
    return hashlib.sha256(json.dumps(inputs, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def render_group(deployment: Deployment, contexts: dict[str, NodeContext]) -> list[RankContainer]:
    return [render_rank(deployment, rank, contexts) for rank, _ in deployment.ranked_nodes]


def rewrite_exl3_plan(plan_text: str) -> str:
    """The EXL3 plan as the ranks need it: bank dirs under the read-only /model mount.

    Each bank dir in the ':'-separated "qdir" becomes /model/exl3/<its last path component>;
    nothing else changes. A trailing '/' is stripped first so ".../qn/" still names qn.
    """
    plan = json.loads(plan_text)
    banks = [directory.rstrip("/").split("/")[-1] for directory in plan["qdir"].split(":")]
    plan["qdir"] = ":".join(f"/model/exl3/{bank}" for bank in banks)
    return json.dumps(plan, indent=1) + "\n"


def api_base(deployment: Deployment) -> str:
    """Where the reconciler reaches the API, through the front: locally on the head, else the
    head's address."""
    head = deployment.head
    port = deployment.serving.port
    scheme = "https" if deployment.api.tls is not None else "http"
    if head.ssh is not None:
        return f"{scheme}://{head.ssh.host}:{port}"
    bind = deployment.api.bind
    return f"{scheme}://{'127.0.0.1' if bind == '0.0.0.0' else bind}:{port}"


def engine_base(deployment: Deployment) -> str:
    """Rank 0's own API, past the front: reachable only on the head itself."""
    return f"http://{ENGINE_HOST}:{deployment.api.engine_port}"


def flag_values(argv: list[str]) -> dict[str, str]:
    """Each `--flag` of a command line with the token after it as its value, "" when that is
    another flag or none."""
    following = [*argv[1:], "--"]  # longer than argv only when that is empty
    return {
        token: "" if value.startswith("--") else value
        for token, value in zip(argv, following, strict=False)
        if token.startswith("--")
    }
