"""The desired state of a deployment, and how it is read from YAML.

values.py    each constrained value a field may hold, checked with a located problem
model.py     the deployment as pydantic models, with every default
loading.py   reading YAML: problems at file:line:column with a hint, cross-field checks, warnings
schema.py    the JSON schema `reconciler schema` writes
"""

from reconciler.spec.loading import LoadedSpec, cross_check, load_spec, parse_spec, read_spec_text
from reconciler.spec.model import (
    REFERENCE_ENV,
    REFERENCE_IMAGE,
    Api,
    Deployment,
    Fabric,
    Image,
    Loop,
    MemGuard,
    Model,
    Node,
    Pi,
    Serving,
    SshTarget,
    Startup,
    expand_home,
)
from reconciler.spec.schema import schema_text
from reconciler.spec.values import MAX_NODES, HostPath, names_api_key, size_bytes

__all__ = [
    "MAX_NODES",
    "REFERENCE_ENV",
    "REFERENCE_IMAGE",
    "Api",
    "Deployment",
    "Fabric",
    "HostPath",
    "Image",
    "LoadedSpec",
    "Loop",
    "MemGuard",
    "Model",
    "Node",
    "Pi",
    "Serving",
    "SshTarget",
    "Startup",
    "cross_check",
    "expand_home",
    "load_spec",
    "names_api_key",
    "parse_spec",
    "read_spec_text",
    "schema_text",
    "size_bytes",
]
