"""Secrets out of everything autotune says: a URL's password never reaches a log, an error, a
store key or another rank. One helper for every URL autotune names (storage, Grafana, Prometheus).
"""

from __future__ import annotations

import re

__all__ = ["MASK", "redact", "redact_url"]

#: What a password becomes (SQLAlchemy shows ``***`` in a URL's string form as well).
MASK = "***"

# [scheme://]user:password@  (the password runs to the last '@' of the word: a password may hold
# an '@' its user forgot to quote, and a host never does). Without a scheme too: a URL mistyped
# without one is still somebody's password.
_USERINFO = re.compile(
    r"(?P<head>(?:[A-Za-z][A-Za-z0-9+.\-]*://)?[^:/@\s'\"\[\]()<>,;]*):(?!//)(?P<secret>[^\s'\"]*)@"
)
# ?password=...&  or  &passwd=...  (drivers that take the password as a query parameter)
_QUERY = re.compile(r"(?P<head>[?&](?:password|passwd|pwd|token|secret)=)[^&\s'\"]*", re.IGNORECASE)


def redact(text: str) -> str:
    """``text`` with the password of every URL in it masked (the user name stays: it says who
    connected). Anything else is left as it is, so an error message keeps its meaning."""
    text = _USERINFO.sub(lambda m: f"{m['head']}:{MASK}@", text)
    return _QUERY.sub(lambda m: f"{m['head']}{MASK}", text)


def redact_url(url: str) -> str:
    """One URL, its password masked (`redact` for a single URL)."""
    return redact(url)
