"""A pool of libvirt domains: built from a base image, reset by snapshot revert, kept healthy.

Life of a VM: overlay + define + start → guest agent answers → snapshot ``dart-clean``
(READY). A backend acquires it (BUSY), ``reset`` reverts the snapshot and probes the agent
until it answers (never a fixed sleep), and releases it with the trajectory's outcome;
:func:`policy.after_outcome` then keeps, recycles (rebuild in the background) or
quarantines it (stopped, kept for post-mortem, replaced by a new domain in the same slot).
Every lifecycle step reports a ``WorkerHeartbeat`` (role ``vm``) through ``on_heartbeat``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import shutil
import socket
import time
import uuid
from collections.abc import Callable
from typing import Any

from dart.env.backend import Health
from dart.env.guest_agent.protocol import parse_token
from dart.env.libvirt import domain, hypervisor, policy
from dart.env.libvirt.agent_client import AgentClient
from dart.env.libvirt.config import VmPoolConfig
from dart.env.libvirt.policy import Verdict, VmState
from dart.env.libvirt.vm import AgentProber, PooledVm, Prober, VmLease
from dart.errors import ConfigError, EnvError
from dart.events import WorkerHeartbeat

log = logging.getLogger(__name__)

MAX_REPLACEMENTS_IN_ROW = 3
"""A slot whose replacements keep getting quarantined is given up (the host, not the VM, is sick)."""


def _read_token_file(path: Any) -> str:
    try:
        return parse_token(path.read_text())
    except OSError as exc:
        raise ConfigError(f"agent_token_file: cannot read {path}: {exc}") from exc


class VmPool:
    """``size`` VMs of one base image on one libvirt connection. Use as ``async with``."""

    def __init__(self, cfg: VmPoolConfig, *, conn: Any = None, prober: Prober | None = None,
                 on_heartbeat: Callable[[WorkerHeartbeat], None] | None = None,
                 run_id: str = "", worker_id: str = "vm-pool") -> None:
        self.cfg = cfg
        self._conn, self._own_conn = conn, conn is None
        self._prober = prober or AgentProber()
        self._on_heartbeat = on_heartbeat
        self.run_id, self.worker_id = run_id, worker_id
        self._template = domain.read_template(cfg.template)
        domain.check_template(self._template, cfg.template_vars, has_disk=cfg.base_image is not None)
        self._vms: dict[int, PooledVm] = {}
        self._dead_slots: set[int] = set()
        self._replacements: dict[int, int] = {}
        self._quarantined: list[PooledVm] = []
        self._tokens: dict[str, int] = {}
        self._fixed_token = _read_token_file(cfg.agent_token_file) if cfg.agent_token_file else None
        self._changed = asyncio.Condition()
        self._build_gate = asyncio.Semaphore(cfg.build_concurrency)
        self._tasks: set[asyncio.Task[None]] = set()
        self._crash: BaseException | None = None
        self._started = time.monotonic()
        self._host = socket.gethostname()
        self.removed_leftovers: list[str] = []

    # ---- start and stop -------------------------------------------------------------------
    async def __aenter__(self) -> VmPool:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @property
    def conn(self) -> Any:
        return self._conn

    async def start(self) -> None:
        """Remove this pool's leftovers, then build every slot; fails if no VM came up."""
        if self._conn is None:
            self._conn = await asyncio.to_thread(hypervisor.open_connection, self.cfg.uri)
        self.cfg.overlay_dir.mkdir(parents=True, exist_ok=True)
        self.removed_leftovers = await asyncio.to_thread(self._remove_leftovers)
        await asyncio.gather(*(self._build_slot(slot, 0) for slot in range(self.cfg.size)))
        # A slot whose first VM was quarantined is being rebuilt in the background: wait until
        # every slot is ready or given up.
        async with self._changed:
            await self._changed.wait_for(lambda: self._crash is not None or all(
                s in self._dead_slots or (s in self._vms and self._vms[s].state == VmState.READY)
                for s in range(self.cfg.size)))
        if self._crash is not None:
            raise EnvError(f"VM pool {self.cfg.name_prefix} crashed while starting: {self._crash!r}") from self._crash
        if not self.ready_names():
            errors = "; ".join(f"{v.name}: {v.stats.last_error}" for v in self._quarantined) or "no VM built"
            raise EnvError(f"VM pool {self.cfg.name_prefix}: no VM became ready ({errors})")

    def _remove_leftovers(self) -> list[str]:
        names = domain.leftovers(self.cfg.name_prefix, hypervisor.domain_names(self._conn))
        for name in names:
            log.warning("removing leftover domain %s of pool %s", name, self.cfg.name_prefix)
            hypervisor.remove(self._conn, name)
        for path in self.cfg.overlay_dir.iterdir():
            if path.is_dir() and domain.parse_name(self.cfg.name_prefix, path.name) is not None:
                shutil.rmtree(path, ignore_errors=True)
        return names

    async def close(self) -> None:
        """Stop background work, then destroy every VM (quarantined ones only stopped, if kept)."""
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for vm in list(self._vms.values()) + self._quarantined:
            if vm.client is not None:
                await vm.client.close()
            keep = vm.state == VmState.QUARANTINED and self.cfg.keep_quarantined
            with contextlib.suppress(EnvError):
                await asyncio.to_thread(self._teardown, vm, keep)
            if not keep:
                vm.set_state(VmState.CLOSED, time.monotonic())
        self._vms.clear()
        if self._own_conn and self._conn is not None:
            with contextlib.suppress(Exception):
                self._conn.close()
            self._conn = None

    def _teardown(self, vm: PooledVm, keep: bool) -> None:
        if vm.dom is not None:
            hypervisor.stop(vm.dom)
        if not keep:
            hypervisor.remove(self._conn, vm.name)
            shutil.rmtree(vm.vm_dir, ignore_errors=True)

    # ---- building -------------------------------------------------------------------------
    async def _build_slot(self, slot: int, generation: int) -> None:
        name = domain.domain_name(self.cfg.name_prefix, slot, generation)
        vm_dir = self.cfg.overlay_dir / name
        vm = PooledVm(name=name, slot=slot, generation=generation, vm_dir=vm_dir,
                      disk=vm_dir / "disk.qcow2" if self.cfg.base_image else None,
                      agent_url=self.cfg.agent_urls[slot] if self.cfg.agent_urls else None)
        self._vms[slot] = vm
        await self._bring_up(vm)

    async def _bring_up(self, vm: PooledVm) -> None:
        """(Re)build until READY or quarantined; failures count toward quarantine."""
        while True:
            try:
                async with self._build_gate:
                    await self._build_once(vm)
            except EnvError as exc:
                log.warning("building %s failed: %s", vm.name, exc)
                vm.stats, verdict = policy.after_outcome(
                    vm.stats, ok=False, error=f"build: {exc}", recycle_after=self.cfg.recycle_after,
                    quarantine_after=self.cfg.quarantine_after)
                self._emit(vm, "failed", phase="build")
                if verdict == Verdict.QUARANTINE:
                    await self._quarantine(vm)
                    return
                continue
            await self._set(vm, VmState.READY, "ready")
            return

    async def _build_once(self, vm: PooledVm) -> None:
        vm.set_state(VmState.BUILDING, time.monotonic())
        self._tokens[vm.name] = self._tokens.get(vm.name, 0) + 1
        await asyncio.to_thread(self._define, vm)
        running = self.cfg.snapshot_mode == "running"
        if not running:
            await self._timed(vm, "snapshot", hypervisor.create_snapshot, vm.dom,
                              domain.snapshot_xml(self.cfg.snapshot_name, with_memory=False))
        await self._timed(vm, "start", hypervisor.start, vm.dom)
        await self._wait_ready(vm, "boot")
        if running:
            await self._timed(vm, "snapshot", hypervisor.create_snapshot, vm.dom,
                              domain.snapshot_xml(self.cfg.snapshot_name, with_memory=True))

    def _define(self, vm: PooledVm) -> None:
        hypervisor.remove(self._conn, vm.name)
        shutil.rmtree(vm.vm_dir, ignore_errors=True)
        vm.vm_dir.mkdir(parents=True)
        hypervisor.give_to_dir_owner(vm.vm_dir)
        t0 = time.perf_counter()
        if vm.disk is not None and self.cfg.base_image is not None:
            hypervisor.make_overlay(self.cfg.base_image, vm.disk)
            vm.timings.record("overlay", time.perf_counter() - t0)
        # A fresh token per build: a rebuilt or replaced VM never accepts an old VM's token.
        vm.agent_token = self._fixed_token or secrets.token_urlsafe(32)
        # QEMU reads the token from a file (fw_cfg file=...): a string= value would put it on
        # QEMU's command line, where any user of the host sees it in `ps`.
        token_file = vm.vm_dir / "agent_token"
        fd = os.open(token_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(vm.agent_token)
        hypervisor.give_to_dir_owner(token_file)
        values = {"agent_token": vm.agent_token, "agent_token_file": str(token_file), "name": vm.name, "uuid": str(uuid.uuid4()), "memory_mib": self.cfg.memory_mib,
                  "vcpus": self.cfg.vcpus, "disk": str(vm.disk or ""), "vm_dir": str(vm.vm_dir),
                  "metadata": domain.metadata_xml(self.cfg.name_prefix, vm.slot, vm.generation)}
        xml = domain.render(self._template, values=values, extra=self.cfg.template_vars)
        t0 = time.perf_counter()
        vm.dom = hypervisor.define(self._conn, xml, vm.name)
        vm.timings.record("define", time.perf_counter() - t0)

    async def _timed(self, vm: PooledVm, what: str, fn: Any, *args: Any) -> None:
        t0 = time.perf_counter()
        await asyncio.to_thread(fn, *args)
        vm.timings.record(what, time.perf_counter() - t0)

    async def _wait_ready(self, vm: PooledVm, after: str) -> None:
        """Probe until the guest answers; the poll interval backs off from 50 ms to 1 s."""
        t0 = time.perf_counter()
        deadline = t0 + self.cfg.ready_timeout_s
        delay = 0.05
        while True:
            if vm.agent_url is None:
                addrs = await asyncio.to_thread(hypervisor.interface_addresses, vm.dom)
                vm.agent_url = f"http://{addrs[0]}:{self.cfg.agent_port}" if addrs else None
            left = deadline - time.perf_counter()
            if await self._prober.ready(vm.info(), timeout_s=max(0.05, min(self.cfg.probe_timeout_s, left))):
                break
            if time.perf_counter() + delay > deadline:
                raise EnvError(f"{vm.name}: guest agent {vm.agent_url or '(no address yet)'} not ready "
                               f"{self.cfg.ready_timeout_s:g} s after {after}; raise ready_timeout_s or check the guest")
            await asyncio.sleep(delay)
            delay = min(delay * 2, 1.0)
        vm.timings.record("ready", time.perf_counter() - t0)
        if vm.client is None or (vm.client.base_url, vm.client.token) != ((vm.agent_url or "").rstrip("/"), vm.agent_token):
            if vm.client is not None:
                await vm.client.close()
            vm.client = AgentClient(vm.agent_url or "", token=vm.agent_token)

    # ---- leases ---------------------------------------------------------------------------
    def ready_names(self) -> list[str]:
        return sorted(v.name for v in self._vms.values() if v.state == VmState.READY)

    async def acquire(self, *, timeout_s: float | None = None) -> VmLease:
        """A READY VM, waiting (up to ``timeout_s``) while all are busy or rebuilding."""
        async def wait() -> PooledVm:
            async with self._changed:
                while True:
                    if self._crash is not None:
                        raise EnvError(f"VM pool {self.cfg.name_prefix} crashed: {self._crash!r}") from self._crash
                    ready = [v for v in self._vms.values() if v.state == VmState.READY]
                    if ready:
                        return min(ready, key=lambda v: v.state_since)
                    if not self._vms:
                        raise EnvError(f"VM pool {self.cfg.name_prefix} has no VMs left: every slot was "
                                       "quarantined repeatedly; see the vm heartbeats' last_error")
                    await self._changed.wait()
        try:
            vm = await asyncio.wait_for(wait(), timeout_s)
        except TimeoutError as exc:
            raise EnvError(f"no VM of pool {self.cfg.name_prefix} became free within {timeout_s:g} s") from exc
        vm.set_state(VmState.BUSY, time.monotonic())
        assert vm.client is not None
        return VmLease(name=vm.name, slot=vm.slot, agent=vm.client, token=self._tokens[vm.name])

    def _leased(self, lease: VmLease) -> PooledVm:
        vm = self._vms.get(lease.slot)
        if vm is None or vm.name != lease.name or self._tokens.get(vm.name) != lease.token or vm.state != VmState.BUSY:
            raise EnvError(f"lease on {lease.name} is no longer valid (the VM was rebuilt or replaced)")
        return vm

    async def reset(self, lease: VmLease) -> dict[str, float]:
        """Revert the leased VM to its snapshot and wait until its agent answers."""
        vm = self._leased(lease)
        t0 = time.perf_counter()
        await self._timed(vm, "revert", hypervisor.revert, vm.dom, self.cfg.snapshot_name)
        await self._wait_ready(vm, "revert")
        vm.timings.record("reset", time.perf_counter() - t0)
        self._emit(vm, "reverted")
        return {k: vm.timings.latest[k] for k in ("revert", "ready", "reset")}

    async def probe(self, lease: VmLease) -> Health:
        """Health of the leased VM: domain running and guest agent answering."""
        return await self._probe(self._leased(lease))

    async def _probe(self, vm: PooledVm) -> Health:
        if vm.dom is None or not await asyncio.to_thread(hypervisor.is_running, vm.dom):
            return Health(ok=False, detail=f"{vm.name}: domain is not running")
        if not await self._prober.ready(vm.info(), timeout_s=self.cfg.probe_timeout_s):
            return Health(ok=False, detail=f"{vm.name}: guest agent did not answer in {self.cfg.probe_timeout_s:g} s")
        return Health(ok=True, detail=f"{vm.name}: ok")

    async def probe_idle(self) -> dict[str, Health]:
        """Probe every idle VM (call it between trajectories, e.g. with each heartbeat); one that
        fails counts a failure and is recycled or quarantined at once."""
        out: dict[str, Health] = {}
        for vm in [v for v in self._vms.values() if v.state == VmState.READY]:
            health = await self._probe(vm)
            out[vm.name] = health
            if health.ok or vm.state != VmState.READY:  # acquired meanwhile: its user will see
                continue
            vm.stats, verdict = policy.after_outcome(
                vm.stats, ok=False, error=f"idle probe: {health.detail}", recycle_after=self.cfg.recycle_after,
                quarantine_after=self.cfg.quarantine_after)
            vm.set_state(VmState.RECYCLING, time.monotonic())  # before any await: no acquire may take it
            self._emit(vm, "failed", phase="idle_probe")
            self._spawn(self._recycle(vm) if verdict == Verdict.RECYCLE else self._quarantine(vm))
        return out

    async def release(self, lease: VmLease, *, ok: bool, error: str = "") -> Verdict:
        """Give the VM back with the trajectory's outcome; returns what the pool does with it."""
        vm = self._leased(lease)
        if ok:
            health = await self._probe(vm)
            ok, error = health.ok, ("" if health.ok else f"health probe: {health.detail}")
        vm.stats, verdict = policy.after_outcome(vm.stats, ok=ok, error=error, recycle_after=self.cfg.recycle_after,
                                                 quarantine_after=self.cfg.quarantine_after)
        if ok:
            self._replacements[vm.slot] = 0
        if verdict == Verdict.KEEP:
            await self._set(vm, VmState.READY, "released")
        elif verdict == Verdict.RECYCLE:
            if not ok:
                self._emit(vm, "failed", phase="trajectory")
            self._spawn(self._recycle(vm))
        else:
            self._spawn(self._quarantine(vm))
        return verdict

    # ---- recycle, quarantine, replace ------------------------------------------------------
    async def _recycle(self, vm: PooledVm) -> None:
        await self._set(vm, VmState.RECYCLING, "recycling")
        await self._bring_up(vm)
        if vm.state == VmState.READY:
            vm.stats = policy.after_rebuild(vm.stats)
            self._emit(vm, "recycled")

    async def _quarantine(self, vm: PooledVm) -> None:
        """Stop the VM, keep it for post-mortem, and build a replacement in its slot."""
        log.error("quarantining %s after %d failures in a row: %s", vm.name, vm.stats.failures_in_row,
                  vm.stats.last_error)
        vm.health = f"quarantined: {vm.stats.last_error}"[:300]
        with contextlib.suppress(EnvError):
            await asyncio.to_thread(self._teardown, vm, self.cfg.keep_quarantined)
        await self._set(vm, VmState.QUARANTINED, "quarantined")
        self._quarantined.append(vm)
        if self._vms.get(vm.slot) is vm:
            del self._vms[vm.slot]
        done = self._replacements.get(vm.slot, 0)
        if done >= MAX_REPLACEMENTS_IN_ROW:
            self._dead_slots.add(vm.slot)
            log.error("slot %d of pool %s given up after %d replacements in a row", vm.slot,
                      self.cfg.name_prefix, done)
            async with self._changed:
                self._changed.notify_all()
            return
        self._replacements[vm.slot] = done + 1
        self._spawn(self._build_slot(vm.slot, vm.generation + 1))

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._reap)

    def _reap(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            # A bug, not a VM failure (those are handled inside): surface it on the next acquire.
            self._crash = task.exception()
            log.error("VM pool background task crashed", exc_info=self._crash)
            self._spawn(self._notify())

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    async def _set(self, vm: PooledVm, state: VmState, event: str) -> None:
        vm.set_state(state, time.monotonic())
        if state == VmState.READY:
            vm.health = "ok"
        self._emit(vm, event)
        async with self._changed:
            self._changed.notify_all()

    # ---- heartbeats -----------------------------------------------------------------------
    def vm_heartbeat(self, vm: PooledVm, event: str = "", **info: str) -> WorkerHeartbeat:
        now = time.monotonic()
        spent = max(0.0, now - vm.state_since)
        details = {"event": event, "slot": str(vm.slot), "generation": str(vm.generation),
                   "agent_url": vm.agent_url or "", **info}
        return policy.vm_heartbeat(
            run_id=self.run_id, producer=self.worker_id, vm_name=vm.name, state=vm.state, health=vm.health,
            host=self._host, pid=os.getpid(), busy=vm.state == VmState.BUSY,
            busy_s=vm.busy_s + (spent if vm.state == VmState.BUSY else 0.0),
            idle_s=vm.idle_s + (spent if vm.state == VmState.READY else 0.0),
            uptime_s=now - vm.created_at, stats=vm.stats, timings=vm.timings, info=details)

    def heartbeats(self) -> list[WorkerHeartbeat]:
        """The current record of every VM (quarantined ones included) and of the pool itself.

        The pool's record is worker ``<worker_id>/<name_prefix>`` (role ``vm_pool``), never
        ``worker_id`` itself: that is the env worker's id, and the data manager reads each
        id's latest role (an env worker whose latest record said ``vm_pool`` would count as no
        env slots)."""
        vms = list(self._vms.values())
        out = [self.vm_heartbeat(v) for v in vms + self._quarantined]
        states = [v.state for v in vms]
        busy = states.count(VmState.BUSY)
        metrics = policy.pool_metrics([v.timings for v in vms + self._quarantined], ready=states.count(VmState.READY),
                                      busy=busy, quarantined=len(self._quarantined),
                                      building=states.count(VmState.BUILDING) + states.count(VmState.RECYCLING))
        health = "ok" if len(vms) == self.cfg.size else f"degraded: {len(vms)}/{self.cfg.size} slots live"
        out.append(WorkerHeartbeat.new(
            run_id=self.run_id, producer=self.worker_id, worker_id=f"{self.worker_id}/{self.cfg.name_prefix}",
            role="vm_pool", state="running", host=self._host, pid=os.getpid(), slots=self.cfg.size, slots_busy=busy,
            busy_s=sum(v.busy_s for v in vms), idle_s=sum(v.idle_s for v in vms),
            uptime_s=time.monotonic() - self._started, health=health, metrics=metrics,
            info={"uri": self.cfg.uri, "prefix": self.cfg.name_prefix,
                  "dead_slots": ",".join(map(str, sorted(self._dead_slots)))}))
        return out

    def _emit(self, vm: PooledVm, event: str, **info: str) -> None:
        if self._on_heartbeat is None:
            return
        try:
            self._on_heartbeat(self.vm_heartbeat(vm, event, **info))
        except Exception:  # a broken publisher must not take VMs down with it
            log.exception("on_heartbeat callback failed")
