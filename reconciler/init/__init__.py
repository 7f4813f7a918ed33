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

from reconciler.init.draft import Draft as Draft
from reconciler.init.draft import draft as draft
from reconciler.init.draft import next_steps as next_steps
from reconciler.init.draft import validated as validated
from reconciler.init.probe import probe_nodes as probe_nodes
from reconciler.init.probe import unknown_host_keys as unknown_host_keys
from reconciler.init.request import DEFAULT_MODEL_DIR as DEFAULT_MODEL_DIR
from reconciler.init.request import REVIEW as REVIEW
from reconciler.init.request import InitRequest as InitRequest
from reconciler.init.request import Probed as Probed
from reconciler.init.request import check_distinct as check_distinct
from reconciler.init.request import checked_model_dir as checked_model_dir
from reconciler.init.request import probed_from_answers as probed_from_answers
from reconciler.init.request import provisional as provisional
from reconciler.init.request import ssh_target as ssh_target
from reconciler.init.yamltext import flow_scalar as flow_scalar
from reconciler.init.yamltext import quoted as quoted
from reconciler.init.yamltext import scalar as scalar
