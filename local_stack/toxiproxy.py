"""toxiproxy: plays the ship-to-shore links (latency, bandwidth, resets, outages).

One server per stack; one proxy per ship->site link. :class:`Toxiproxy` is a small
client of its HTTP API, used by tests, benchmarks and the demo.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from local_stack.errors import StackError
from local_stack.process import Proc, free_port
from local_stack.tools import toxiproxy_bin

__all__ = ["Toxiproxy", "start_toxiproxy"]

HOST = "127.0.0.1"


class Toxiproxy:
    """Client for a toxiproxy server's API at ``http://host:port``."""

    def __init__(self, api: str) -> None:
        self.api = api.rstrip("/")

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(
            self.api + path, data=data, method=method, headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(req, timeout=5) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as exc:
            raise StackError(
                f"toxiproxy {method} {path}: {exc.code} {exc.read().decode(errors='replace')}"
            ) from exc
        except OSError as exc:
            raise StackError(f"toxiproxy at {self.api} unreachable: {exc}") from exc
        return json.loads(raw) if raw else None

    def ready(self) -> bool:
        try:
            self._call("GET", "/version")
        except StackError:
            return False
        return True

    def create_proxy(self, name: str, listen: str, upstream: str) -> dict[str, Any]:
        existing = self.proxies()
        if name in existing:
            self._call("DELETE", f"/proxies/{name}")
        result: dict[str, Any] = self._call(
            "POST",
            "/proxies",
            {"name": name, "listen": listen, "upstream": upstream, "enabled": True},
        )
        return result

    def proxies(self) -> dict[str, Any]:
        result: dict[str, Any] = self._call("GET", "/proxies")
        return result

    def set_enabled(self, name: str, enabled: bool) -> None:
        """Enabled: the link is up. Disabled: connections are refused and open ones cut."""
        self._call("POST", f"/proxies/{name}", {"enabled": enabled})

    def add_toxic(
        self,
        proxy: str,
        kind: str,
        *,
        name: str | None = None,
        stream: str = "downstream",
        toxicity: float = 1.0,
        **attributes: int,
    ) -> str:
        """Add a toxic (``latency``, ``bandwidth``, ``reset_peer``, ``timeout``,
        ``slow_close``, ``limit_data``, ...); returns its name."""
        name = name or f"{kind}_{stream}"
        self._call(
            "POST",
            f"/proxies/{proxy}/toxics",
            {
                "name": name,
                "type": kind,
                "stream": stream,
                "toxicity": toxicity,
                "attributes": attributes,
            },
        )
        return name

    def remove_toxic(self, proxy: str, name: str) -> None:
        self._call("DELETE", f"/proxies/{proxy}/toxics/{name}")

    def link_bytes(self) -> dict[str, int]:
        """Bytes each proxy has carried so far, both directions together (toxiproxy's
        ``toxiproxy_proxy_sent_bytes_total``; the server must run with metrics, see
        :func:`start_toxiproxy`). A proxy that carried nothing yet is absent."""
        req = urllib.request.Request(self.api + "/metrics")
        try:
            with urllib.request.urlopen(req, timeout=5) as resp:
                text = resp.read().decode()
        except OSError as exc:
            raise StackError(f"toxiproxy metrics at {self.api} unreadable: {exc}") from exc
        out: dict[str, int] = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == "toxiproxy_proxy_sent_bytes_total" and "proxy" in sample.labels:
                    name = sample.labels["proxy"]
                    out[name] = out.get(name, 0) + int(sample.value)
        return out

    def reset(self) -> None:
        """Enable every proxy and remove every toxic."""
        self._call("POST", "/reset")


@dataclass
class ToxiproxyServer:
    port: int
    proc: Proc

    @property
    def api(self) -> str:
        return f"http://{HOST}:{self.port}"

    def client(self) -> Toxiproxy:
        return Toxiproxy(self.api)


def start_toxiproxy(
    logs: Path, *, port: int | None = None, wait: bool = True, metrics: bool = False
) -> ToxiproxyServer:
    """Start a toxiproxy server; ``metrics``: count each proxy's bytes
    (:meth:`Toxiproxy.link_bytes`)."""
    port = port or free_port(HOST)
    argv = [toxiproxy_bin(), "-host", HOST, "-port", str(port)]
    if metrics:
        argv.append("-proxy-metrics")
    proc = Proc.start("toxiproxy", argv, logs / "toxiproxy.log")
    server = ToxiproxyServer(port, proc)
    if wait:
        proc.wait_ready(server.client().ready, timeout=20)
    return server
