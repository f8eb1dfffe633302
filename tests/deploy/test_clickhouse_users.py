"""The compose stack's ClickHouse users: a read-only analytics user and a writer for the data
manager, passwords from the environment or generated once; no source grants for either."""

from __future__ import annotations

import stat
import xml.etree.ElementTree as ET
from typing import Any

from tests.deploy.stack import PASSWORD_SENTINEL, REPO, load_script

USERS = REPO / "deploy" / "clickhouse" / "users.d" / "dart.xml"


def users() -> ET.Element:
    return ET.parse(USERS).getroot()


def test_analytics_is_read_only_with_limits_it_cannot_lift() -> None:
    root = users()
    analytics = root.find("users/analytics")
    assert analytics is not None and analytics.findtext("profile") == "dart_analytics"
    profile = root.find("profiles/dart_analytics")
    assert profile is not None and profile.findtext("readonly") == "1"
    assert profile.find("constraints/readonly/const") is not None  # no SET, SETTINGS or URL parameter lifts it
    assert profile.findtext("result_overflow_mode") == "throw" and int(profile.findtext("max_execution_time")) > 0
    assert [q.text for q in analytics.findall("grants/query")] == ["GRANT SELECT ON dart.*"]


def test_no_user_may_reach_outside_the_projection_and_default_stays_inside_the_container() -> None:
    root = users()
    for name in ("dart", "analytics"):
        grants = " ".join(q.text or "" for q in root.findall(f"users/{name}/grants/query")).upper()
        assert " ON DART.*" in grants and "*.*" not in grants, name
        for source in ("FILE", "URL", "S3", "REMOTE", "MYSQL", "POSTGRES", "JDBC", "ODBC", "HDFS", "AZURE", "SOURCES"):
            assert source not in grants.replace("ON DART.*", ""), (name, source)
        password = root.find(f"users/{name}/password")
        assert password is not None and password.get("from_env") and not (password.text or "").strip()
    assert [ip.text for ip in root.findall("users/default/networks/ip")] == ["::1", "127.0.0.1"]


def test_the_server_gets_both_passwords_and_never_opens_default(stack: dict[str, Any]) -> None:
    ch = stack["services"]["clickhouse"]
    assert "CLICKHOUSE_USER" not in ch["environment"] and "CLICKHOUSE_PASSWORD" not in ch["environment"]
    assert ch["environment"]["DART_CLICKHOUSE_WRITER_PASSWORD"] == PASSWORD_SENTINEL
    assert any(str(USERS) in v or "users.d/dart.xml" in str(v) for v in ch["volumes"])
    assert "secrets-init" in ch["depends_on"]
    assert any("secrets" in str(v) for v in stack["services"]["data-manager"]["volumes"])


def test_secrets_init_makes_each_password_once(tmp_path) -> None:
    module = load_script("secrets_init.py")
    assert sorted(module.ensure(tmp_path)) == ["clickhouse-analytics", "clickhouse-writer"]
    first = (tmp_path / "clickhouse-writer").read_text()
    assert len(first.strip()) >= 24 and not (tmp_path / "clickhouse-writer").stat().st_mode & stat.S_IWUSR
    assert module.ensure(tmp_path) == [] and (tmp_path / "clickhouse-writer").read_text() == first


def test_the_data_manager_reads_the_generated_password_when_the_environment_has_none(tmp_path, monkeypatch) -> None:
    from dart.data.config import StoreConfig

    (tmp_path / "pw").write_text("generated\n")
    cfg = StoreConfig(dsn="http://clickhouse:8123", password_file=tmp_path / "pw")
    monkeypatch.delenv("CLICKHOUSE_PASSWORD", raising=False)
    assert cfg.password == "generated"
    monkeypatch.setenv("CLICKHOUSE_PASSWORD", "from-env")
    assert cfg.password == "from-env"
