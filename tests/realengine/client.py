"""Requests to the API from inside the head node (stdlib only; the key goes from its file to a header).

    python3 tests/realengine/client.py health            -> {"status": 200}
    python3 tests/realengine/client.py complete [N]      -> {"status": ..., "finish_reason": ..., "usage": ...}
    python3 tests/realengine/client.py stream N          -> one JSON line per event: first token, then the end

`stream` prints {"event": "first"} as soon as the first token arrives (a test kills a rank
then), and finally {"event": "end", "tokens": n, "error": "..."} however the stream ended.
"""

from __future__ import annotations

import json
import sys
import urllib.error
import urllib.request

KEY_FILE = "/srv/spark/state/api_key"
BASE = "http://127.0.0.1:8000"
MODEL = "deepseek-v4.1-flash"


def _request(path: str, body: dict[str, object] | None = None) -> urllib.request.Request:
    with open(KEY_FILE, encoding="utf-8") as handle:
        key = handle.read().strip()
    data = json.dumps(body).encode() if body is not None else None
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    return urllib.request.Request(BASE + path, data=data, headers=headers)


def health() -> dict[str, object]:
    try:
        with urllib.request.urlopen(BASE + "/health", timeout=5) as response:
            return {"status": response.status}
    except urllib.error.HTTPError as exc:
        return {"status": exc.code}
    except OSError as exc:
        return {"status": None, "error": f"{type(exc).__name__}: {exc}"}


def complete(max_tokens: int) -> dict[str, object]:
    body = {"model": MODEL, "prompt": "ping", "max_tokens": max_tokens}
    try:
        with urllib.request.urlopen(_request("/v1/completions", body), timeout=60) as response:
            answer = json.loads(response.read())
        choice = answer["choices"][0]
        return {"status": 200, "finish_reason": choice["finish_reason"], "usage": answer["usage"]}
    except urllib.error.HTTPError as exc:
        return {"status": exc.code, "body": exc.read().decode(errors="replace")[:300]}
    except OSError as exc:
        return {"status": None, "error": f"{type(exc).__name__}: {exc}"}


def stream(max_tokens: int) -> None:
    body = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": max_tokens, "stream": True}
    tokens, error = 0, None
    try:
        with urllib.request.urlopen(_request("/v1/completions", body), timeout=120) as response:
            for raw in response:
                line = raw.decode().strip()
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                tokens += 1
                if tokens == 1:
                    print(json.dumps({"event": "first"}), flush=True)
    except urllib.error.HTTPError as exc:
        error = f"HTTP {exc.code}"
    except Exception as exc:  # whatever the dying engine does to the connection is the result
        error = f"{type(exc).__name__}: {exc}"
    print(json.dumps({"event": "end", "tokens": tokens, "error": error}), flush=True)


def main(argv: list[str]) -> int:
    command, count = argv[0], int(argv[1]) if len(argv) > 1 else 1
    if command == "stream":
        stream(count)
    else:
        print(json.dumps(health() if command == "health" else complete(count)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
