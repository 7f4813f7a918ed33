"""The committed JSON Schema stays in step with the spec model."""

from __future__ import annotations

import json

from reconciler.constants import SCHEMA_PATH
from reconciler.spec import schema_text
from tests.scenarios import ROOT, SPEC_PATH


def test_committed_schema_is_current() -> None:
    committed = (ROOT / SCHEMA_PATH).read_text(encoding="utf-8")
    assert committed == schema_text(), "stale schema: run `.venv/bin/reconciler schema` and commit it"


def test_schema_is_strict_and_documents_defaults() -> None:
    schema = json.loads(schema_text())
    assert schema["additionalProperties"] is False
    serving = schema["$defs"]["Serving"]["properties"]
    assert serving["kv_bytes"]["default"] == 2_700_000_000
    assert serving["port"]["maximum"] == 65535


def test_shipped_spec_carries_the_schema_modeline() -> None:
    first_line = SPEC_PATH.read_text(encoding="utf-8").splitlines()[0]
    assert first_line == "# yaml-language-server: $schema=../schemas/deployment.schema.json"
