"""The front: the one door to the API. From the spec to the front's exact container and config.

vLLM's own `--api-key` guards only its OpenAI routes: `/invocations` serves a completion
without the key, and the tokenizer, metrics, version, load and docs routes answer anyone.
So rank 0 listens on 127.0.0.1 only (api.engine_port), and the front, an HAProxy container
on the head's host network, is the only listener on api.bind:serving.port. It denies by
default: a request passes only with `Authorization: Bearer <key>`, except `GET /health`,
which load balancers and the reconciler's readiness poll need. Whatever route a later vLLM
adds is refused the same way, because the front never lists what to guard.

HAProxy because it reads the key straight from the key file (an ACL pattern file, mounted
read-only: the key is never in argv, the environment, `docker inspect` or a config we
write), answers the 401 itself, streams responses as they come (SSE needs no setting), and
costs a few microseconds a request. Its config is rendered here and holds no secret.

Pure: no I/O.
"""

from __future__ import annotations

import hashlib
import json

from reconciler.nodeside.statedir import StateDir
from reconciler.record import Record, field, replace
from reconciler.serving import (
    KEY_MOUNT,
    LABEL_CONFIG_HASH,
    LABEL_DEPLOYMENT,
    LABEL_NODE,
    LABEL_OWNER,
    LABEL_ROLE,
    OWNER,
    ROLE_FRONT,
    Mount,
)
from reconciler.spec import Deployment, expand_home

CONFIG_MOUNT = "/run/front/haproxy.cfg"
# The admin socket's directory (written by HAProxy) and the drain switch's pattern file. A drain
# adds the pattern `on` to that ACL through the socket: HAProxy answers new requests 503 at once,
# with no reload, while requests already passed on run to their end.
CONTROL_MOUNT = "/run/front/ctl"
ADMIN_SOCKET_MOUNT = f"{CONTROL_MOUNT}/admin.sock"
DRAIN_MOUNT = "/run/front/drain.acl"
DRAIN_ON = "on"
# What a client is told to wait before it asks again while the group restarts.
RETRY_AFTER_S = 30
DRAINING_BODY = '{"error":"the deployment is restarting; retry later"}'
# HAProxy loads the key beside a certificate without one: <crt>.key.
TLS_CERT_MOUNT = "/run/front/tls.pem"
TLS_KEY_MOUNT = TLS_CERT_MOUNT + ".key"
# The files the front reads at its start, whose versions it is labelled with.
SECRET_MOUNTS = (KEY_MOUNT, TLS_CERT_MOUNT, TLS_KEY_MOUNT)
# Bumped only when the hashed fields change meaning (see serving.HASH_SCHEME).
HASH_SCHEME = "front-v1"
# The versions (mtime, inode, size) of the key file and the TLS pair the running front read at its
# start: a rotated key or certificate gives another, and the front is replaced to read it.
LABEL_KEY_VERSION = "io.spark-reconciler.key-version"
# A prefill of 262,144 tokens takes minutes; no answer of the engine's is cut before an hour.
ENGINE_TIMEOUT_S = 3600
# A client silent this long while it should send (a TLS handshake, a request body) is dropped:
# HAProxy does not apply it while the engine prepares an answer (`timeout server` does).
CLIENT_IDLE_S = 60
# A client must send its request's headers within this: idle or trickling connections do not
# hold the front's slots.
REQUEST_HEADERS_TIMEOUT_S = 30
MAX_CONNECTIONS = 1024
# HAProxy stops at once; its clients retry.
GRACE_S = 5
UNAUTHORIZED_BODY = '{"error":"Unauthorized"}'


