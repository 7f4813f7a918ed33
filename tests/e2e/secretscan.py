"""Looking for a secret the way a leak would carry it: as it is, or encoded.

A log line, a status file or a container's config can hold a secret as plain text, base64 (in
any alignment, inside a longer encoded string), hex, URL-encoded or JSON-escaped; each form is
searched for, so a leak cannot hide behind an encoding the scan does not know.
"""

from __future__ import annotations

import base64
import binascii
import json
import urllib.parse

# The last base64 group of an encoded run also depends on what follows the secret.
_TAIL = 4


def forms(secret: str) -> dict[str, str]:
    """Each encoding of `secret` a leak could carry, by name; every value is at least 16 characters."""
    raw = secret.encode()
    found = {
        "plain": secret,
        "hex": binascii.hexlify(raw).decode(),
        "HEX": binascii.hexlify(raw).decode().upper(),
        "url-encoded": urllib.parse.quote(secret, safe=""),
        "url-encoded+": urllib.parse.quote_plus(secret),
        "json-escaped": json.dumps(secret)[1:-1],
    }
    for offset in range(3):
        # Preceded by `offset` bytes, the secret's own base64 starts at the first whole group.
        for name, encode in (("base64", base64.b64encode), ("base64url", base64.urlsafe_b64encode)):
            encoded = encode(b"\0" * offset + raw).decode().rstrip("=")
            found[f"{name}@{offset}"] = encoded[(4 if offset else 0) : -_TAIL]
    return found


def leaks(text: str, secrets: dict[str, str]) -> list[str]:
    """'<secret name> as <form>' for each form of each secret found in `text`."""
    found = []
    for name, secret in secrets.items():
        found += [f"{name} as {form}" for form, value in forms(secret).items() if value in text]
    return found
