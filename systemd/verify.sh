#!/bin/sh
# `make service-check`: `systemd-analyze verify` on the unit that `reconciler install-service`
# renders for this machine (verify needs ExecStart= to exist, so the example in this folder,
# written for another machine, cannot be checked as is). verify exits 0 on unknown or
# malformed directives (it only warns), so any output at all fails the check.
set -eu
reconciler=$1
spec=$2

if ! command -v systemd-analyze >/dev/null 2>&1; then
    if [ "$(id -u)" != 0 ]; then
        echo "service-check: systemd-analyze is missing and installing it needs root: skipped"
        exit 0
    fi
    echo "service-check: installing systemd (for systemd-analyze)"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq systemd >/dev/null
fi

dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
unit="$dir/spark-reconciler.service"
"$reconciler" install-service --spec "$spec" --dry-run >"$unit"
if ! systemd-analyze verify "$unit" >"$dir/verify.log" 2>&1 || [ -s "$dir/verify.log" ]; then
    cat "$unit" "$dir/verify.log"
    echo "service-check: systemd-analyze verify found the problems above in the rendered unit" >&2
    exit 1
fi
exposure=$(systemd-analyze security --offline=yes "$unit" 2>/dev/null | tail -n 1 || true)
echo "service-check: the rendered unit verifies ($(systemd-analyze --version | head -n 1)); ${exposure#→ }"
