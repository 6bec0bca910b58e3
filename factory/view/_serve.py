"""Serving the web app with uvicorn: loopback unless a host is named explicitly."""

from __future__ import annotations

import ipaddress
import socket

from factory.errors import ConfigError
from factory.view._app import LOOPBACK_HOSTS, create_app
from factory.view._data import ViewData

__all__ = ["is_loopback", "serve"]


def is_loopback(host: str) -> bool:
    """Whether ``host`` names this machine only (127.0.0.0/8, ::1 or ``localhost``)."""
    if host in LOOPBACK_HOSTS:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def serve(data: ViewData, *, host: str = "127.0.0.1", port: int = 8765) -> None:
    """Serve the viewer until interrupted (Ctrl-C).

    Args:
        data: What to serve.
        host: The address to listen on; anything but loopback is the caller's explicit choice.
        port: The TCP port (0: any free one).

    Raises:
        ConfigError: The port is taken, or the address cannot be bound.
    """
    import uvicorn

    try:  # a clean error for a taken port, before uvicorn logs and exits
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind((host.strip("[]"), port))
    except OSError as exc:
        raise ConfigError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from exc
    app = create_app(data, loopback_only=is_loopback(host))
    uvicorn.run(app, host=host.strip("[]"), port=port, log_level="warning", access_log=False)
