"""The SQL endpoint answers no web page (issue 54): a page that points its own name at 127.0.0.1
(DNS rebinding) or posts from another site gets a 403 before anything is parsed or run, live on
loopback with the real chdb; curl-like clients and clickhouse-connect's headers are answered."""

from __future__ import annotations

import asyncio

import pytest

from dart.data.http import SqlServer
from dart.data.store import Store
from tests.web.rebinding import ask, assert_refuses_web_pages, web_page_headers

pytestmark = pytest.mark.clickhouse


async def test_the_sql_endpoint_refuses_dns_rebinding_and_cross_site_requests(store: Store, chdb_path) -> None:
    server = SqlServer(chdb_path, database=store.database)
    port = await server.start()
    try:
        await asyncio.to_thread(assert_refuses_web_pages, port, "/?query=SELECT%20count()%20FROM%20trajectories")
        await asyncio.to_thread(assert_refuses_web_pages, port, "/", method="POST", body=b"SELECT 1",
                                headers={"Content-Type": "text/plain"})
        await asyncio.to_thread(assert_refuses_web_pages, port, "/ping")
        # A rebinding page's write never reaches the writer check either (no body is read).
        for page in web_page_headers(port):
            status, _ = await asyncio.to_thread(ask, port, "/", method="POST", headers=page,
                                                body=b"DROP TABLE trajectories")
            assert status == 403
        assert store.query(f"EXISTS TABLE {store.database}.trajectories")[0][0] == 1
    finally:
        await server.stop()
