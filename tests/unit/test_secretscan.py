"""The end-to-end secret scan (tests/e2e/secretscan.py) finds a secret in each form a leak can
take, wherever it sits in a longer text, and nothing where there is none."""

from __future__ import annotations

import base64
import json
import urllib.parse

import pytest

from tests.e2e.secretscan import leaks

KEY = "sk-e2eScan_Key-0123456789abcdefghijklmnopqrstuvw"
SECRETS = {"API key": KEY}


@pytest.mark.parametrize("before", ["", "B", "Be", "Bearer ", "Authorization: Bearer "])
@pytest.mark.parametrize("after", ["", "x", "xy", "\n"])
def test_base64_is_found_in_every_alignment(before: str, after: str) -> None:
    for encode in (base64.b64encode, base64.urlsafe_b64encode):
        text = "log: " + encode(f"{before}{KEY}{after}".encode()).decode() + " end"
        assert leaks(text, SECRETS), (before, after)


@pytest.mark.parametrize(
    "spelled",
    [
        KEY,
        KEY.encode().hex(),
        KEY.encode().hex().upper(),
        urllib.parse.quote(f"key={KEY}&x", safe=""),
        json.dumps({"header": f'Bearer "{KEY}"'}),
    ],
)
def test_each_encoding_is_found_inside_a_longer_text(spelled: str) -> None:
    assert leaks(f"prefix {spelled} suffix", SECRETS)


def test_a_text_without_the_secret_is_clean() -> None:
    near = KEY[:-4] + "XXXX"
    clean = " ".join([near, base64.b64encode(near.encode()).decode(), near.encode().hex(), "(redacted)"])
    assert leaks(clean, SECRETS) == []
