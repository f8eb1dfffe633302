"""Whole trajectories through LibvirtBackend: the "VM" is a ``test:///default`` domain, its
guest agent is the real ``dart guest-agent`` over Xvfb on loopback."""

from __future__ import annotations

import asyncio
import shutil

import pytest

from dart.agent.actions import Click, Finished, Type, Wait
from dart.env.libvirt import LibvirtBackend, VmPool, VmPoolConfig
from dart.env.libvirt.backend import png_size
from dart.env.libvirt.policy import VmState
from dart.env.libvirt.testdriver import free_port, start_agent, stop_agent
from dart.env.tasks import Task
from dart.env.xdesktop.display import XDisplay
from dart.errors import EnvError

pytestmark = [pytest.mark.vm, pytest.mark.xdesktop,
              pytest.mark.skipif(shutil.which("Xvfb") is None or shutil.which("xdotool") is None,
                                 reason="needs Xvfb and xdotool (apt-get install xvfb xdotool)")]

W, H = 640, 480


def cursor_task(work, source) -> Task:
    """Setup uploads a file and starts an app; success = the pointer ends at (300, 200) and the
    uploaded file arrived intact."""
    return Task.from_dict({
        "id": "vm-cursor", "instruction": "Click at (300, 200).", "snapshot": "", "source": "test",
        "config": [
            {"type": "execute", "parameters": {"command": ["mkdir", "-p", str(work)]}},
            {"type": "download", "parameters": {"files": [{"url": f"file://{source}", "path": str(work / "in.txt")}]}},
            {"type": "launch", "parameters": {"command": ["xmessage", "-title", "dart-task", "task window"]}},
        ],
        "evaluator": {
            "func": ["check_include_exclude", "exact_match"],
            "conj": "and",
            "result": [{"type": "vm_command_line", "command": "xdotool getmouselocation --shell", "shell": True},
                       {"type": "vm_command_line", "command": ["cat", str(work / "in.txt")]}],
            "expected": [{"type": "rule", "rules": {"include": ["X=300\n", "Y=200\n"]}},
                         {"type": "rule", "rules": {"expected": "hello from the host\n"}}],
        },
    })


@pytest.fixture
async def desktop(tmp_path):
    display = XDisplay(width=W, height=H, home=tmp_path / "home", wm="")
    (tmp_path / "home").mkdir()
    await display.start()
    yield display
    await display.close()


async def test_full_trajectories_reset_by_revert_act_and_evaluate(test_conn, prefix, template, tmp_path, desktop):
    source = tmp_path / "source.txt"
    source.write_text("hello from the host\n")
    port = free_port()
    agent = await asyncio.to_thread(start_agent, desktop.display, port)
    beats = []
    cfg = VmPoolConfig(uri="test:///default", name_prefix=prefix, template=template, overlay_dir=tmp_path / "vms",
                       agent_urls=(f"http://127.0.0.1:{port}",), ready_timeout_s=10, probe_timeout_s=2)
    task = cursor_task(tmp_path / "work", source)
    try:
        async with VmPool(cfg, conn=test_conn, on_heartbeat=beats.append, worker_id="env-3") as pool:
            env = LibvirtBackend(pool, wait_s=0.0)
            obs = await env.reset(task)
            assert (obs.width, obs.height) == (W, H) and png_size(obs.screenshot_png) == (W, H)
            assert obs.info["vm"] == f"{prefix}-0-0" and obs.info["setup_steps"] == 3
            assert {"vm/revert_s", "vm/ready_s"} <= set(obs.info)
            assert (tmp_path / "work" / "in.txt").read_text() == "hello from the host\n"
            for action in (Click(x=50, y=60), Type(content="typed into the task window"), Wait(), Click(x=300, y=200)):
                obs = await env.step(action)
                assert obs.width == W
            score, details = await env.evaluate(task, final_action=Finished())
            assert score == 1.0 and details["vm"] == f"{prefix}-0-0" and len(details["metrics"]) == 2

            # Second trajectory on the same slot: the VM is given back, reverted, set up again.
            await env.reset(task)
            await env.step(Click(x=10, y=10))
            score, _ = await env.evaluate(task, final_action=Finished())
            assert score == 0.0  # the pointer is not where the task wants it: a real 0, not an error
            vm = pool._vms[0]
            assert vm.stats.trajectories_total == 1 and vm.state == VmState.BUSY
            await env.close()
            assert vm.state == VmState.READY and vm.stats.trajectories_total == 2
            assert (await env.health()).ok
        events = [b.info["event"] for b in beats if b.worker_id == f"env-3/{prefix}-0-0"]
        assert events == ["ready", "reverted", "released", "reverted", "released"]
    finally:
        await asyncio.to_thread(stop_agent, agent)


async def test_a_dead_agent_is_an_infra_error_and_the_vm_is_recycled_before_the_next_trajectory(
        test_conn, prefix, template, tmp_path, desktop):
    source = tmp_path / "source.txt"
    source.write_text("hello from the host\n")
    port = free_port()
    agent = await asyncio.to_thread(start_agent, desktop.display, port)
    beats = []
    cfg = VmPoolConfig(uri="test:///default", name_prefix=prefix, template=template, overlay_dir=tmp_path / "vms",
                       agent_urls=(f"http://127.0.0.1:{port}",), ready_timeout_s=15, probe_timeout_s=1)
    task = cursor_task(tmp_path / "work", source)
    try:
        async with VmPool(cfg, conn=test_conn, on_heartbeat=beats.append) as pool:
            env = LibvirtBackend(pool)
            await env.reset(task)
            await asyncio.to_thread(stop_agent, agent)  # the guest's agent dies mid-trajectory
            with pytest.raises(EnvError, match="unreachable"):
                await env.step(Click(x=1, y=1))
            assert not (await env.health()).ok
            agent = await asyncio.to_thread(start_agent, desktop.display, port)  # the rebuilt guest comes back
            obs = await env.reset(task)
            assert obs.width == W
            vm = pool._vms[0]
            assert vm.stats.recycles == 1 and vm.stats.failures_total == 1
            assert vm.stats.last_error.startswith("action click")
            events = [b.info["event"] for b in beats]
            assert events[:4] == ["ready", "reverted", "failed", "recycling"] and "recycled" in events
            await env.close()
    finally:
        await asyncio.to_thread(stop_agent, agent)
