"""``autotune dashboards push``: create or update the dashboards in a Grafana, by uid.

Through grafana-client (the maintained fork of grafana-api). The token comes from the
environment and never reaches output: every message that leaves here is scrubbed of it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from autotune.util.redact import redact_url

__all__ = ["PushError", "Pushed", "push"]

#: Keys Grafana sets on a stored dashboard; they do not make it differ from ours.
_VOLATILE = ("id", "version")


class PushError(RuntimeError):
    """Grafana refused or could not be reached; the message names the step, never the token."""


@dataclass(frozen=True)
class Pushed:
    uid: str
    title: str
    status: str  # "created", "updated" or "unchanged"


def _same(stored: Mapping[str, Any], ours: Mapping[str, Any]) -> bool:
    def clean(d: Mapping[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in d.items() if k not in _VOLATILE}

    return clean(stored) == clean(ours)


def push(
    url: str,
    token: str | None,
    dashboards: Mapping[str, Mapping[str, Any]],
    folder: str = "autotune",
    *,
    log: Callable[[str], None] = print,
    timeout_s: float = 30.0,
) -> list[Pushed]:
    """Put ``dashboards`` (by uid) into the Grafana at ``url``, in ``folder`` (made if missing).

    A dashboard already there with the same content and folder is left alone, so pushing twice
    changes nothing the second time.
    """
    try:
        from grafana_client.api import GrafanaApi
        from grafana_client.client import GrafanaClientError
    except ImportError:
        raise PushError(
            "pushing dashboards needs grafana-client, which is not installed here: "
            "pip install 'autotune[grafana]' (or import dashboards/*.json in Grafana's UI)"
        ) from None

    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise PushError(
            "--url must be a Grafana address such as http://localhost:3000, got "
            + redact_url(repr(url))
        )
    try:
        parts.port  # noqa: B018 - raises on a port that is not a number
    except ValueError as exc:
        raise PushError(redact_url(f"--url {url!r}: {exc}")) from None
    secrets = [s for s in (token, parts.password) if s]

    def scrub(text: str) -> str:
        for s in secrets:
            text = text.replace(s, "***")
        return text

    where = redact_url(url)

    def failed(step: str, exc: Exception) -> PushError:
        status = getattr(exc, "status_code", None)
        hint = ""
        if status in (401, 403):
            hint = " (check GRAFANA_TOKEN: a service account token with the Editor role)"
        detail = scrub(str(getattr(exc, "message", None) or exc))
        return PushError(f"{step} at {where} failed: {detail}{hint}")

    api = GrafanaApi.from_url(url, credential=token, timeout=timeout_s)
    try:
        folders = api.folder.get_all_folders()
    except Exception as exc:  # connection errors, HTTP errors: all end the push here
        raise failed("listing folders", exc) from None
    folder_uid = next((f["uid"] for f in folders if f.get("title") == folder), None)
    if folder_uid is None:
        try:
            made = api.folder.create_folder(folder, uid=_slug(folder))
        except Exception as exc:
            raise failed(f"creating folder {folder!r}", exc) from None
        folder_uid = made["uid"]
        log(f"created folder {folder!r} ({folder_uid})")
    out = []
    for uid, dashboard in dashboards.items():
        title = str(dashboard.get("title", uid))
        stored: Mapping[str, Any] | None = None
        try:
            stored = api.dashboard.get_dashboard(uid)
        except GrafanaClientError as exc:
            if exc.status_code != 404:
                raise failed(f"reading dashboard {uid}", exc) from None
        except Exception as exc:
            raise failed(f"reading dashboard {uid}", exc) from None
        if (
            stored is not None
            and _same(stored["dashboard"], dashboard)
            and stored.get("meta", {}).get("folderUid") == folder_uid
        ):
            out.append(Pushed(uid, title, "unchanged"))
            log(f"unchanged  {title} ({uid})")
            continue
        body = {
            "dashboard": {**dashboard, "id": None},
            "folderUid": folder_uid,
            "overwrite": True,
            "message": "autotune dashboards push",
        }
        try:
            api.dashboard.update_dashboard(body)
        except Exception as exc:
            raise failed(f"saving dashboard {uid}", exc) from None
        status = "created" if stored is None else "updated"
        out.append(Pushed(uid, title, status))
        log(f"{status:<10} {title} ({uid}) at {where}")
    return out


def _slug(title: str) -> str:
    return "".join(c if c.isalnum() or c in "-_" else "-" for c in title.lower())[:40]
