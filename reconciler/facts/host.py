"""The host underneath the ranks: kernel, boot, NVIDIA driver, Docker and the container toolkit.

Updates to these are what breaks a group that ran for weeks: a kernel that unattended-upgrades
installs, a driver or firmware update whose reboot resets the fabric. The probe reads them on
every pass; this module keeps only what each names (a version, a boot id), so an odd answer
is absent, never a long or unprintable string in a status line.
"""

from __future__ import annotations

import re

from reconciler.facts.base import FactsModel, text_or_none

# `uname -r`, Docker's and the toolkit's version strings: letters, digits and . + ~ - _
_VERSION_RE = re.compile(r"[\w.+~-]{1,100}")
_BOOT_ID_RE = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
# /proc/driver/nvidia/version: "NVRM version: NVIDIA UNIX Open Kernel Module for aarch64  580.142 ..."
DRIVER_RE = re.compile(r"\b(\d{3})\.(\d+)(?:\.(\d+))?\b")
# `nvidia-ctk --version`: "NVIDIA Container Toolkit CLI version 1.17.8"
_TOOLKIT_RE = re.compile(r"version\s+([\w.+~-]{1,64})", re.IGNORECASE)


class HostFacts(FactsModel):
    """What one node runs underneath the ranks (None: not readable there)."""

    kernel: str | None = None
    boot_id: str | None = None
    driver: str | None = None
    docker: str | None = None
    toolkit: str | None = None


def host_from_probe(raw: object) -> HostFacts:
    """The probe's `host_facts`, each field kept only when it reads as what it names."""
    found = raw if isinstance(raw, dict) else {}
    return HostFacts(
        kernel=_matched(_VERSION_RE, found.get("kernel")),
        boot_id=_matched(_BOOT_ID_RE, found.get("boot_id")),
        driver=driver_version(text_or_none(found.get("nvidia_driver"))),
        docker=_matched(_VERSION_RE, found.get("docker")),
        toolkit=_searched(_TOOLKIT_RE, found.get("toolkit")),
    )


def driver_version(text: str | None) -> str | None:
    """The loaded NVIDIA kernel module's version ("580.142"), from /proc/driver/nvidia/version."""
    match = DRIVER_RE.search(text or "")
    return match.group(0) if match else None


def _matched(pattern: re.Pattern[str], value: object) -> str | None:
    text = (text_or_none(value) or "").strip()
    return text if pattern.fullmatch(text) else None


def _searched(pattern: re.Pattern[str], value: object) -> str | None:
    match = pattern.search(text_or_none(value) or "")
    return match.group(1) if match else None
