"""The real ``dart guest-agent`` on an Xvfb display, over loopback HTTP."""

from __future__ import annotations

import asyncio
import os
import shutil
from collections.abc import AsyncIterator

import aiohttp
import pytest

from dart.agent.actions import Click, Drag, Hotkey, Scroll, Type
from dart.env.libvirt.agent_client import AgentClient
from dart.env.libvirt.backend import png_size
from dart.env.libvirt.testdriver import free_port, start_agent, stop_agent
from dart.env.xdesktop.display import XDisplay
from dart.errors import EnvError

pytestmark = [pytest.mark.vm, pytest.mark.xdesktop,
              pytest.mark.skipif(shutil.which("Xvfb") is None or shutil.which("xdotool") is None,
                                 reason="needs Xvfb and xdotool (apt-get install xvfb xdotool)")]

W, H = 800, 600
TOKEN = "test-token-0123456789abcdef"
SECRET_NAME, SECRET = "DART_TEST_BUS_PASSWORD", "bus-secret-0123456789"


@pytest.fixture(scope="module")
async def agent(tmp_path_factory) -> AsyncIterator[tuple[AgentClient, str]]:
    display = XDisplay(width=W, height=H, home=tmp_path_factory.mktemp("agent-home"),
                       wm="openbox" if shutil.which("openbox") else "")
    await display.start()
    port = free_port()
    os.environ[SECRET_NAME] = SECRET  # a DART_* secret in the agent's start-up environment
    try:
        proc = await asyncio.to_thread(start_agent, display.display, port, token=TOKEN)
    finally:
        del os.environ[SECRET_NAME]
    client = AgentClient(f"http://127.0.0.1:{port}", token=TOKEN, timeout_s=20)
    try:
        yield client, display.display
    finally:
        await client.close()
        await asyncio.to_thread(stop_agent, proc)
        await display.close()


async def post_raw(client: AgentClient, path: str, *, token: str | None = TOKEN, **kw) -> tuple[int, dict]:
    headers = {"X-Dart-Agent-Token": token} if token is not None else {}
    async with aiohttp.ClientSession(headers=headers) as s, s.post(client.base_url + path, **kw) as resp:
        return resp.status, await resp.json(content_type=None)


async def test_requests_without_the_right_token_get_401_and_run_nothing(agent, tmp_path):
    client, _ = agent
    marker = tmp_path / "ran"
    for token in (None, "", "wrong-token-0123456789abcdef", TOKEN[:-1], TOKEN + "x"):
        status, body = await post_raw(client, "/execute", token=token, json={"command": ["touch", str(marker)]})
        assert status == 401 and "X-Dart-Agent-Token" in body["error"], token
        status, _ = await post_raw(client, "/setup/upload", token=token, data={"file_path": str(marker), "file_data": b"x"})
        assert status == 401
        status, _ = await post_raw(client, "/action", token=token, json={"kind": "click", "x": 1, "y": 1})
        assert status == 401
    async with aiohttp.ClientSession() as s:
        for path in ("/screenshot", "/cursor_position", "/platform"):
            async with s.get(client.base_url + path) as r:
                assert r.status == 401, path
        async with s.get(client.base_url + "/health") as r:  # liveness stays open
            assert r.status == 200
    assert not marker.exists()
    with pytest.raises(EnvError, match="401"):
        await AgentClient(client.base_url, token="wrong-token-0123456789abcdef").screenshot()
    # the same request with the token runs
    status, body = await post_raw(client, "/execute", json={"command": ["touch", str(marker)]})
    assert (status, body["returncode"]) == (200, 0) and marker.exists()


async def test_agent_reports_platform_size_and_a_png_screenshot(agent):
    client, _ = agent
    assert await client.platform() == "Linux"
    assert await client.screen_size() == (W, H)
    png = await client.screenshot()
    assert png_size(png) == (W, H)
    assert await client.probe(timeout_s=2)


async def test_execute_runs_argv_without_a_shell_and_reports_exit_status(agent):
    client, display = agent
    res = await client.execute(["printenv", "DISPLAY"])
    assert (res.returncode, res.stdout.strip()) == (0, display)
    res = await client.execute(["echo", "$HOME", ";", "rm", "-rf", "/nothing"])  # no shell: literal words
    assert res.stdout.strip() == "$HOME ; rm -rf /nothing"
    assert (await client.execute(["false"])).returncode == 1
    assert (await client.execute(["no-such-program-xyz"])).returncode == 127
    slow = await client.execute(["sleep", "5"], timeout_s=0.3)
    assert slow.returncode == 124 and "timed out" in slow.stderr


