"""VmPool lifecycle against libvirt's ``test:///default`` driver (real libvirt, no daemon)."""

from __future__ import annotations

import asyncio
import shutil
import subprocess

import pytest

from dart.env.libvirt import VmPool, VmPoolConfig, hypervisor
from dart.env.libvirt.policy import Verdict, VmState
from dart.errors import EnvError

pytestmark = pytest.mark.vm


def make_cfg(prefix, template, tmp_path, **kw):
    fields = {"uri": "test:///default", "name_prefix": prefix, "template": template,
              "overlay_dir": tmp_path / "vms", "memory_mib": 64, "vcpus": 1, "ready_timeout_s": 0.3,
              "probe_timeout_s": 0.1, **kw}
    return VmPoolConfig(**fields)


def our_domains(conn, prefix):
    return sorted(d.name() for d in conn.listAllDomains(0) if d.name().startswith(prefix))


async def wait_state(pool, name, state, timeout_s=5.0):
    async def poll():
        while not any(v.name == name and v.state == state for v in [*pool._vms.values(), *pool._quarantined]):
            await asyncio.sleep(0.01)
    await asyncio.wait_for(poll(), timeout_s)


async def test_pool_builds_every_slot_snapshots_it_and_removes_it_on_close(test_conn, prefix, template, tmp_path,
                                                                           guest):
    beats = []
    pool = VmPool(make_cfg(prefix, template, tmp_path, size=2), conn=test_conn, prober=guest,
                  on_heartbeat=beats.append, run_id="run-1", worker_id="env-7")
    await pool.start()
    names = [f"{prefix}-0-0", f"{prefix}-1-0"]
    assert pool.ready_names() == names == our_domains(test_conn, prefix)
    for name in names:
        dom = test_conn.lookupByName(name)
        assert dom.isActive() and dom.snapshotListNames(0) == ["dart-clean"]
        assert f'pool="{prefix}"' in dom.XMLDesc(0)
    ready = [b for b in beats if b.info.get("event") == "ready"]
    assert sorted(b.worker_id for b in ready) == [f"env-7/{n}" for n in names]
    assert {"vm/define_s", "vm/start_s", "vm/ready_s", "vm/snapshot_s"} <= set(ready[0].metrics)
    assert all(b.run_id == "run-1" and b.role == "vm" and b.state == "ready" for b in ready)
    pool_beat = pool.heartbeats()[-1]
    assert (pool_beat.worker_id, pool_beat.role, pool_beat.slots, pool_beat.metrics["pool/ready"],
            pool_beat.health) == (f"env-7/{prefix}", "vm_pool", 2, 2.0, "ok")
    await pool.close()
    assert our_domains(test_conn, prefix) == []
    assert not any((tmp_path / "vms").iterdir())


async def test_reset_reverts_to_the_snapshot_and_reports_timings(test_conn, prefix, template, tmp_path, guest):
    beats = []
    async with VmPool(make_cfg(prefix, template, tmp_path), conn=test_conn, prober=guest,
                      on_heartbeat=beats.append) as pool:
        lease = await pool.acquire()
        dom = test_conn.lookupByName(lease.name)
        dom.suspend()  # the trajectory left the VM in some other state
        assert dom.state()[0] == 3
        timings = await pool.reset(lease)
        assert dom.state()[0] == 1  # running, as in the snapshot
        dom.destroy()  # even a VM that died mid-trajectory comes back by revert
        await pool.reset(lease)
        assert dom.isActive()
        assert set(timings) == {"revert", "ready", "reset"} and timings["reset"] >= timings["revert"]
        reverted = [b for b in beats if b.info.get("event") == "reverted"]
        assert len(reverted) == 2 and "vm/revert_s" in reverted[-1].metrics and reverted[-1].state == "busy"
        assert await pool.release(lease, ok=True) == Verdict.KEEP


