"""One-shot of the compose stack: make the ClickHouse passwords that .env does not set.

    python secrets_init.py /run/dart-secrets

Writes ``clickhouse-writer`` and ``clickhouse-analytics`` (random; readable by the services that
mount the volume: clickhouse and the data manager) into the
``secrets`` volume the first time only: a later `docker compose up` keeps them, so the
server and the data manager agree across restarts. Read one with
``docker compose run --rm secrets-init cat /run/dart-secrets/clickhouse-analytics``.
"""

from __future__ import annotations

import os
import secrets
import sys
from pathlib import Path

NAMES = ("clickhouse-writer", "clickhouse-analytics")


def ensure(directory: Path) -> list[str]:
    """Create each missing password file; return the names created."""
    directory.mkdir(parents=True, exist_ok=True)
    made = []
    for name in NAMES:
        path = directory / name
        if path.exists() and path.read_text().strip():
            continue
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o444)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_urlsafe(24) + "\n")
        made.append(name)
    return made


if __name__ == "__main__":
    made = ensure(Path(sys.argv[1] if len(sys.argv) > 1 else "/run/dart-secrets"))
    print(f"generated {', '.join(made)}" if made else "passwords already there")
