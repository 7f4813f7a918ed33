#!/bin/sh
# Run a Makefile target on a fresh Debian machine: installs make and python3-venv first
# when they are missing (needs root or sudo for that step only), then hands over to make.
set -eu
cd "$(dirname "$0")"

need_packages=""
command -v make >/dev/null 2>&1 || need_packages="$need_packages make"
command -v python3 >/dev/null 2>&1 || need_packages="$need_packages python3"
if command -v python3 >/dev/null 2>&1 && ! python3 -c 'import venv, ensurepip' >/dev/null 2>&1; then
    need_packages="$need_packages python3-venv"
fi

if [ -n "$need_packages" ]; then
    echo "installing:$need_packages" >&2
    sudo_cmd=""
    [ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
    $sudo_cmd apt-get update -qq
    # shellcheck disable=SC2086
    DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq $need_packages >/dev/null
fi

exec make --no-print-directory "$@"