async def test_vm_is_recycled_after_k_trajectories_and_old_leases_are_refused(test_conn, prefix, template,
                                                                               tmp_path, guest):
    async with VmPool(make_cfg(prefix, template, tmp_path, recycle_after=2), conn=test_conn, prober=guest) as pool:
        first = await pool.acquire()
        assert await pool.release(first, ok=True) == Verdict.KEEP
        second = await pool.acquire()
        assert await pool.release(second, ok=True) == Verdict.RECYCLE
        await wait_state(pool, first.name, VmState.READY)
        vm = pool._vms[0]
        assert (vm.name, vm.stats.recycles, vm.stats.trajectories, vm.stats.trajectories_total) == (first.name, 1, 0, 2)
        assert len(vm.timings.history["define"]) == 2
        with pytest.raises(EnvError, match="no longer valid"):
            await pool.reset(second)
        third = await pool.acquire()
        assert third.token != second.token
        await pool.release(third, ok=True)


async def test_repeated_failures_quarantine_the_vm_and_a_replacement_keeps_the_pool_at_size(
        test_conn, prefix, template, tmp_path, guest):
    beats = []
    cfg = make_cfg(prefix, template, tmp_path, quarantine_after=2)
    async with VmPool(cfg, conn=test_conn, prober=guest, on_heartbeat=beats.append, worker_id="env-1") as pool:
        lease = await pool.acquire()
        assert await pool.release(lease, ok=False, error="agent died") == Verdict.RECYCLE
        await wait_state(pool, lease.name, VmState.READY)
        lease = await pool.acquire()
        assert await pool.release(lease, ok=False, error="agent died again") == Verdict.QUARANTINE
        await wait_state(pool, f"{prefix}-0-1", VmState.READY)
        q = [b for b in beats if b.state == "quarantined"]
        assert len(q) == 1 and q[0].worker_id == f"env-1/{prefix}-0-0"
        assert q[0].health == "quarantined: agent died again" and q[0].info["event"] == "quarantined"
        assert q[0].metrics["vm/failures_in_row"] == 2.0
        old = test_conn.lookupByName(f"{prefix}-0-0")  # kept for post-mortem, stopped
        assert not old.isActive()
        assert pool.ready_names() == [f"{prefix}-0-1"]
        pool_beat = pool.heartbeats()[-1]
        assert pool_beat.metrics["pool/quarantined"] == 1.0 and pool_beat.health == "ok"
        new = await pool.acquire()
        assert new.name == f"{prefix}-0-1"
        await pool.release(new, ok=True)
    assert our_domains(test_conn, prefix) == [f"{prefix}-0-0"]  # only the quarantined one stays
    hypervisor.remove(test_conn, f"{prefix}-0-0")


async def test_a_guest_that_never_answers_is_quarantined_at_build_and_replaced(test_conn, prefix, template,
                                                                               tmp_path, guest):
    guest.sick.add(f"{prefix}-0-0")
    cfg = make_cfg(prefix, template, tmp_path, quarantine_after=2, keep_quarantined=False)
    async with VmPool(cfg, conn=test_conn, prober=guest) as pool:
        await wait_state(pool, f"{prefix}-0-1", VmState.READY)
        assert pool._quarantined[0].stats.failures_in_row == 2
        assert "not ready" in pool._quarantined[0].stats.last_error
        assert guest.probes[f"{prefix}-0-0"] >= 4  # polled, not slept on
    assert our_domains(test_conn, prefix) == []


async def test_a_failed_health_probe_on_release_counts_as_a_failure(test_conn, prefix, template, tmp_path, guest):
    async with VmPool(make_cfg(prefix, template, tmp_path), conn=test_conn, prober=guest) as pool:
        lease = await pool.acquire()
        guest.sick.add(lease.name)
        assert not (await pool.probe(lease)).ok
        assert await pool.release(lease, ok=True) == Verdict.RECYCLE
        assert pool._vms[0].stats.last_error.startswith("health probe")
        guest.sick.clear()
        await wait_state(pool, lease.name, VmState.READY)


