"""The env worker on the libvirt backend, end to end: the real broker, one VM pool on libvirt's
``test:///default`` driver, and the real ``dart guest-agent`` over Xvfb standing in for the
guests (both VMs' agent URL points at it)."""

from __future__ import annotations

import asyncio
import json
import shutil
import uuid

import pytest

from dart.agent.actions import Click
from dart.bus import Producer, read_topic
from dart.config import build
from dart.env.backends import VmPoolBackends
from dart.env.libvirt.testdriver import TEST_TEMPLATE, free_port, start_agent, stop_agent
from dart.env.worker import EnvWorker, EnvWorkerConfig
from dart.env.xdesktop.display import XDisplay
from dart.errors import ConfigError, EnvError
from dart.events import RolloutRequested, TrajectoryStatus, WorkerHeartbeat

libvirt = pytest.importorskip("libvirt")
pytestmark = pytest.mark.vm
needs_xvfb = pytest.mark.skipif(shutil.which("Xvfb") is None or shutil.which("xdotool") is None,
                                reason="needs Xvfb and xdotool (apt-get install xvfb xdotool)")

W, H = 640, 480
CLICK_TASK = {
    "id": "vm-click", "instruction": "Click at (300, 200).", "snapshot": "", "source": "test",
    # each reset moves the pointer away, so a reward of 1 needs this trajectory's click
    "config": [{"type": "execute", "parameters": {"command": ["xdotool", "mousemove", "5", "5"]}}],
    "evaluator": {"func": "check_include_exclude",
                  "result": {"type": "vm_command_line", "command": ["xdotool", "getmouselocation", "--shell"]},
                  "expected": {"type": "rule", "rules": {"include": ["X=300\n", "Y=200\n"]}}},
}


def worker_config(prefix, tmp_path, agent_url, **libvirt):
    """Built from a mapping like the CLI's YAML, so the ``env.libvirt`` section is coerced the same way."""
    return build(EnvWorkerConfig, {
        "backend": "libvirt", "slots": 1, "worker_id": "env-vm", "run_id": "test", "heartbeat_s": 0.5,
        "reply_timeout_s": 15, "libvirt": {
            "uri": "test:///default", "name_prefix": prefix, "size": 2, "template": str(tmp_path / "domain.tmpl"),
            "overlay_dir": str(tmp_path / "vms"), "agent_urls": [agent_url, agent_url], "memory_mib": 64,
            "vcpus": 1, "ready_timeout_s": 20, "probe_timeout_s": 1, **libvirt},
    }, path="env")


def lifecycle(beats, vm, *, since=lambda h: True):
    """The VM's lifecycle events in order (a VM's records share one key: one partition, in order),
    from the first record ``since`` accepts on."""
    mine = [h for h in beats if h.role == "vm" and h.worker_id.endswith(f"/{vm}") and h.info.get("event")]
    start = next((i for i, h in enumerate(mine) if since(h)), len(mine))
    return [h.info["event"] for h in mine[start:]]


def failed(phase, error=""):
    """Accepts the record of a VM failure in ``phase`` whose last error mentions ``error``."""
    return lambda h: (h.info["event"], h.info.get("phase")) == ("failed", phase) and error in h.info.get("last_error", "")


async def wait_until(cond):
    while not cond():
        await asyncio.sleep(0.05)


def test_libvirt_section_errors_name_the_env_libvirt_field(tmp_path):
    with pytest.raises(ConfigError, match=r"^env\.libvirt\.size: must be >= 1"):
        worker_config("p", tmp_path, "http://x", size=0)
    with pytest.raises(ConfigError, match=r"^env\.libvirt\.probe_timeout_s: input should be a valid number"):
        worker_config("p", tmp_path, "http://x", probe_timeout_s="fast")
    with pytest.raises(ConfigError, match=r"^env\.libvirt\.size: 2 VMs for 3 slots"):
        build(EnvWorkerConfig, {"backend": "libvirt", "slots": 3, "libvirt": {"size": 2}}, path="env")
    cfg = worker_config("p", tmp_path, "http://x")
    assert cfg.libvirt.agent_urls == ("http://x", "http://x") and cfg.libvirt.overlay_dir == tmp_path / "vms"


@pytest.mark.kafka
async def test_a_pool_that_cannot_start_stops_the_worker_before_it_takes_any_request(bus, blobs, tmp_path):
    prefix = f"w{uuid.uuid4().hex[:8]}"
    (tmp_path / "domain.tmpl").write_text(TEST_TEMPLATE)
    cfg = worker_config(prefix, tmp_path, f"http://127.0.0.1:{free_port()}", size=1, ready_timeout_s=0.2,
                        quarantine_after=1, keep_quarantined=False)  # no agent answers there
    worker = EnvWorker(cfg, bus, blobs)
    with pytest.raises(EnvError, match="no VM became ready"):
        await asyncio.wait_for(worker.run(), 30)
    assert not worker.assigned.is_set()  # it never joined the requests group
    host = libvirt.open("test:///default")
    assert [d.name() for d in host.listAllDomains(0) if d.name().startswith(prefix)] == []
    host.close()


