"""Blocking libvirt and qemu-img calls, each wrapped into :class:`EnvError` with the domain named.

These are the only functions that touch the hypervisor; the pool runs them in threads.
One ``virConnect`` is shared by the whole pool (libvirt connections are thread-safe), which
is also what makes ``test:///default`` usable in tests: its state lives with the connection.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

from dart.errors import EnvError, ToolMissing

log = logging.getLogger(__name__)

try:
    import libvirt
except ImportError:  # pragma: no cover - exercised only without the vm extra
    libvirt = None


def _require_libvirt() -> Any:
    if libvirt is None:
        raise ToolMissing("libvirt-python is not installed: make system-deps-vm (libvirt-dev, pkg-config, then pip install -e '.[vm]')")
    return libvirt


def _quiet(_ctx: object, _err: object) -> None:
    """libvirt prints every error to stderr by default; ours are raised with context instead."""


def open_connection(uri: str) -> Any:
    lv = _require_libvirt()
    lv.registerErrorHandler(_quiet, None)
    try:
        return lv.open(uri)
    except lv.libvirtError as exc:
        raise EnvError(f"cannot open libvirt connection {uri!r}: {exc}; is libvirtd running and the URI right?") from exc


def _call(what: str, fn: Any, *args: Any) -> Any:
    lv = _require_libvirt()
    try:
        return fn(*args)
    except lv.libvirtError as exc:
        raise EnvError(f"{what}: {exc}") from exc


def domain_names(conn: Any) -> list[str]:
    return [d.name() for d in _call("list domains", conn.listAllDomains, 0)]


def lookup(conn: Any, name: str) -> Any | None:
    lv = _require_libvirt()
    try:
        return conn.lookupByName(name)
    except lv.libvirtError as exc:
        if exc.get_error_code() == lv.VIR_ERR_NO_DOMAIN:
            return None
        raise EnvError(f"look up domain {name}: {exc}") from exc


def define(conn: Any, xml: str, name: str) -> Any:
    return _call(f"define domain {name}", conn.defineXML, xml)


def start(dom: Any) -> None:
    if not dom.isActive():
        _call(f"start domain {dom.name()}", dom.create)


def is_running(dom: Any) -> bool:
    lv = _require_libvirt()
    try:
        state, _reason = dom.state()
    except lv.libvirtError:
        return False
    return state == lv.VIR_DOMAIN_RUNNING


def stop(dom: Any) -> None:
    """Power off at once (``virsh destroy``); a domain that is not running is fine."""
    lv = _require_libvirt()
    try:
        if dom.isActive():
            dom.destroy()
    except lv.libvirtError as exc:
        if exc.get_error_code() not in (lv.VIR_ERR_OPERATION_INVALID, lv.VIR_ERR_NO_DOMAIN):
            raise EnvError(f"destroy domain {dom.name()}: {exc}") from exc


def undefine(dom: Any) -> None:
    """Forget the domain and its snapshot metadata (the overlay file is the pool's to delete)."""
    lv = _require_libvirt()
    base = lv.VIR_DOMAIN_UNDEFINE_SNAPSHOTS_METADATA | lv.VIR_DOMAIN_UNDEFINE_MANAGED_SAVE
    last: Exception | None = None
    # Not every driver knows every flag (the test driver refuses NVRAM): try the fullest first.
    for flags in (base | lv.VIR_DOMAIN_UNDEFINE_NVRAM, base, 0):
        try:
            dom.undefineFlags(flags)
            return
        except lv.libvirtError as exc:
            if exc.get_error_code() == lv.VIR_ERR_NO_DOMAIN:
                return
            last = exc
    raise EnvError(f"undefine domain {dom.name()}: {last}")


def remove(conn: Any, name: str) -> bool:
    """Destroy and undefine ``name`` if it exists; True if there was something to remove."""
    dom = lookup(conn, name)
    if dom is None:
        return False
    stop(dom)
    undefine(dom)
    return True


def create_snapshot(dom: Any, xml: str) -> None:
    lv = _require_libvirt()
    with contextlib.suppress(lv.libvirtError):
        # A snapshot of that name from an earlier build of this domain: replace it.
        name = xml.split("<name>", 1)[1].split("</name>", 1)[0]
        dom.snapshotLookupByName(name).delete(0)
    _call(f"snapshot domain {dom.name()}", dom.snapshotCreateXML, xml, 0)


def revert(dom: Any, snapshot: str) -> None:
    """Revert to the named snapshot; the domain runs afterwards (started if the snapshot was offline)."""
    lv = _require_libvirt()
    snap = _call(f"find snapshot {snapshot!r} of {dom.name()}", dom.snapshotLookupByName, snapshot, 0)
    _call(f"revert {dom.name()} to {snapshot!r}", dom.revertToSnapshot, snap, lv.VIR_DOMAIN_SNAPSHOT_REVERT_RUNNING)
    # Some drivers leave a domain reverted to a shut-off snapshot stopped despite REVERT_RUNNING.
    start(dom)


def make_overlay(base: Path, overlay: Path) -> None:
    """A fresh qcow2 overlay backed by ``base`` (the base is never written)."""
    exe = shutil.which("qemu-img")
    if exe is None:
        raise ToolMissing("qemu-img is not installed: apt-get install qemu-utils (or `make system-deps-vm`)")
    if not base.is_file():
        raise EnvError(f"base image {base} does not exist; set base_image in the pool config")
    overlay.unlink(missing_ok=True)
    argv = [exe, "create", "-q", "-f", "qcow2", "-F", "qcow2", "-b", str(base.resolve()), str(overlay)]
    res = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    if res.returncode != 0:
        raise EnvError(f"qemu-img create overlay {overlay}: {res.stderr.strip() or res.returncode}")
    give_to_dir_owner(overlay)


def give_to_dir_owner(path: Path) -> None:
    """Hand ``path`` to the owner of its directory (the hypervisor's user must write overlays
    and bind sockets there). Only root can, and only root needs to."""
    if os.geteuid() != 0:
        return
    st = path.parent.stat()
    if st.st_uid != 0:
        os.chown(path, st.st_uid, st.st_gid)


def timed(fn: Any, *args: Any) -> tuple[Any, float]:
    t0 = time.perf_counter()
    out = fn(*args)
    return out, time.perf_counter() - t0


def interface_addresses(dom: Any) -> list[str]:
    """IPv4 addresses libvirt's DHCP leases give the domain (empty until the guest has one)."""
    lv = _require_libvirt()
    try:
        ifaces = dom.interfaceAddresses(lv.VIR_DOMAIN_INTERFACE_ADDRESSES_SRC_LEASE, 0)
    except lv.libvirtError:
        return []
    return [
        a["addr"]
        for iface in (ifaces or {}).values()
        for a in iface.get("addrs") or []
        if a.get("type") == lv.VIR_IP_ADDR_TYPE_IPV4
    ]
