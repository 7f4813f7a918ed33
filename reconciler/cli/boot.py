"""Handler for running at boot: install-service."""

from __future__ import annotations

import argparse
import sys

from reconciler.cli.common import EXIT_OK, emit_json, spec_path


def install_service(args: argparse.Namespace) -> int:
    from reconciler import service

    settings = service.settings_for(spec_path(args.spec), args.user)
    report = service.install(settings, dry_run=args.dry_run)
    if args.json:
        emit_json(report.to_dict())
        return EXIT_OK
    for warning in report.warnings:
        sys.stderr.write(f"warning: {warning}\n")
    sys.stdout.write(service.render_report(report))
    return EXIT_OK