@pytest.mark.kafka
@pytest.mark.xdesktop
@needs_xvfb
async def test_env_worker_runs_vm_trajectories_and_a_dead_guest_is_an_infra_error_not_a_reward(
        bus, blobs, kit, tmp_path):
    bus = kit.fast_bus(bus)
    prefix = f"w{uuid.uuid4().hex[:8]}"
    (tmp_path / "domain.tmpl").write_text(TEST_TEMPLATE)
    (tmp_path / "home").mkdir()
    display = XDisplay(width=W, height=H, home=tmp_path / "home", wm="")
    await display.start()
    port = free_port()
    agent = [await asyncio.to_thread(start_agent, display.display, port)]
    host = libvirt.open("test:///default")  # the same in-process driver state the worker's pool sees
    host.defineXML(f"<domain type='test'><name>{prefix}-5-0</name><memory unit='MiB'>64</memory>"
                   "<os><type arch='x86_64'>hvm</type></os></domain>")  # a crashed worker's leftover
    producer = Producer(bus, client_id="test")
    await kit.register_tasks(bus, producer, [CLICK_TASK], "libvirt")
    good, broken = (kit.request("vm-click", backend="libvirt", max_steps=5) for _ in range(2))

    class GuestKillingOracle(kit.OracleResponder):
        """Kills the guest agent before it answers the first attempt of ``broken``."""

        async def _answer(self, obs):
            if obs.rollout_id == f"{broken.request_id}.0":
                await asyncio.to_thread(stop_agent, agent[0])
            await super()._answer(obs)

    worker = EnvWorker(worker_config(prefix, tmp_path, f"http://127.0.0.1:{port}"), bus, blobs)
    assert isinstance(worker.backends, VmPoolBackends)
    pool = worker.backends.pool
    run = None
    try:
        async with GuestKillingOracle(bus, {"vm-click": [Click(x=300, y=200)]}):
            run = asyncio.create_task(worker.run())
            await worker.ready(30)
            names = sorted(d.name() for d in host.listAllDomains(0) if d.name().startswith(prefix))
            assert names == [f"{prefix}-0-0", f"{prefix}-1-0"]  # the leftover is gone, both VMs up

            await producer.send(good)
            await kit.results(bus, lambda ts: len(ts) >= 1)
            await producer.send(broken)
            await kit.results(bus, lambda ts: any(t.status == TrajectoryStatus.INFRA_ERROR for t in ts))
            agent[0] = await asyncio.to_thread(start_agent, display.display, port)  # the rebuilt guest is back
            trajs, rewards = await kit.results(bus, lambda ts: len(ts) >= 3)

            # A VM destroyed behind the pool's back while idle: the heartbeat tick's probe finds it.
            await asyncio.wait_for(wait_until(lambda: pool.ready_names()), 20)
            spare = pool.ready_names()[0]
            host.lookupByName(spare).destroy()
            beats = await kit.collect(bus, bus.topics.heartbeats, WorkerHeartbeat, lambda hs: "recycled" in
                                      lifecycle(hs, spare, since=failed("idle_probe", "not running")), 20)
    finally:
        if run is not None:
            run.cancel()
            await asyncio.gather(run, return_exceptions=True)
        await asyncio.to_thread(stop_agent, agent[0])
        await display.close()
        producer.close()

    by_id = {t.rollout_id: t for t in trajs}
    assert sorted(by_id) == sorted([f"{good.request_id}.0", f"{broken.request_id}.0", f"{broken.request_id}.1"])
    dead = by_id[f"{broken.request_id}.0"]
    assert dead.status == TrajectoryStatus.INFRA_ERROR and "unreachable" in dead.error
    assert by_id[f"{good.request_id}.0"].status == by_id[f"{broken.request_id}.1"].status == TrajectoryStatus.SUCCESS
    # never a reward for the failed attempt: one reward of 1 for each trajectory that ran
    assert sorted((r.rollout_id, r.reward) for r in rewards) == sorted(
        [(f"{good.request_id}.0", 1.0), (f"{broken.request_id}.1", 1.0)])
    requests = [d.event async for d in read_topic(bus, bus.topics.requests, idle_timeout_s=0.5)]
    assert sorted(r.attempt for r in requests if isinstance(r, RolloutRequested) and
                  r.request_id == broken.request_id) == [0, 1]

    vms = [f"{prefix}-0-0", f"{prefix}-1-0"]
    assert all(lifecycle(beats, vm)[0] == "ready" for vm in vms)
    good_vm = json.loads(next(r.details for r in rewards if r.rollout_id == f"{good.request_id}.0"))["vm"]
    assert lifecycle(beats, good_vm)[:3] == ["ready", "reverted", "released"]  # back in the pool once it ended
    # the dead guest's VM: failed when the slot gave it back, rebuilt once the agent answered again
    assert any(lifecycle(beats, vm, since=failed("trajectory", "unreachable"))[:2] == ["failed", "recycling"]
               for vm in vms)
    # (an idle probe during the agent's outage may have failed too: this one is the destroyed domain)
    assert lifecycle(beats, spare, since=failed("idle_probe", "not running")) == [
        "failed", "recycling", "ready", "recycled"]
    pool_beats = [h for h in beats if h.role == "vm_pool"]
    assert pool_beats and {h.worker_id for h in pool_beats} == {f"env-vm/{prefix}"}
    assert pool_beats[-1].slots == 2 and pool_beats[-1].metrics["pool/quarantined"] == 0.0
    env_beats = [h for h in beats if h.worker_id == "env-vm"]  # the pool never speaks with the worker's id
    assert env_beats and {h.role for h in env_beats} == {"env"}
    left = [d.name() for d in host.listAllDomains(0) if d.name().startswith(prefix)]
    host.close()
    assert left == []  # the stopped worker closed its pool
