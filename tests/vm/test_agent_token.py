"""The guest agent's token rules, without a display: who may bind what, where the token comes from."""

from __future__ import annotations

import pytest

from dart.env.guest_agent import protocol
from dart.env.guest_agent.server import AgentConfig, child_environment, nic_address, read_token
from dart.errors import ConfigError

TOKEN = "t" * 32


def test_check_token_accepts_only_the_exact_token() -> None:
    protocol.check_token(TOKEN, TOKEN)
    for bad in (None, "", TOKEN[:-1], TOKEN + "t", TOKEN.upper(), "\udcff" * 32):
        with pytest.raises(protocol.Unauthorized):
            protocol.check_token(TOKEN, bad)


def test_an_agent_on_a_non_loopback_address_must_have_a_token() -> None:
    AgentConfig(host="127.0.0.1")
    AgentConfig(host="10.0.0.5", token=TOKEN)
    for host in ("0.0.0.0", "10.0.0.5", "::"):
        with pytest.raises(ConfigError, match="needs a token"):
            AgentConfig(host=host)
    assert TOKEN not in repr(AgentConfig(token=TOKEN))


def test_token_comes_from_the_file_then_the_environment(tmp_path) -> None:
    f = tmp_path / "token"
    f.write_text(TOKEN + "\n")
    f.chmod(0o600)
    assert read_token(str(f), {"DART_AGENT_TOKEN": "e" * 20}) == TOKEN
    assert read_token(None, {"DART_AGENT_TOKEN": "e" * 20}) == "e" * 20
    with pytest.raises(protocol.ProtocolError, match="at least"):
        read_token(None, {"DART_AGENT_TOKEN": "short"})
    with pytest.raises(ConfigError, match="cannot read"):
        read_token(str(tmp_path / "missing"), {})


def test_nic_address_is_a_local_address() -> None:
    try:
        addr = nic_address()
    except ConfigError:
        pytest.skip("no default route on this machine")
    assert addr.count(".") == 3


def test_a_token_file_others_may_read_is_refused(tmp_path) -> None:
    f = tmp_path / "token"
    f.write_text(TOKEN + "\n")
    for mode in (0o644, 0o640, 0o604):
        f.chmod(mode)
        with pytest.raises(ConfigError, match="chmod 600"):
            read_token(str(f), {})
    f.chmod(0o400)
    assert read_token(str(f), {}) == TOKEN


def test_children_get_no_token_and_no_dart_secret() -> None:
    env = {"DART_AGENT_TOKEN": TOKEN, "DART_KAFKA_PASSWORD": "p", "DART_SQL_WRITER_PASSWORD_FILE": "/run/secrets/w",
           "DART_OPENAI_API_KEY": "k", "DART_BOOTSTRAP": "127.0.0.1:9092", "PATH": "/usr/bin", "DISPLAY": ":3"}
    assert child_environment(env) == {"DART_SQL_WRITER_PASSWORD_FILE": "/run/secrets/w",
                                      "DART_BOOTSTRAP": "127.0.0.1:9092", "PATH": "/usr/bin", "DISPLAY": ":3"}
