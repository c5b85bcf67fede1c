"""toxiproxy plays the ship-to-shore link: its toxics and outages must really act on
the traffic, or link-failure tests prove nothing."""

from __future__ import annotations

import socket
import socketserver
import threading
import time
from collections.abc import Iterator

import pytest

from local_stack.process import free_port
from local_stack.toxiproxy import Toxiproxy
from tests.helpers import unique


class _Echo(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        while data := self.request.recv(4096):
            self.request.sendall(data)


@pytest.fixture
def echo_server() -> Iterator[int]:
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _Echo)
    server.daemon_threads = True
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


def _round_trip(port: int) -> float:
    t0 = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(b"ping")
        assert s.recv(16) == b"ping"
    return time.monotonic() - t0


def test_latency_toxic_delays_round_trip_and_disable_cuts_link(
    toxiproxy: Toxiproxy, echo_server: int
) -> None:
    name = unique("link")
    listen = free_port()
    toxiproxy.create_proxy(name, f"127.0.0.1:{listen}", f"127.0.0.1:{echo_server}")
    base = _round_trip(listen)
    assert base < 0.2

    toxiproxy.add_toxic(name, "latency", latency=300)
    delayed = _round_trip(listen)
    assert delayed >= 0.3, f"latency toxic had no effect ({delayed:.3f}s)"

    toxiproxy.set_enabled(name, False)
    with pytest.raises(OSError):
        _round_trip(listen)

    toxiproxy.set_enabled(name, True)
    toxiproxy.reset()
    assert _round_trip(listen) < 0.2
