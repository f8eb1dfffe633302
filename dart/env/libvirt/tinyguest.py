"""A tiny real guest for tests and benchmarks: a Debian kernel + a busybox initramfs under QEMU.

No network, no guest agent: the guest runs a shell on its serial port, which libvirt exposes
as a unix socket in the VM's directory (``${vm_dir}/console.sock``). :class:`SerialProber`
makes the pool's readiness check "the shell answers", and :func:`console_run` runs a command
in the guest, which is how a test changes and reads guest state around a snapshot revert.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import io
import os
import re
import shutil
import stat
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dart.env.libvirt.config import VmPoolConfig
from dart.env.libvirt.vm import VmInfo
from dart.errors import EnvError, ToolMissing

CONSOLE = "console.sock"
INIT_SCRIPT = b"""#!/bin/busybox sh
/bin/busybox --install -s /bin
mount -t proc proc /proc
mount -t devtmpfs dev /dev
for m in /lib/modules/*.ko; do [ -e "$m" ] && insmod "$m"; done
echo 0 > /tmp/state
while true; do setsid sh -c 'exec sh </dev/ttyS0 >/dev/ttyS0 2>&1'; done
"""

TEMPLATE = """<domain type='qemu'>
  <name>${name}</name>
  <uuid>${uuid}</uuid>
  <metadata>${metadata}</metadata>
  <memory unit='MiB'>${memory_mib}</memory>
  <vcpu>${vcpus}</vcpu>
  <os>
    <type arch='x86_64' machine='pc'>hvm</type>
    <kernel>${kernel}</kernel>
    <initrd>${initrd}</initrd>
    <cmdline>console=ttyS0 rdinit=/init quiet panic=-1</cmdline>
  </os>
  <on_poweroff>destroy</on_poweroff>
  <on_reboot>destroy</on_reboot>
  <on_crash>destroy</on_crash>
  <devices>
    <disk type='file' device='disk'>
      <driver name='qemu' type='qcow2'/>
      <source file='${disk}'/>
      <target dev='vda' bus='virtio'/>
    </disk>
    <serial type='unix'>
      <source mode='bind' path='${vm_dir}/console.sock'/>
      <target port='0'/>
    </serial>
    <memballoon model='none'/>
  </devices>
</domain>
"""
"""Domain template of the tiny guest. The qcow2 disk is unused by the guest; it is there
because QEMU stores internal (memory + disk) snapshots in a qcow2 image."""


def find_kernel() -> Path | None:
    """A bootable x86-64 kernel: ``$DART_VM_KERNEL``, else the newest readable ``/boot/vmlinuz-*``."""
    env = os.environ.get("DART_VM_KERNEL")
    if env:
        return Path(env) if os.access(env, os.R_OK) else None
    kernels = sorted(Path("/boot").glob("vmlinuz-*"), key=lambda p: p.stat().st_mtime, reverse=True)
    return next((k for k in kernels if os.access(k, os.R_OK)), None)


def busybox_path() -> Path:
    path = shutil.which("busybox")
    if path is None:
        raise ToolMissing("busybox is not installed: apt-get install busybox-static (or `make system-deps-vm`)")
    return Path(path)


def cpio_newc(entries: list[tuple[str, int, bytes]]) -> bytes:
    """An uncompressed cpio archive (the kernel's "newc" format) of (name, mode, data) entries."""
    out = io.BytesIO()

    def pad() -> None:
        out.write(b"\0" * (-out.tell() % 4))

    for ino, (name, mode, data) in enumerate([*entries, ("TRAILER!!!", 0, b"")], start=1):
        raw = name.encode() + b"\0"
        fields = (ino, mode, 0, 0, 1, 0, len(data), 0, 0, 0, 0, len(raw), 0)
        out.write(b"070701" + b"".join(b"%08X" % v for v in fields) + raw)
        pad()
        out.write(data)
        pad()
    return out.getvalue()


VIRTIO_BLK_MODULES = ("virtio_ring", "virtio", "virtio_pci_legacy_dev", "virtio_pci_modern_dev", "virtio_pci",
                      "virtio_blk")
"""Loaded in this order so the guest sees its disk as /dev/vda (Debian kernels build them as modules)."""


def virtio_modules(kernel: Path) -> list[Path]:
    """The kernel's virtio-blk modules, in load order; empty if they are not all there
    (the guest then runs without a disk device, and only memory state can be checked)."""
    version = kernel.name.removeprefix("vmlinuz-")
    found = {p.stem: p for p in Path("/lib/modules", version, "kernel", "drivers").rglob("*.ko")
             if p.stem in VIRTIO_BLK_MODULES}
    return [found[m] for m in VIRTIO_BLK_MODULES] if len(found) == len(VIRTIO_BLK_MODULES) else []


def build_initramfs(busybox: Path, modules: list[Path] | tuple[Path, ...] = ()) -> bytes:
    """A gzip'd initramfs: a static busybox, kernel modules to load in order, and an /init that
    serves a shell on ttyS0."""
    d = stat.S_IFDIR | 0o755
    entries = [("bin", d, b""), ("proc", d, b""), ("dev", d, b""), ("tmp", stat.S_IFDIR | 0o1777, b""),
               ("lib", d, b""), ("lib/modules", d, b""),
               ("bin/busybox", stat.S_IFREG | 0o755, busybox.read_bytes()),
               ("init", stat.S_IFREG | 0o755, INIT_SCRIPT)]
    entries += [(f"lib/modules/{i:02d}-{m.name}", stat.S_IFREG | 0o644, m.read_bytes()) for i, m in enumerate(modules)]
    return gzip.compress(cpio_newc(entries), compresslevel=1)


_RESULT = re.compile(rb"_DART_BEGIN\r?\n(.*?)_DART_END(\d+)", re.S)


async def console_run(vm_dir: Path, command: str, *, timeout_s: float = 5.0) -> tuple[int, str]:
    """Run ``command`` in the guest's serial shell; (exit status, output).

    The markers are written split by ``""`` so the terminal's echo of the command line never
    matches them; only the shell's own output does.
    """
    async def talk() -> tuple[int, str]:
        reader, writer = await asyncio.open_unix_connection(str(vm_dir / CONSOLE))
        try:
            writer.write(f'echo _DART""_BEGIN; {command}; echo _DART""_END$?\n'.encode())
            await writer.drain()
            buf = b""
            while (m := _RESULT.search(buf)) is None:
                chunk = await reader.read(4096)
                if not chunk:
                    raise EnvError(f"guest console {vm_dir / CONSOLE} closed")
                buf += chunk
            return int(m.group(2)), m.group(1).decode(errors="replace").replace("\r", "")
        finally:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()

    try:
        return await asyncio.wait_for(talk(), timeout_s)
    except (TimeoutError, OSError) as exc:
        raise EnvError(f"guest console {vm_dir / CONSOLE}: {exc!r}") from exc


class SerialProber:
    """Ready when the guest's serial shell runs a command."""

    async def ready(self, vm: VmInfo, *, timeout_s: float) -> bool:
        try:
            rc, out = await console_run(vm.vm_dir, "echo ok", timeout_s=timeout_s)
        except EnvError:
            return False
        return rc == 0 and "ok" in out


@dataclass(frozen=True, kw_only=True, slots=True)
class TinyAssets:
    kernel: Path
    initrd: Path
    base: Path
    """An empty 16 MiB qcow2 base image (each VM gets an overlay of it)."""
    template: Path

    def pool_config(self, **fields: Any) -> VmPoolConfig:
        """A pool config for tiny guests; ``fields`` set the rest (uri, overlay_dir, name_prefix...)."""
        defaults: dict[str, Any] = {"memory_mib": 96, "vcpus": 1, "ready_timeout_s": 60.0, "probe_timeout_s": 2.0}
        return VmPoolConfig(template=self.template, base_image=self.base,
                            template_vars={"kernel": str(self.kernel), "initrd": str(self.initrd)},
                            **{**defaults, **fields})


def prepare_assets(directory: Path, *, uid: int, gid: int) -> TinyAssets:
    """Write the initramfs, an empty base qcow2 and the domain template under ``directory``,
    owned by ``uid``/``gid`` (the user QEMU runs as)."""
    kernel = find_kernel()
    if kernel is None:
        raise ToolMissing("no readable kernel in /boot: apt-get install linux-image-cloud-amd64 "
                          "(or set DART_VM_KERNEL)")
    qemu_img = shutil.which("qemu-img")
    if qemu_img is None:
        raise ToolMissing("qemu-img is not installed: apt-get install qemu-utils (or `make system-deps-vm`)")
    directory.mkdir(parents=True, exist_ok=True)
    assets = TinyAssets(kernel=kernel, initrd=directory / "initrd.gz", base=directory / "base.qcow2",
                        template=directory / "tiny.xml.tmpl")
    assets.initrd.write_bytes(build_initramfs(busybox_path(), virtio_modules(kernel)))
    assets.template.write_text(TEMPLATE)
    subprocess.run([qemu_img, "create", "-q", "-f", "qcow2", str(assets.base), "16M"], check=True, timeout=60)
    for p in (directory, assets.initrd, assets.base, assets.template):
        if os.geteuid() == 0:
            os.chown(p, uid, gid)
    return assets
