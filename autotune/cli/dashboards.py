"""``autotune dashboards build`` and ``push``: the Grafana dashboards from code, to a Grafana."""

from __future__ import annotations

import argparse
import os
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    pass

__all__ = ["dashboards"]


def dashboards(args: argparse.Namespace) -> int:
    from pathlib import Path

    from autotune.dashboards import differences, load, write

    directory = Path(args.dir)
    if args.action == "build":
        if args.check:
            problems = differences(directory)
            for p in problems:
                print(p, file=sys.stderr)
            if problems:
                print("the dashboards differ from the code: run `autotune dashboards build`")
                return 1
            print(f"{directory}: up to date")
            return 0
        for path in write(directory):
            print(f"wrote {path}")
        return 0
    from autotune.dashboards._push import PushError, push
    from autotune.util.redact import redact_url

    token = os.environ.get("GRAFANA_TOKEN") or None
    if token is None and "@" not in args.url:
        print(
            "autotune dashboards push: set GRAFANA_TOKEN to a Grafana service account token "
            "(Editor role), or put user:password in the URL for a local Grafana",
            file=sys.stderr,
        )
        return 2
    try:
        dashboards = load(directory)
    except ValueError as exc:
        print(
            f"autotune dashboards push: {exc} (run from a clone of autotune, or pass --dir)",
            file=sys.stderr,
        )
        return 2
    try:
        pushed = push(args.url, token, dashboards, args.folder)
    except PushError as exc:
        print(f"autotune dashboards push: {exc}", file=sys.stderr)
        return 1
    changed = sum(p.status != "unchanged" for p in pushed)
    print(f"{len(pushed)} dashboards at {redact_url(args.url)}, {changed} changed")
    return 0
