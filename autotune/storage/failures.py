"""A storage's failure in one line, in the database's own words: why it cannot be opened, and
why a write failed mid-job (read-only, disk full, an I/O error, corrupt, gone).
"""

from __future__ import annotations

from autotune.util.redact import redact

__all__ = ["cannot_open", "racing", "storage_failure"]

#: What a storage error means, from the words of the database's own error (SQLite, PostgreSQL,
#: MySQL), innermost first: Optuna reports every failed commit alike ("exception is raised
#: during the commit ... exceeding max length"), which names none of these.
_CAUSES = (
    ("read-only", ("readonly database", "read-only", "read only", "permission denied")),
    ("disk full", ("disk is full", "no space left", "disk full", "could not extend file")),
    ("corrupt", ("malformed", "not a database", "corrupt", "no such table")),
    ("I/O error (a full disk or file-size limit, a removed file, a failing device)", ("disk i/o",)),
    (
        "gone",
        (
            "unable to open database",
            "could not connect",
            "connection refused",
            "server closed the connection",
            "connection reset",
            "lost connection",
            "terminating connection",
        ),
    ),
)


def storage_failure(error: BaseException) -> str:
    """One line for a storage that failed mid-job: what is wrong (read-only, disk full, corrupt,
    gone) and the database's own words, its password masked. Optuna and SQLAlchemy wrap the
    database's error; the innermost one says what happened."""
    chain = _chain(error)
    for e in reversed(chain):
        text = " ".join(str(e).split()).lower()
        for cause, words in _CAUSES:
            if any(w in text for w in words):
                return redact(f"{cause}: {type(e).__name__}: {_first_line(e)}")
    innermost = chain[-1]
    return redact(f"{type(innermost).__name__}: {_first_line(innermost)}")


def _chain(error: BaseException) -> list[BaseException]:
    """``error`` and what it wraps, outermost first: SQLAlchemy's driver error (``orig``), else
    the cause or context."""
    chain = []
    seen: set[int] = set()
    e: BaseException | None = error
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        chain.append(e)
        orig = getattr(e, "orig", None)  # SQLAlchemy's DBAPIError keeps the driver's error here
        e = orig if isinstance(orig, BaseException) else (e.__cause__ or e.__context__)
    return chain


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else repr(error)


def _one_line(error: BaseException) -> str:
    """An error's lines joined, without SQLAlchemy's link to its error catalogue."""
    lines = [ln.strip() for ln in str(error).splitlines() if ln.strip()]
    return "; ".join(ln for ln in lines if not ln.startswith("(Background on this error"))


#: The package that installs a database driver, by the module SQLAlchemy imports.
_DRIVERS = {
    "psycopg2": "psycopg2-binary",
    "psycopg": "'psycopg[binary]'",
    "pymysql": "PyMySQL",
    "MySQLdb": "mysqlclient",
    "mysql": "mysql-connector-python",
    "asyncpg": "asyncpg",
}


def cannot_open(url: str, exc: BaseException) -> ValueError:
    """Why ``url`` did not open, in one line, its password masked, and what to do where it is
    known. The cause is left off the chain (``from None``): SQLAlchemy's errors repeat the URL,
    and a traceback prints them."""
    return ValueError(
        redact(f"cannot open tuning storage {url!r}: {_one_line(exc)}{_fix(url, exc)}")
    )


def _fix(url: str, exc: BaseException) -> str:
    """What to do about the usual ways a storage URL fails to open."""
    dialect = url.partition("://")[0].partition("+")[0].lower()
    if dialect == "postgres":
        return " (SQLAlchemy names PostgreSQL 'postgresql://', not 'postgres://')"
    for e in _chain(exc):  # Optuna wraps the driver's import error
        if isinstance(e, ModuleNotFoundError) and e.name:
            package = _DRIVERS.get(e.name, e.name)
            return f" (its database driver {e.name!r} is not installed here: pip install {package})"
    return ""


def racing(exc: Exception) -> bool:
    import sqlalchemy.exc

    text = str(exc).lower()
    return isinstance(exc, sqlalchemy.exc.IntegrityError) or any(
        words in text
        for words in ("already exists", "duplicate", "database is locked", "unique constraint")
    )