async def test_start_destroys_leftovers_of_its_own_prefix_only(test_conn, prefix, template, tmp_path, guest):
    def define(name, run=True):
        dom = test_conn.defineXML(
            f"<domain type='test'><name>{name}</name><memory unit='MiB'>64</memory>"
            "<os><type arch='x86_64'>hvm</type></os></domain>")
        if run:
            dom.create()
            dom.snapshotCreateXML("<domainsnapshot><name>old</name></domainsnapshot>", 0)
        return dom

    for name in (f"{prefix}-0-0", f"{prefix}-4-2"):
        define(name)
    define(f"{prefix}-x-0-0", run=False)
    define(f"keep-{prefix}-0-0", run=False)
    (tmp_path / "vms" / f"{prefix}-4-2").mkdir(parents=True)
    async with VmPool(make_cfg(prefix, template, tmp_path), conn=test_conn, prober=guest) as pool:
        assert pool.removed_leftovers == [f"{prefix}-0-0", f"{prefix}-4-2"]
        assert our_domains(test_conn, prefix) == [f"{prefix}-0-0", f"{prefix}-x-0-0"]
        assert test_conn.lookupByName(f"{prefix}-0-0").snapshotListNames(0) == ["dart-clean"]
        assert not (tmp_path / "vms" / f"{prefix}-4-2").exists()
    for name in (f"{prefix}-x-0-0", f"keep-{prefix}-0-0"):
        test_conn.lookupByName(name).undefine()


async def test_acquire_waits_for_a_free_vm_and_times_out_with_a_reason(test_conn, prefix, template, tmp_path, guest):
    async with VmPool(make_cfg(prefix, template, tmp_path), conn=test_conn, prober=guest) as pool:
        lease = await pool.acquire()
        with pytest.raises(EnvError, match="became free within"):
            await pool.acquire(timeout_s=0.1)
        waiter = asyncio.create_task(pool.acquire(timeout_s=5))
        await asyncio.sleep(0.05)
        await pool.release(lease, ok=True)
        again = await waiter
        assert again.name == lease.name
        await pool.release(again, ok=True)


async def test_start_fails_when_no_vm_ever_becomes_ready(test_conn, prefix, template, tmp_path, guest):
    guest.sick.update(f"{prefix}-0-{g}" for g in range(10))
    pool = VmPool(make_cfg(prefix, template, tmp_path, quarantine_after=1, keep_quarantined=False, ready_timeout_s=0.05),
                  conn=test_conn, prober=guest)
    with pytest.raises(EnvError, match="no VM became ready"):
        await pool.start()
    await pool.close()
    assert our_domains(test_conn, prefix) == []


@pytest.mark.skipif(shutil.which("qemu-img") is None, reason="qemu-img not installed (apt-get install qemu-utils)")
async def test_each_vm_runs_on_its_own_qcow2_overlay_of_the_base(test_conn, prefix, tmp_path, guest):
    base = tmp_path / "base.qcow2"
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", str(base), "8M"], check=True)
    template = tmp_path / "disk.xml.tmpl"
    template.write_text(
        "<domain type='test'><name>${name}</name><memory unit='MiB'>${memory_mib}</memory>"
        "<os><type arch='x86_64'>hvm</type></os><devices><disk type='file' device='disk'>"
        "<source file='${disk}'/><target dev='vda'/></disk></devices></domain>")
    async with VmPool(make_cfg(prefix, template, tmp_path, base_image=base, size=2), conn=test_conn,
                      prober=guest) as pool:
        for vm in pool._vms.values():
            info = subprocess.run(["qemu-img", "info", "--output=json", str(vm.disk)], capture_output=True,
                                  text=True, check=True).stdout
            assert str(base) in info and f"{vm.name}/disk.qcow2" in test_conn.lookupByName(vm.name).XMLDesc(0)
    assert not list((tmp_path / "vms").iterdir())


