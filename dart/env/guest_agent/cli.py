"""``dart guest-agent``: the in-VM server's command. A VM runs it, so ``dart guest-agent`` loads
this module and the agent's own (``dart.cli`` registers nothing else for it), not every service."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal

from dart.env.guest_agent.protocol import DEFAULT_HOST, DEFAULT_PORT, TOKEN_FILE
from dart.env.guest_agent.server import AgentConfig, nic_address, read_token, serve


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "guest-agent",
        help="serve an X display over HTTP (OSWorld-compatible endpoints, typed actions)",
        description="Run inside a VM (or next to an Xvfb) so a libvirt env backend can take "
        "screenshots, send typed actions and run setup commands. Binds loopback by default.",
    )
    p.add_argument("--display", default=None, help="X display to serve (default: $DISPLAY or :0)")
    p.add_argument("--host", default=DEFAULT_HOST, help=f"address to bind (default {DEFAULT_HOST}); inside a VM "
                   "'nic': the address of the interface on the default route, the one the env worker reaches")
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"TCP port (default {DEFAULT_PORT})")
    p.add_argument("--allow-shell", action="store_true",
                   help="let /execute run shell strings (shell: true); off: argv lists only")
    p.add_argument("--run-as", default=None, metavar="USER",
                   help="run every program the agent starts (task commands, apps, xdotool) as USER, the desktop "
                   "user, while the agent and its token file stay another user's (needs root or CAP_SETUID)")
    p.add_argument("--token-file", default=None,
                   help="file holding the token every request must carry (default: $DART_AGENT_TOKEN, else "
                   f"{TOKEN_FILE} when it exists, which the VM pool fills per VM)")
    p.add_argument("--root-without-token", action="store_true",
                   help="let an agent without a token run as root (every root process may then run commands "
                   "through it); without a token it otherwise refuses to start as root")
    p.set_defaults(func=_guest_agent)


def _guest_agent(args: argparse.Namespace) -> int:
    import os

    host = nic_address() if args.host == "nic" else args.host
    cfg = AgentConfig(display=args.display or os.environ.get("DISPLAY") or ":0", host=host, port=args.port,
                      allow_shell=args.allow_shell, run_as=args.run_as,
                      token=read_token(args.token_file, os.environ), root_without_token=args.root_without_token)

    async def main() -> None:
        # SIGTERM (a VM shutting down, a test tearing down) stops the server cleanly, so the
        # programs it launched are stopped with it.
        task = asyncio.current_task()
        assert task is not None
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, task.cancel)
        await serve(cfg)

    with contextlib.suppress(KeyboardInterrupt, asyncio.CancelledError):
        asyncio.run(main())
    return 0


