"""Every file and directory under a node's state dir (the spec's `state_dir`), named once.

The node-side programs, the facts, the executors and the commands all reach these files; each
asks this layout for a path instead of spelling the name. It is stdlib only and has no
`from __future__` line, because `nodeside.source` ships it inside the node-side programs that
use it (a node has python3 and nothing of ours).

Which node holds what: the head keeps the checkpoint record, the Hub listings, the restart
intent, the hold, the loop's status and lock; every node keeps its hash cache, memory guard,
staged EXL3 plans, the engine's compile cache and the copy daemon's files.
"""

import os


class StateDir:
    """The paths under one state dir, as the node (or the head, for its own) names them."""

    def __init__(self, root: str) -> None:
        # `~` stays as written when the head names a path on a node: the node expands it.
        self.root = root.rstrip("/") or "/"
        # The checkpoint: which commits the node served, and what a branch or tag resolved to.
        self.checkpoint_record = self._at("checkpoint.json")
        # name -> size, mtime and sha256 of each model file hashed: a verify hashes only what changed.
        self.hash_cache = self._at("hashcache.json")
        # The Hub's file listings the head cached, one file per commit: later passes need no Hub.
        self.hub_listings = self._at("hub")
        # The listing a model dir from before revisions was downloaded with: tells its commit.
        self.legacy_listing = self._at("hub-files.json")
        # The EXL3 plan each revision's ranks read, rewritten for the mount (mounted at /plans).
        self.plans = self._at("plans")
        # The engine's compile and RoCE caches (mounted at /cache), kept across restarts.
        self.engine_cache = self._at("cache")
        # The rsync daemon a copy over the fabric starts on the destination, with its secrets.
        self.copy_daemon = self._at("copy-daemon")
        # The image's copy has a daemon of its own: it runs beside the checkpoint's.
        self.image_copy_daemon = self._at("copy-daemon-image")
        # The API key, on the head (the default of api.key_file): random, mode 0600, never printed.
        self.api_key = self._at("api_key")
        # The front's HAProxy config, mounted read-only into its container (it holds no secret).
        self.front_config = self._at("front.cfg")
        # The front's admin socket (a directory HAProxy writes) and the drain switch's pattern
        # file (empty: the reconciler adds the switch at run time, through the socket).
        self.front_ctl = self._at("front-ctl")
        self.front_admin_socket = f"{self.front_ctl}/admin.sock"
        self.front_drain = self._at("front-drain.acl")
        # The front's self-signed TLS pair (api.tls without files of yours): made once, kept.
        self.tls_cert = self._at("tls.pem")
        self.tls_key = self._at("tls.key")
        # A group restart begun and not yet ready: a reconciler that dies mid-restart resumes it.
        self.restart_intent = self._at("restart-intent.json")
        # Unplanned group restarts as they began, and the crash-loop breaker's trip they led to.
        self.restarts = self._at("restarts.json")
        self.breaker = self._at("breaker.json")
        # A directory per unplanned failure: logs, exit codes, facts and the plan that followed.
        self.incidents = self._at("incidents")
        # `reconciler stop`: the ranks stay down until `reconciler start`.
        self.hold = self._at("hold.json")
        # What the loop is doing, for `reconciler status` and `systemctl status`.
        self.loop_status = self._at("loop-status.json")
        # One converge at a time on the head.
        self.lock = self._at("reconciler.lock")
        # The memory guard: its program, settings, pid, log and the trip it records.
        self.guard_program = self._at("memguard.py")
        self.guard_config = self._at("memguard.json")
        self.guard_pid = self._at("memguard.pid")
        self.guard_log = self._at("memguard.log")
        self.guard_trip = self._at("memguard.trip.json")
        # A record per image the reconciler pulled on this node (uninstall and storage remove
        # only those: an image the owner pulled is never ours to delete).
        self.pulled_images = self._at("pulled")
        # The serving image as its registry sent it (manifests and compressed layers by digest), on
        # the nodes that pass it on over the fabric: Docker keeps only the unpacked layers.
        self.image_store = self._at("images")
        # Each window's lowest MemAvailable and the rank configs that ran through it.
        self.guard_record = self._at("memguard.record.json")

    def _at(self, name: str) -> str:
        return f"{self.root.rstrip('/')}/{name}"

    def expanded(self) -> "StateDir":
        """The same layout with `~` expanded on the machine this runs on."""
        return StateDir(os.path.expanduser(self.root))

    def hub_listing(self, repo: str, commit: str) -> str:
        return f"{self.hub_listings}/{repo.replace('/', '--')}@{commit}.json"

    def plans_of(self, commit: str) -> str:
        return f"{self.plans}/{commit}"

    def staged_plan(self, commit: str, name: str) -> str:
        return f"{self.plans_of(commit)}/{name}"
