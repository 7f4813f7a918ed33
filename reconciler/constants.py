"""Names and defaults the command line shows before it has loaded anything heavy.

Each is defined here once and imported by the module that uses it, so `reconciler --help` and
`--version` can print them without importing pydantic, docker, paramiko or the Hub client.
This module imports only `os`.
"""

import os

DEFAULT_SPEC_PATH = "specs/deployment.yaml"
SPEC_PATH_ENV = "RECONCILER_SPEC"
SCHEMA_PATH = "schemas/deployment.schema.json"
# The spec's reference for people, written from the model by `reconciler schema --markdown`.
SPEC_DOC_PATH = "docs/spec.md"


def default_spec_path() -> str:
    return os.environ.get(SPEC_PATH_ENV) or DEFAULT_SPEC_PATH


UNIT_NAME = "spark-reconciler.service"
UNIT_DIR = "/etc/systemd/system"

# The bench's decode prompts, by kind (the prompts themselves live in verify/benchmark/prompts.py):
# prose and code by default, and `random`, the workload of `vllm bench serve` (random
# token ids of --input-len, exactly --max-tokens out), to set our figures next to its own.
DECODE_KINDS = ("prose", "code")
RANDOM_KIND = "random"
ALL_DECODE_KINDS = (*DECODE_KINDS, RANDOM_KIND)

# Exit codes, the same for every command.
EXIT_OK = 0
EXIT_ERROR = 1  # also a usage error: argparse's 2 would read as "changes"
EXIT_CHANGES = 2  # plan --detailed-exitcode: the plan has actions
EXIT_NOT_CONVERGED = 2  # status: the deployment differs from the spec
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as shells report a Ctrl-C

PI_PROVIDER = "dsv41-sparks"
PI_KEY_ENV = "DSV41_API_KEY"
