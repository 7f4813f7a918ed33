"""The desired state of a deployment, and how it is read from YAML.

values.py    each constrained value a field may hold, checked with a located problem
model.py     the deployment as pydantic models, with every default
loading.py   reading YAML: problems at file:line:column with a hint, cross-field checks, warnings
schema.py    the JSON schema `reconciler schema` writes, and the copy the package ships
reference.py docs/spec.md, the spec's reference for people, from the schema
"""

from reconciler.spec.loading import LoadedSpec as LoadedSpec
from reconciler.spec.loading import load_spec as load_spec
from reconciler.spec.loading import parse_spec as parse_spec
from reconciler.spec.loading import read_spec_text as read_spec_text
from reconciler.spec.model import GROUP_RESTART as GROUP_RESTART
from reconciler.spec.model import REFERENCE_ENV as REFERENCE_ENV
from reconciler.spec.model import REFERENCE_IMAGE as REFERENCE_IMAGE
from reconciler.spec.model import REFERENCE_RESTART as REFERENCE_RESTART
from reconciler.spec.model import Deployment as Deployment
from reconciler.spec.model import Fabric as Fabric
from reconciler.spec.model import Loop as Loop
from reconciler.spec.model import Model as Model
from reconciler.spec.model import Node as Node
from reconciler.spec.model import Pi as Pi
from reconciler.spec.model import Serving as Serving
from reconciler.spec.model import SshTarget as SshTarget
from reconciler.spec.model import expand_home as expand_home
from reconciler.spec.schema import schema_text as schema_text
from reconciler.spec.values import HostPath as HostPath
from reconciler.spec.values import names_api_key as names_api_key