async def test_execute_splits_strings_and_refuses_shell_mode(agent):
    client, _ = agent
    status, body = await post_raw(client, "/execute", json={"command": "echo 'a  b' c", "shell": False})
    assert (status, body["output"], body["returncode"], body["status"]) == (200, "a  b c\n", 0, "success")
    status, body = await post_raw(client, "/execute", json={"command": "echo hi | cat", "shell": True})
    assert status == 400 and "--allow-shell" in body["error"]
    status, body = await post_raw(client, "/execute", data=b"{not json", headers={"Content-Type": "application/json"})
    assert status == 400 and "not JSON" in body["error"]


async def test_upload_then_file_returns_the_same_bytes_and_404_when_missing(agent, tmp_path):
    client, _ = agent
    payload = bytes(range(256)) * 40
    target = tmp_path / "sub" / "blob.bin"
    await client.upload(str(target), payload)
    assert target.read_bytes() == payload
    assert await client.read_file(str(target)) == payload
    async with aiohttp.ClientSession(headers={"X-Dart-Agent-Token": TOKEN}) as s, \
            s.post(client.base_url + "/file", json={"file_path": str(target)}) as r:
        assert (r.status, await r.read()) == (200, payload)  # the JSON form of the request works too
    with pytest.raises(FileNotFoundError):
        await client.read_file(str(tmp_path / "missing.txt"))


async def test_typed_actions_become_input_events_on_the_display(agent):
    client, _ = agent
    await client.act(Click(x=123, y=321))
    status, body = await post_raw(client, "/action", json={"kind": "wait"})
    assert (status, body["status"]) == (200, "noop")
    async with aiohttp.ClientSession(headers={"X-Dart-Agent-Token": TOKEN}) as s, \
            s.get(client.base_url + "/cursor_position") as resp:
        assert await resp.json() == [123, 321]
    await client.act(Drag(x=10, y=10, end_x=5000, end_y=40))  # clamped to the screen
    async with aiohttp.ClientSession(headers={"X-Dart-Agent-Token": TOKEN}) as s, \
            s.get(client.base_url + "/cursor_position") as resp:
        assert await resp.json() == [W - 1, 40]
    await client.act(Scroll(x=50, y=60, direction="down"))
    await client.act(Type(content="abc"))
    await client.act(Hotkey(keys=("ctrl", "a")))
    status, body = await post_raw(client, "/action", json={"kind": "hotkey", "text": "hyperspace"})
    assert (status, body["status"]) == (200, "noop") and "unknown key" in body["error"]


async def test_malformed_actions_are_refused_and_never_evaluated(agent, tmp_path):
    client, _ = agent
    marker = tmp_path / "pwned"
    for body in ({"kind": "click", "x": "1"}, {"kind": "click"}, {"code": f"open('{marker}','w')"},
                 {"kind": "pyautogui", "text": f"open('{marker}','w')"}, ["click"]):
        status, answer = await post_raw(client, "/action", json=body)
        assert status == 400, body
        assert answer["status"] == "error"
    assert not marker.exists()
    assert await client.probe(timeout_s=2)  # the server is still up


async def test_launch_and_activate_window(agent):
    client, _ = agent
    if shutil.which("xmessage") is None:
        pytest.skip("xmessage not installed (apt-get install x11-utils)")
    await client.launch(["xmessage", "-title", "dart-agent-window", "hello"])
    for _ in range(100):
        try:
            await client.activate_window("dart-agent-window")
            break
        except EnvError:
            await asyncio.sleep(0.05)
    else:
        pytest.fail("the launched window never became activatable")
    with pytest.raises(EnvError, match="404"):
        await client.activate_window("no window has this title")


async def test_children_never_inherit_the_token_or_a_dart_secret(agent):
    """The token is the boundary: with it, OSWorld-style setup runs ``bash -c`` and ``python -c``;
    what those children see of the environment holds neither the token nor a DART_* secret."""
    client, display = agent
    for argv in (["bash", "-c", "env; echo ok"], ["python3", "-c", "import os; print(dict(os.environ)); print('ok')"],
                 ["sh", "-c", "cat /proc/self/environ | tr '\\0' '\\n'; echo ok"]):
        status, body = await post_raw(client, "/execute", json={"command": argv})
        assert status == 200 and body["returncode"] == 0 and "ok" in body["output"], (argv, body)
        assert TOKEN not in body["output"] and SECRET not in body["output"], argv
        assert "DART_AGENT_TOKEN" not in body["output"] and SECRET_NAME not in body["output"]
        assert f"DISPLAY={display}" in body["output"] or f"'DISPLAY': '{display}'" in body["output"]
