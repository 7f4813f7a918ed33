"""Ask the deployment one question from inside the head, the key read from its file.

Used by `make demo`. The key never reaches argv or the environment: it goes from the key
file straight into the request header.
"""

from __future__ import annotations

import json
import sys
import urllib.request

KEY_FILE = "/srv/spark/state/api_key"
URL = "http://127.0.0.1:8000/v1/chat/completions"


def main(question: str) -> int:
    with open(KEY_FILE, encoding="utf-8") as handle:
        key = handle.read().strip()
    body = {"model": "deepseek-v4.1-flash", "messages": [{"role": "user", "content": question}]}
    request = urllib.request.Request(
        URL,
        data=json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        answer = json.loads(response.read())
    print(f"Q: {question}\nA: {answer['choices'][0]['message']['content']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(" ".join(sys.argv[1:]) or "What is 17 * 23?"))
