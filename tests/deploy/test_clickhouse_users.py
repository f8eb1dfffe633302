"""The compose stack's ClickHouse users: a read-only analytics user and a writer for the data
manager, passwords from .env or generated once, each handed as a 0400 file to the one service
that needs it (the server gets hashes only); no source grants for either."""

from __future__ import annotations

import hashlib
import os
import stat
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest
import yaml

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


def test_the_ingesting_user_cannot_drop_truncate_or_alter_dart_tables() -> None:
    """Issue 54: the data manager's user inserts and creates (its start-up migrations only create);
    a leaked password of it cannot empty or change the projection."""
    dart = users().find("users/dart")
    assert dart is not None
    grants = [q.text for q in dart.findall("grants/query")]
    assert grants == ["GRANT SELECT, INSERT, CREATE DATABASE, CREATE TABLE, CREATE VIEW ON dart.*"]
    for verb in ("ALL", "DROP", "TRUNCATE", "ALTER", "OPTIMIZE", "DELETE", "UPDATE", "CREATE DICTIONARY"):
        assert verb not in grants[0].split(" ON ")[0], verb
    from dart.data.schema import MIGRATIONS, SCHEMA_VERSION_DDL

    # what those grants allow is all the migrations run: CREATE ... and the INSERT of their version
    for statement in [SCHEMA_VERSION_DDL, *(s for m in MIGRATIONS for s in m.statements)]:
        assert statement.lstrip().upper().startswith(("CREATE TABLE", "CREATE VIEW", "CREATE DATABASE")), statement
        assert "OR REPLACE" not in statement.upper(), statement


def test_no_user_may_reach_outside_the_projection_and_default_stays_inside_the_container() -> None:
    root = users()
    for name in ("dart", "analytics"):
        grants = " ".join(q.text or "" for q in root.findall(f"users/{name}/grants/query")).upper()
        assert " ON DART.*" in grants and "*.*" not in grants, name
        for source in ("FILE", "URL", "S3", "REMOTE", "MYSQL", "POSTGRES", "JDBC", "ODBC", "HDFS", "AZURE", "SOURCES"):
            assert source not in grants.replace("ON DART.*", ""), (name, source)
        # No password field here: the hash comes from secrets-init's users.xml alone (a second
        # field would make ClickHouse refuse the user; none, and it refuses it too).
        assert not [e.tag for e in root.find(f"users/{name}") if e.tag.startswith(("password", "no_password"))], name
    assert [ip.text for ip in root.findall("users/default/networks/ip")] == ["::1", "127.0.0.1"]


def volume_mounts(svc: dict[str, Any]) -> dict[str, str]:
    """Named volume -> container path (host paths left out)."""
    return {v.split(":")[0]: v.split(":")[1] for v in svc.get("volumes", []) if not v.startswith(("/", "."))}


def test_each_service_mounts_only_its_own_secret_and_no_password_is_in_an_environment(stack: dict[str, Any]) -> None:
    services = stack["services"]
    ch, dm, init = services["clickhouse"], services["data-manager"], services["secrets-init"]
    assert "CLICKHOUSE_USER" not in ch["environment"] and "CLICKHOUSE_PASSWORD" not in ch["environment"]
    assert not any(PASSWORD_SENTINEL in str(v) for v in ch["environment"].values())
    assert not any("PASSWORD" in k for k in dm.get("environment", {}))
    assert any(str(USERS) in v or "users.d/dart.xml" in str(v) for v in ch["volumes"])
    assert "secrets-init" in ch["depends_on"] and "secrets-init" in dm["depends_on"]
    # Who mounts which secret volume: secrets-init all three, each consumer its own, nobody else.
    holders: dict[str, set[str]] = {}
    for name, svc in services.items():
        for volume in volume_mounts(svc):
            if "secrets" in volume:
                holders.setdefault(volume, set()).add(name)
    assert holders == {"secrets": {"secrets-init"}, "clickhouse-secrets": {"secrets-init", "clickhouse"},
                       "data-manager-secrets": {"secrets-init", "data-manager"}}
    assert volume_mounts(ch)["clickhouse-secrets"] == "/run/dart-secrets"
    assert any(v.startswith("clickhouse-secrets:") and v.endswith(":ro") for v in ch["volumes"])
    assert any(v.startswith("data-manager-secrets:") and v.endswith(":ro") for v in dm["volumes"])
    # The data manager reads its file where data-manager.yaml says; ClickHouse copies the hashes in.
    store = yaml.safe_load((REPO / "deploy" / "compose" / "data-manager.yaml").read_text())["data"]["store"]
    assert store["password_file"] == volume_mounts(dm)["data-manager-secrets"] + "/clickhouse-writer"
    assert "/run/dart-secrets/users.xml /etc/clickhouse-server/users.d/" in " ".join(ch["entrypoint"])
    # secrets-init runs as root (to chown), is the only one to see .env's passwords, and writes
    # where each consumer's volume is mounted.
    assert init["user"] == "0:0" and init["environment"]["CLICKHOUSE_PASSWORD"] == PASSWORD_SENTINEL
    mounts = volume_mounts(init)
    assert init["command"][-2:] == [mounts["secrets"], "/run/dart-secrets-for"]
    assert mounts["clickhouse-secrets"] == "/run/dart-secrets-for/clickhouse"
    assert mounts["data-manager-secrets"] == "/run/dart-secrets-for/data-manager"


def test_secrets_init_knows_the_uid_of_each_service() -> None:
    module = load_script("secrets_init.py")
    dockerfile = (REPO / "Dockerfile").read_text()
    assert f"useradd --create-home --uid {module.DART_UID} " in dockerfile
    assert module.CLICKHOUSE_UID == 101  # clickhouse/clickhouse-server: `useradd -r -g clickhouse --uid=101`


