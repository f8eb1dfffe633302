"""A data manager's SQL endpoint in a process of its own, built the way the data manager builds
it (``SqlServer.from_config`` with the default ``HttpConfig``, the writer from
``$DART_SQL_WRITER_PASSWORD_FILE``), over a store with a few projected events.

``python tests/data/live_endpoint.py CHDB_PATH DATABASE PORT_FILE``: serves until SIGTERM. On
SIGUSR1 it writes every database and table chdb has (the ``default`` overlay's own tables
included, read in-process, not through the endpoint) to ``PORT_FILE.tables``."""

from __future__ import annotations

import asyncio
import dataclasses
import signal
import sys
from pathlib import Path

from dart.data import projection as q
from dart.data.config import HttpConfig
from dart.data.http import SqlServer
from dart.data.store import Store
from tests.data.factories import T0, group, task


async def main(path: Path, database: str, port_file: Path) -> None:
    store = Store.open_dsn(f"chdb://{path}", database=database)
    store.migrate()
    events, _ = group("a", [1.0, 0.0, 1.0], version=1, t=T0)
    q.write_events(store, [task("a"), *events])
    server = SqlServer.from_config(dataclasses.replace(HttpConfig(), port=0), path, database)
    port = await server.start()
    snapshot = port_file.with_name(port_file.name + ".tables")

    def tables() -> None:
        rows = store.query("SELECT database, name, engine FROM system.tables WHERE database NOT IN "
                           "('system', 'INFORMATION_SCHEMA', 'information_schema') ORDER BY ALL")
        dbs = store.query("SELECT name, engine FROM system.databases ORDER BY name")
        tmp = snapshot.with_name(snapshot.name + ".tmp")
        tmp.write_text("\n".join("\t".join(map(str, r)) for r in [*dbs, *rows]) + "\n")
        tmp.replace(snapshot)

    port_file.write_text(f"{port}\n")
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGUSR1, tables)
    await stop.wait()
    await server.stop()
    store.close()


if __name__ == "__main__":
    asyncio.run(main(Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3])))