def haproxy_config(
    bind: str,
    port: int,
    engine_port: int,
    key_path: str,
    tls_cert: str | None = None,
    *,
    admin_socket: str = ADMIN_SOCKET_MOUNT,
    drain_file: str = DRAIN_MOUNT,
) -> str:
    """The front's whole config: deny by default, the key from `key_path`, rank 0 behind it.

    The key is compared as the whole header after "Bearer " (one Authorization header only, read
    whole: `fhdr`, not split at commas), against the key file's line; the header is dropped before
    the request goes on, so the key never reaches the engine or its logs. The health exception
    matches the request's target exactly (`url`, not `path`, which HAProxy derives from
    absolute-form targets too). While draining (the pattern `on` added to `drain_file`'s ACL
    through `admin_socket`), every request that passes the key check is answered 503 with
    Retry-After, `GET /health` included, so balancers stop sending too."""
    return f"""# Written by spark-reconciler: the front of the API. Edits are replaced on the next apply.
global
    log stdout format raw local0
    maxconn {MAX_CONNECTIONS}
    stats socket {admin_socket} mode 600 level admin

defaults
    mode http
    log global
    option httplog
    option dontlognull
    option forwardfor
    # Each streamed token goes out at once: without this HAProxy marks small sends "more to
    # come" (MSG_MORE), and the kernel holds a stream's chunks until its last one.
    option http-no-delay
    timeout connect 5s
    timeout http-request {REQUEST_HEADERS_TIMEOUT_S}s
    timeout http-keep-alive 60s
    timeout client {CLIENT_IDLE_S}s
    timeout server {ENGINE_TIMEOUT_S}s
    timeout tunnel {ENGINE_TIMEOUT_S}s

frontend api
    bind {bind}:{port}{f" ssl crt {tls_cert}" if tls_cert else ""}
    acl health_check method GET
    acl health_path url /health
    acl one_authorization req.fhdr_cnt(authorization) eq 1
    acl bearer req.fhdr(authorization) -m beg "Bearer "
    acl right_key req.fhdr(authorization),bytes(7) -m str -f {key_path}
    http-request return status 401 content-type application/json string '{UNAUTHORIZED_BODY}' \
hdr WWW-Authenticate Bearer unless health_check health_path or one_authorization bearer right_key
    acl draining str({DRAIN_ON}) -m str -f {drain_file}
    http-request return status 503 content-type application/json string '{DRAINING_BODY}' \
hdr Retry-After {RETRY_AFTER_S} if draining
    http-request del-header authorization
    # The engine trusts what comes from 127.0.0.1: a client's own forwarding headers must not pass.
    http-request del-header x-forwarded-for
    http-request del-header x-forwarded-proto
    http-request del-header x-forwarded-host
    http-request del-header forwarded
    default_backend engine

backend engine
    server rank0 127.0.0.1:{engine_port}
"""


class FrontContainer(Record):
    """Everything `docker run` needs for the front; hashable into a config label."""

    name: str
    node: str
    image: str
    entrypoint: tuple[str, ...]
    command: tuple[str, ...]
    mounts: tuple[Mount, ...]
    config: str
    config_path: str
    network_mode: str = "host"
    restart_policy: str = "unless-stopped"
    stop_timeout_s: int = GRACE_S
    labels: dict[str, str] = field(default_factory=dict, compare=False)

    def config_hash(self) -> str:
        canonical = {
            "image": self.image,
            "entrypoint": list(self.entrypoint),
            "command": list(self.command),
            "mounts": sorted((m.source, m.target, m.read_only) for m in self.mounts),
            "config": self.config,
            "host": [self.network_mode, self.restart_policy, self.stop_timeout_s],
        }
        digest = hashlib.sha256(json.dumps(canonical, sort_keys=True, separators=(",", ":")).encode())
        return f"{HASH_SCHEME}:{digest.hexdigest()}"


def files_version(versions: list[str | None]) -> str:
    """One label value for the versions of the files the front reads (the key, the TLS pair)."""
    return "|".join(version or "-" for version in versions)


def front_name(deployment: Deployment) -> str:
    return f"{deployment.name}-front"


def render_front(deployment: Deployment, head_home: str) -> FrontContainer:
    """The front's container on the head, its config in the head's state dir."""
    head = deployment.head
    tls = deployment.tls_files()
    api = deployment.api
    config = haproxy_config(api.bind, deployment.serving.port, api.engine_port, KEY_MOUNT, tls and TLS_CERT_MOUNT)
    layout = StateDir(expand_home(deployment.state_dir, head_home))
    config_path = layout.front_config
    mounts = [
        Mount(config_path, CONFIG_MOUNT, read_only=True),
        Mount(expand_home(deployment.key_file(), head_home), KEY_MOUNT, read_only=True),
        Mount(layout.front_ctl, CONTROL_MOUNT, read_only=False),
        Mount(layout.front_drain, DRAIN_MOUNT, read_only=True),
    ]
    if tls is not None:
        cert, key = (expand_home(path, head_home) for path in tls)
        mounts += [Mount(cert, TLS_CERT_MOUNT, read_only=True), Mount(key, TLS_KEY_MOUNT, read_only=True)]
    container = FrontContainer(
        name=front_name(deployment),
        node=head.name,
        image=deployment.api.front_image,
        entrypoint=("haproxy",),
        command=("-db", "-f", CONFIG_MOUNT),
        mounts=tuple(mounts),
        config=config,
        config_path=config_path,
    )
    labels = {
        LABEL_OWNER: OWNER,
        LABEL_DEPLOYMENT: deployment.name,
        LABEL_ROLE: ROLE_FRONT,
        LABEL_NODE: head.name,
        LABEL_CONFIG_HASH: container.config_hash(),
    }
    return replace(container, labels=labels)


def drain_switch(deployment: Deployment) -> tuple[str, str]:
    """The front's admin socket on the head (as the spec names the state dir; the head expands
    `~`) and the ACL its drain turns on."""
    return StateDir(deployment.state_dir).front_admin_socket, DRAIN_MOUNT
