"""The guest agent answers no web page and, without a token, only its own user (issue 54): the real
`dart guest-agent` on loopback (no X display: nothing here draws). The README's "testing without
KVM" command refuses to start as root; started with ``--root-without-token``, a text/plain or
cross-origin ``/execute``, a DNS-rebinding Host and another user's request get a 403/415 and run
nothing (a marker file stays absent), while the same command as JSON from this user runs."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from dart.env.libvirt.testdriver import free_port
from tests.web.rebinding import ask, assert_refuses_web_pages

REPO = Path(__file__).resolve().parents[2]
AS_ROOT = os.geteuid() == 0
TOKEN = "agent-token-0123456789abcdef"


def agent_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "dart.cli", "guest-agent", "--display", ":99", *args]


def start(port: int, *args: str, token: str | None = None) -> subprocess.Popen[str]:
    """The agent on 127.0.0.1:port, once it answers /platform (which needs no display)."""
    env = {k: v for k, v in os.environ.items() if k != "DART_AGENT_TOKEN"} | {"PYTHONPATH": str(REPO)}
    if token:
        env["DART_AGENT_TOKEN"] = token
    proc = subprocess.Popen(agent_argv("--port", str(port), *args), env=env, text=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    headers = {"X-Dart-Agent-Token": token} if token else {}
    for _ in range(200):
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        try:
            if ask(port, "/platform", headers=headers, timeout_s=1)[0] == 200:
                return proc
        except OSError:
            time.sleep(0.1)
    raise AssertionError("the guest agent did not answer in 20 s")


def stop(proc: subprocess.Popen[str]) -> str:
    proc.terminate()
    _, err = proc.communicate(timeout=15)
    return err


@pytest.fixture(scope="module")
def tokenless() -> Iterator[tuple[int, subprocess.Popen[str]]]:
    port = free_port()
    proc = start(port, *(["--root-without-token"] if AS_ROOT else []))
    yield port, proc
    stop(proc)


def execute(marker: Path) -> bytes:
    return json.dumps({"command": ["touch", str(marker)]}).encode()


@pytest.mark.skipif(not AS_ROOT, reason="the refusal is of root")
def test_the_readme_command_refuses_to_run_as_root_without_a_token() -> None:
    readme = (REPO / "deploy/libvirt/README.md").read_text()
    (command,) = re.findall(r"`(dart guest-agent [^`]*)`", readme.split("## Testing without KVM")[1])
    done = subprocess.run([sys.executable, "-m", "dart.cli", *shlex.split(command)[1:]], capture_output=True,
                          text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 2
    (line,) = done.stderr.strip().splitlines()
    assert "refusing to run as root without a token" in line and "--root-without-token" in line, line


def test_untyped_and_cross_site_requests_run_nothing(tokenless, tmp_path: Path) -> None:
    port, _ = tokenless
    marker = tmp_path / "ran"
    json_type = {"Content-Type": "application/json"}
    # A page's text/plain POST (no CORS preflight stands in its way): 415 before the body is read.
    status, body = ask(port, "/execute", method="POST", headers={"Content-Type": "text/plain"}, body=execute(marker))
    assert status == 415 and b"application/json" in body
    status, _ = ask(port, "/execute", method="POST", body=execute(marker))  # no type at all
    assert status == 415
    # The same as JSON, from another site or a rebinding page: 403.
    for page in ({"Origin": "http://evil.example"}, {"Origin": "null"}, {"Host": f"evil.example:{port}"},
                 {"Host": f"evil.example:{port}", "Origin": f"http://evil.example:{port}"}):
        status, body = ask(port, "/execute", method="POST", headers=json_type | page, body=execute(marker))
        assert status == 403 and b"refused" in body, (page, status, body)
    # A form a page may post unasked, to the endpoints that take forms (OSWorld's clients do).
    form = {"Content-Type": "application/x-www-form-urlencoded", "Origin": "http://evil.example"}
    assert ask(port, "/file", method="POST", headers=form, body=b"file_path=/etc/hostname")[0] == 403
    boundary = "b0undary"
    upload = (f'--{boundary}\r\nContent-Disposition: form-data; name="file_path"\r\n\r\n{marker}\r\n'
              f'--{boundary}\r\nContent-Disposition: form-data; name="file_data"; filename="x"\r\n\r\nx\r\n'
              f"--{boundary}--\r\n").encode()
    multipart = {"Content-Type": f"multipart/form-data; boundary={boundary}"}
    assert ask(port, "/setup/upload", method="POST", headers=multipart | {"Origin": "http://evil.example"},
               body=upload)[0] == 403
    assert ask(port, "/setup/upload", method="POST", headers=json_type, body=b"{}")[0] == 415
    assert_refuses_web_pages(port, "/platform")
    assert not marker.exists()
    # This user's script, as JSON: it runs.
    status, body = ask(port, "/execute", method="POST", headers=json_type, body=execute(marker))
    assert status == 200 and json.loads(body)["returncode"] == 0 and marker.exists()


@pytest.mark.skipif(not AS_ROOT or shutil.which("curl") is None, reason="needs root to run a client as nobody")
def test_without_a_token_another_user_is_refused(tokenless, tmp_path: Path) -> None:
    port, _ = tokenless
    marker = Path("/tmp") / f"dart-agent-{os.getpid()}-ran"
    done = subprocess.run(["curl", "-s", "-w", "\n%{http_code}", "-H", "Content-Type: application/json",
                           "--data-binary", execute(marker).decode(), f"http://127.0.0.1:{port}/execute"],
                          user=65534, capture_output=True, text=True, timeout=30)
    body, code = done.stdout.rsplit("\n", 1)
    assert code == "403" and "only processes of uid 0" in body and "is uid 65534" in body, done.stdout
    assert not marker.exists()


def test_the_agent_says_at_start_that_it_has_no_token(tmp_path: Path) -> None:
    port = free_port()
    err = stop(start(port, *(["--root-without-token"] if AS_ROOT else [])))
    assert f"NO TOKEN. Every process of uid {os.geteuid()}" in err and f"127.0.0.1:{port}" in err


def test_with_a_token_a_rebinding_page_is_refused_even_with_the_token(tmp_path: Path) -> None:
    port = free_port()
    proc = start(port, token=TOKEN)
    try:
        marker = tmp_path / "ran"
        headers = {"Content-Type": "application/json", "X-Dart-Agent-Token": TOKEN}
        assert_refuses_web_pages(port, "/execute", method="POST", headers=headers, body=execute(marker))
        assert marker.exists()  # the two answered requests (a script, the server's own page) ran
        marker.unlink()
        status, _ = ask(port, "/execute", method="POST", headers=headers | {"Host": f"evil.example:{port}"},
                        body=execute(marker))
        assert status == 403 and not marker.exists()
    finally:
        stop(proc)
