"""The guest agent's request parsers on arbitrary JSON: a ProtocolError (a DartError, answered
with 400) or a typed request, never another exception. No display needed."""

from __future__ import annotations

import contextlib

from hypothesis import given
from hypothesis import strategies as st

from dart.agent.actions import Action
from dart.env.guest_agent import protocol
from dart.errors import DartError

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=40),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=6,
)
# Bodies that look like real ones, with wrong types and values mixed in.
FIELDS = st.sampled_from(["command", "shell", "timeout", "kind", "x", "y", "end_x", "end_y", "text", "direction",
                          "window_name", "strict", "by_class", "file_path", "path"])
NEAR = st.dictionaries(FIELDS, JSON | st.sampled_from(["click", "type", "hotkey", "scroll", "drag", "wait", "up",
                                                       "ctrl c", ["ls", "-l"], float("nan"), 1e308, -1]),
                       max_size=6)
BODIES = JSON | NEAR


@given(BODIES, st.booleans())
def test_exec_bodies_are_an_argv_or_a_protocol_error(body, allow_shell):
    try:
        req = protocol.parse_exec(body, allow_shell=allow_shell)
    except protocol.ProtocolError as exc:
        assert isinstance(exc, DartError) and str(exc)
        return
    assert req.argv and all(isinstance(a, str) for a in req.argv)
    assert 0 < req.timeout_s <= protocol.MAX_EXEC_TIMEOUT_S
    assert allow_shell or req.argv[:2] != ("sh", "-c") or body.get("shell") is not True


@given(BODIES)
def test_action_bodies_are_an_action_or_a_protocol_error(body):
    try:
        action = protocol.parse_action(body)
    except protocol.ProtocolError:
        return
    assert isinstance(action, Action)


@given(BODIES)
def test_window_and_path_bodies_are_requests_or_protocol_errors(body):
    for parse in (protocol.parse_window, lambda b: protocol.parse_path(b.get("file_path") if isinstance(b, dict) else b)):
        with contextlib.suppress(protocol.ProtocolError):
            parse(body)


@given(st.text(max_size=80), st.one_of(st.none(), st.text(max_size=80)))
def test_token_check_only_ever_passes_or_raises_unauthorized(expected, presented):
    try:
        protocol.check_token(expected, presented)
    except protocol.Unauthorized:
        return
    assert presented == expected
