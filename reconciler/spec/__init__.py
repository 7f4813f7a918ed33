"""The desired state of a deployment, and how it is read from YAML.

values.py    each constrained value a field may hold, checked with a located problem
model.py     the deployment as pydantic models, with every default
loading.py   reading YAML: problems at file:line:column with a hint, cross-field checks, warnings
schema.py    the JSON schema `reconciler schema` writes
"""

from reconciler.spec.loading import LoadedSpec, load_spec, parse_spec, read_spec_text
from reconciler.spec.model import (
    REFERENCE_ENV,
    REFERENCE_IMAGE,
    Deployment,
    Fabric,
    Loop,
    Model,
    Node,
    Pi,
    Serving,
    SshTarget,
    expand_home,
)
from reconciler.spec.schema import schema_text
from reconciler.spec.values import HostPath, names_api_key

__all__ = [
    "REFERENCE_ENV",
    "REFERENCE_IMAGE",
    "Deployment",
    "Fabric",
    "HostPath",
    "LoadedSpec",
    "Loop",
    "Model",
    "Node",
    "Pi",
    "Serving",
    "SshTarget",
    "expand_home",
    "load_spec",
    "names_api_key",
    "parse_spec",
    "read_spec_text",
    "schema_text",
]