def mode_and_owner(path: Path) -> tuple[int, int]:
    st = path.stat()
    return stat.S_IMODE(st.st_mode), st.st_uid


@pytest.mark.skipif(os.geteuid() != 0, reason="secrets-init chowns each file to its service: needs root")
def test_secrets_init_gives_each_service_its_file_0400_and_owned_by_its_uid(tmp_path: Path) -> None:
    module = load_script("secrets_init.py")
    store, out = tmp_path / "store", tmp_path / "out"
    # A store of the older stack: a 0444 password of the image user's, kept (and locked down).
    store.mkdir()
    (store / "clickhouse-writer").write_text("old-generated\n")
    (store / "clickhouse-writer").chmod(0o444)
    os.chown(store / "clickhouse-writer", 1000, 1000)
    assert module.main([str(store), str(out)]) == 0
    assert mode_and_owner(store) == (0o700, 0)
    for name in ("clickhouse-writer", "clickhouse-analytics"):
        assert mode_and_owner(store / name) == (0o400, 0), name
    assert (store / "clickhouse-writer").read_text() == "old-generated\n"
    analytics = (store / "clickhouse-analytics").read_text().strip()
    assert len(analytics) >= 24
    # Each consumer's directory holds its one file, 0400, owned by its uid, in a 0700 directory.
    assert sorted(p.name for p in out.iterdir()) == ["clickhouse", "data-manager"]
    assert [p.name for p in (out / "data-manager").iterdir()] == ["clickhouse-writer"]
    assert [p.name for p in (out / "clickhouse").iterdir()] == ["users.xml"]
    assert mode_and_owner(out / "data-manager") == (0o700, 1000)
    assert mode_and_owner(out / "data-manager" / "clickhouse-writer") == (0o400, 1000)
    assert mode_and_owner(out / "clickhouse") == (0o700, 101)
    assert mode_and_owner(out / "clickhouse" / "users.xml") == (0o400, 101)
    assert (out / "data-manager" / "clickhouse-writer").read_text() == "old-generated\n"
    # The server gets hashes, never a password.
    xml = (out / "clickhouse" / "users.xml").read_text()
    assert "old-generated" not in xml and analytics not in xml
    users = ET.fromstring(xml).find("users")
    assert users.findtext("dart/password_sha256_hex") == hashlib.sha256(b"old-generated").hexdigest()
    assert users.findtext("analytics/password_sha256_hex") == hashlib.sha256(analytics.encode()).hexdigest()
    assert [e.tag for e in users.find("dart")] == ["password_sha256_hex"]
    # A second run (the next `up`) keeps the passwords and the modes.
    assert module.main([str(store), str(out)]) == 0
    assert (store / "clickhouse-analytics").read_text().strip() == analytics
    assert mode_and_owner(out / "clickhouse" / "users.xml") == (0o400, 101)
    assert not [p for p in out.rglob(".*")]  # no temporary file left


def test_secrets_init_refuses_to_run_without_root(tmp_path: Path, monkeypatch) -> None:
    module = load_script("secrets_init.py")
    monkeypatch.setattr(module.os, "geteuid", lambda: 1000)
    assert module.main([str(tmp_path / "s"), str(tmp_path / "o")]) == 1
    assert not (tmp_path / "s").exists()


def test_secrets_init_makes_each_password_once_and_env_wins_without_being_stored(tmp_path) -> None:
    module = load_script("secrets_init.py")
    store, out = tmp_path / "store", tmp_path / "out"
    mine = {"data-manager": None, "clickhouse": None}  # the caller's uid: runs without root
    assert sorted(module.ensure(store, out, environ={}, owners=mine)) == ["clickhouse-analytics", "clickhouse-writer"]
    first = (store / "clickhouse-writer").read_text()
    assert len(first.strip()) >= 24 and stat.S_IMODE((store / "clickhouse-writer").stat().st_mode) == 0o400
    assert (out / "data-manager" / "clickhouse-writer").read_text() == first
    assert module.ensure(store, out, environ={}, owners=mine) == [] and (store / "clickhouse-writer").read_text() == first
    # .env's password wins for the data manager and the server's hash; the store keeps the generated one.
    env = {"CLICKHOUSE_PASSWORD": PASSWORD_SENTINEL, "CLICKHOUSE_ANALYTICS_PASSWORD": ""}
    assert module.ensure(store, out, environ=env, owners=mine) == []
    assert (out / "data-manager" / "clickhouse-writer").read_text() == PASSWORD_SENTINEL + "\n"
    assert (store / "clickhouse-writer").read_text() == first
    users = ET.fromstring((out / "clickhouse" / "users.xml").read_text()).find("users")
    assert users.findtext("dart/password_sha256_hex") == hashlib.sha256(PASSWORD_SENTINEL.encode()).hexdigest()
    analytics = (store / "clickhouse-analytics").read_text().strip()  # empty in the environment: generated
    assert users.findtext("analytics/password_sha256_hex") == hashlib.sha256(analytics.encode()).hexdigest()
    assert PASSWORD_SENTINEL not in (out / "clickhouse" / "users.xml").read_text()


def test_the_data_manager_reads_the_generated_password_when_the_environment_has_none(tmp_path, monkeypatch) -> None:
    from dart.data.config import StoreConfig

    (tmp_path / "pw").write_text("generated\n")
    cfg = StoreConfig(dsn="http://clickhouse:8123", password_file=tmp_path / "pw")
    monkeypatch.delenv("CLICKHOUSE_PASSWORD", raising=False)
    assert cfg.password == "generated"
    monkeypatch.setenv("CLICKHOUSE_PASSWORD", "from-env")
    assert cfg.password == "from-env"
