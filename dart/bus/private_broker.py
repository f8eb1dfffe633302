"""Inside a private network namespace: start the dev broker (Tansu) on this namespace's own
loopback and relay a Unix socket to it, so that its plaintext port is reachable by nobody but the
holder of the socket file (``DevBroker`` with TLS runs this under ``unshare --net``; the TLS front
in the host's namespace connects to the socket).

``python -m dart.bus.private_broker SOCKET PORT -- TANSU ARGS...``: brings ``lo`` up, starts
Tansu, serves SOCKET (mode 0600) until SIGINT/SIGTERM, which it passes on to Tansu."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import signal
import socket
import struct
import subprocess
import sys

_SIOCGIFFLAGS, _SIOCSIFFLAGS, _IFF_UP = 0x8913, 0x8914, 0x1


def loopback_up() -> None:
    """``ip link set lo up`` without iproute2: a new network namespace's loopback starts down."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        flags = struct.unpack("16sh", fcntl.ioctl(s, _SIOCGIFFLAGS, struct.pack("16sh", b"lo", 0)))[1]
        fcntl.ioctl(s, _SIOCSIFFLAGS, struct.pack("16sh", b"lo", flags | _IFF_UP))


async def splice(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                 up_reader: asyncio.StreamReader, up_writer: asyncio.StreamWriter) -> None:
    """Copy bytes both ways between a client and its upstream until either side closes (a TLS
    error is an OSError too); each direction closes the side it writes to when it ends."""

    async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError, asyncio.IncompleteReadError):
            while data := await src.read(1 << 16):
                dst.write(data)
                await dst.drain()
        with contextlib.suppress(OSError, RuntimeError):
            dst.close()

    await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))


async def relay(path: str, port: int, broker: subprocess.Popen[bytes]) -> None:
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            writer.close()
            return

        await splice(reader, writer, up_reader, up_writer)

    old = os.umask(0o177)  # the socket file is born 0600: only its owner connects
    try:
        server = await asyncio.start_unix_server(serve, path=path)
    finally:
        os.umask(old)
    os.chmod(path, 0o600)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    while not stop.is_set() and broker.poll() is None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 0.5)
    server.close()


def main(argv: list[str]) -> int:
    if len(argv) < 4 or argv[2] != "--":
        print(__doc__, file=sys.stderr)
        return 2
    path, port, cmd = argv[0], int(argv[1]), argv[3:]
    loopback_up()
    broker = subprocess.Popen(cmd)
    try:
        asyncio.run(relay(path, port, broker))
    finally:
        if broker.poll() is None:
            broker.send_signal(signal.SIGINT)
            try:
                broker.wait(3)
            except subprocess.TimeoutExpired:
                broker.kill()
                broker.wait()
        with contextlib.suppress(OSError):
            os.unlink(path)
    return broker.returncode or 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