def test_the_deploy_template_renders_to_a_domain_libvirt_accepts(test_conn, prefix):
    from dart.env.libvirt import domain

    cfg = VmPoolConfig(base_image="/var/lib/dart/base/osworld.qcow2")
    template = domain.read_template(cfg.template)
    domain.check_template(template, cfg.template_vars, has_disk=True)
    name = domain.domain_name(prefix, 0, 0)
    xml = domain.render(template, extra=cfg.template_vars, values={
        "name": name, "uuid": "8c1f5d4e-8f0b-4f7e-9a57-0a3c1c0f9b11", "memory_mib": 4096, "vcpus": 2,
        "disk": "/var/lib/dart/vms/x/disk.qcow2", "vm_dir": "/var/lib/dart/vms/x",
        "metadata": domain.metadata_xml(prefix, 0, 0), "agent_token": "tok-0123456789abcdef",
        "agent_token_file": "/var/lib/dart/vms/x/agent_token"})
    assert "tok-0123456789abcdef" not in xml  # QEMU gets a file name: the token is on no command line
    dom = test_conn.defineXML(xml)
    try:
        desc = dom.XMLDesc(0)
        assert "<source network='default'/>" in desc and "/var/lib/dart/vms/x/disk.qcow2" in desc
        assert "<entry name='opt/dart/agent_token' file='/var/lib/dart/vms/x/agent_token'/>" in desc  # to the guest
        assert "<memballoon model='none'/>" in desc
    finally:
        dom.undefine()


async def test_idle_probes_recycle_a_sick_idle_vm_and_leave_healthy_ones(test_conn, prefix, template, tmp_path, guest):
    beats = []
    async with VmPool(make_cfg(prefix, template, tmp_path, size=2), conn=test_conn, prober=guest,
                      on_heartbeat=beats.append) as pool:
        sick = f"{prefix}-1-0"
        guest.sick.add(sick)
        results = await pool.probe_idle()
        assert results[f"{prefix}-0-0"].ok and not results[sick].ok
        assert pool._vms[1].state in (VmState.RECYCLING, VmState.BUILDING)
        lease = await pool.acquire(timeout_s=1)
        assert lease.name == f"{prefix}-0-0"  # the sick one is never handed out
        failed = [b for b in beats if b.info.get("event") == "failed"]
        assert failed[0].info["phase"] == "idle_probe" and "idle probe" in failed[0].info["last_error"]
        guest.sick.clear()
        await wait_state(pool, sick, VmState.READY)
        await pool.release(lease, ok=True)


async def test_every_vm_build_gets_its_own_agent_token_and_probes_send_it(test_conn, prefix, template, tmp_path):
    seen: dict[str, str | None] = {}

    class RecordingProber:
        async def ready(self, vm, *, timeout_s):
            seen[vm.name] = vm.agent_token
            return True

    async with VmPool(make_cfg(prefix, template, tmp_path, size=2), conn=test_conn, prober=RecordingProber()) as pool:
        assert set(seen) == {f"{prefix}-0-0", f"{prefix}-1-0"}
        tokens = list(seen.values())
        assert len(set(tokens)) == 2 and all(t and len(t) >= 32 for t in tokens)
        assert {v.client.token for v in pool._vms.values()} == set(tokens)  # the backends' client sends it too
        for vm in pool._vms.values():  # QEMU reads it from a file only the pool's user may read
            token_file = vm.vm_dir / "agent_token"
            assert token_file.read_text() == vm.agent_token and token_file.stat().st_mode & 0o777 == 0o600
    (tmp_path / "token").write_text("fixed-token-0123456789\n")
    seen.clear()
    async with VmPool(make_cfg(prefix, template, tmp_path, agent_token_file=tmp_path / "token"), conn=test_conn,
                      prober=RecordingProber()):
        assert list(seen.values()) == ["fixed-token-0123456789"]
