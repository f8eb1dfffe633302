"""A private, throw-away ``libvirtd`` for tests and benchmarks (never the host's daemon).

It runs in libvirt's *session* mode under a temporary directory, as an unprivileged user
(``nobody`` when started by root), so it needs no system configuration, no ``libvirt-qemu``
user and touches nothing outside its directory. QEMU guests run with TCG when ``/dev/kvm``
is not usable by that user. Connect with :attr:`LocalLibvirtd.uri`.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from dart.env.libvirt import hypervisor
from dart.errors import EnvError, ToolMissing

START_TIMEOUT_S = 15.0


class LocalLibvirtd:
    """``with LocalLibvirtd(tmp_dir) as d: libvirt.open(d.uri)``."""

    def __init__(self, root: Path | None = None, *, user: str = "nobody") -> None:
        """``root`` must be reachable by ``user`` (every parent searchable); by default a fresh
        ``/tmp/dart-libvirtd-*`` is made and removed again by :meth:`stop`."""
        self._own_root = root is None
        self.root = Path(tempfile.mkdtemp(prefix="dart-libvirtd-")) if root is None else Path(root)
        self.user = user
        self.proc: subprocess.Popen[bytes] | None = None

    def make_dir(self, name: str) -> Path:
        """A directory under the daemon's root owned by its user (overlays, sockets, assets)."""
        path = self.root / name
        path.mkdir(parents=True, exist_ok=True)
        if os.geteuid() == 0:
            os.chown(path, *self.uid_gid)
        return path

    @property
    def socket(self) -> Path:
        return self.root / "run" / "libvirt" / "libvirt-sock"

    @property
    def uri(self) -> str:
        return f"qemu:///session?socket={self.socket}"

    @property
    def uid_gid(self) -> tuple[int, int]:
        """The user the daemon and its QEMU processes run as (files they write must be theirs)."""
        if os.geteuid() != 0:
            return os.geteuid(), os.getegid()
        pw = pwd.getpwnam(self.user)
        return pw.pw_uid, pw.pw_gid

    def start(self) -> str:
        """Start the daemon; returns its URI. ToolMissing / EnvError say why it cannot run."""
        exe = shutil.which("libvirtd") or ("/usr/sbin/libvirtd" if os.path.exists("/usr/sbin/libvirtd") else None)
        if exe is None:
            raise ToolMissing("libvirtd is not installed: apt-get install libvirt-daemon libvirt-daemon-driver-qemu (or `make system-deps-vm`)")
        if shutil.which("qemu-system-x86_64") is None:
            raise ToolMissing("qemu-system-x86_64 is not installed: apt-get install qemu-system-x86 (or `make system-deps-vm`)")
        uid, gid = self.uid_gid
        dirs = {name: self.root / name for name in ("run", "config", "cache", "home")}
        for d in (self.root, *dirs.values()):
            d.mkdir(parents=True, exist_ok=True)
            if os.geteuid() == 0:
                os.chown(d, uid, gid)
        self.root.chmod(0o755)
        env = {
            "PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"),
            "HOME": str(dirs["home"]),
            "XDG_RUNTIME_DIR": str(dirs["run"]),
            "XDG_CONFIG_HOME": str(dirs["config"]),
            "XDG_CACHE_HOME": str(dirs["cache"]),
        }
        log_path = self.root / "libvirtd.log"
        with log_path.open("wb") as log_file:
            self.proc = subprocess.Popen(
                [exe], env=env, cwd=self.root, stdin=subprocess.DEVNULL, stdout=log_file,
                stderr=subprocess.STDOUT, start_new_session=True,
                user=uid if os.geteuid() == 0 else None, group=gid if os.geteuid() == 0 else None,
            )
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self.socket.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                tail = log_path.read_text(errors="replace")[-1500:]
                self.stop()
                raise EnvError(f"libvirtd did not start (see {log_path}): {tail}")
            time.sleep(0.05)
        return self.uri

    def stop(self) -> None:
        """Destroy the guests it runs, then stop it (QEMU processes would outlive the daemon)."""
        if self.proc is None:
            return
        if self.proc.poll() is None and self.socket.exists():
            with contextlib.suppress(Exception):
                conn = hypervisor.open_connection(self.uri)
                for dom in conn.listAllDomains(0):
                    with contextlib.suppress(Exception):
                        hypervisor.stop(dom)
                conn.close()
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        for pidfile in (self.root / "run" / "libvirt" / "qemu" / "run").glob("*.pid"):
            with contextlib.suppress(ValueError, OSError):
                pid = int(pidfile.read_text().strip())
                # Only a QEMU this daemon started (its pid file may be stale and the pid reused).
                if b"qemu-system" in Path(f"/proc/{pid}/cmdline").read_bytes():
                    os.kill(pid, signal.SIGKILL)
        self.proc = None
        if self._own_root:
            shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> LocalLibvirtd:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
