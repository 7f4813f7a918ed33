"""The spec's JSON schema, as `reconciler schema` writes it."""

from __future__ import annotations

import json

from reconciler.spec.model import Deployment


def schema_text() -> str:
    """The JSON Schema editors use to validate specs (yaml-language-server modeline)."""
    schema = Deployment.model_json_schema()
    schema = {**schema, "title": "spark-reconciler deployment"}
    schema = {"$schema": "https://json-schema.org/draft/2020-12/schema", **schema}
    return json.dumps(schema, indent=2, sort_keys=False) + "\n"
