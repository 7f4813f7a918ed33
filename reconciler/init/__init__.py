"""`reconciler init`: a first spec written from what the nodes say, every choice with its reason.

Writing the first spec by hand is where most setups go wrong: the fabric port, its address and
HCAs, the home a `~` means on each node, a model dir on a disk too small for the checkpoint.
Init probes every node once (the doctor's probe, over the same transports as every pass) and
drafts the spec from the answers. Two halves, so the interesting one is tested on fixture data:

    request.py    what init was asked for, checked, and what the nodes answered
    probe.py      probing every node (the only I/O), host keys checked as everywhere
    draft.py      the answers turned into spec text (pure), each value with its reason
    yamltext.py   writing YAML lines with comments, quoting exactly when YAML needs it
"""

from reconciler.init.draft import Draft, draft, next_steps, validated
from reconciler.init.probe import probe_nodes, unknown_host_keys
from reconciler.init.request import (
    DEFAULT_MODEL_DIR,
    REVIEW,
    InitRequest,
    Probed,
    check_distinct,
    checked_model_dir,
    login,
    probed_from_answers,
    provisional,
    ssh_target,
)
from reconciler.init.yamltext import flow_scalar, quoted, scalar

__all__ = [
    "DEFAULT_MODEL_DIR",
    "REVIEW",
    "Draft",
    "InitRequest",
    "Probed",
    "check_distinct",
    "checked_model_dir",
    "draft",
    "flow_scalar",
    "login",
    "next_steps",
    "probe_nodes",
    "probed_from_answers",
    "provisional",
    "quoted",
    "scalar",
    "ssh_target",
    "unknown_host_keys",
    "validated",
]
