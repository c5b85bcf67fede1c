"""A gateway serving plain HTTP beyond this machine sends ships' bearer tokens in clear
text: it must say so loudly at start, every start."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import replace
from pathlib import Path

import pytest

from core_gateway.cli import serve
from core_gateway.config import GatewayConfig
from local_stack.kafka import KafkaBroker
from tests.core_gateway.helpers import gateway_config


async def _serve_briefly(cfg: GatewayConfig) -> None:
    started, stop = asyncio.Event(), asyncio.Event()
    task = asyncio.create_task(serve(cfg, install_signals=False, started=started, stop=stop))
    await asyncio.wait_for(started.wait(), 30)
    stop.set()
    await task


def _plaintext_warnings(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [
        r
        for r in caplog.records
        if "event=plaintext_listen" in r.getMessage() and r.levelno == logging.WARNING
    ]


@pytest.mark.parametrize("host", ["0.0.0.0", "::"])
async def test_plain_http_beyond_loopback_is_warned_about_at_start(
    host: str, tmp_path: Path, kafka: KafkaBroker, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="core_gateway.cli")
    await _serve_briefly(replace(gateway_config(tmp_path, kafka), host=host, decode_workers=0))
    warned = _plaintext_warnings(caplog)
    assert len(warned) == 1 and "WITHOUT TLS" in warned[0].getMessage()


@pytest.mark.parametrize("host", ["127.0.0.1", "::1", "localhost"])
async def test_plain_http_on_loopback_is_not_warned_about(
    host: str, tmp_path: Path, kafka: KafkaBroker, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="core_gateway.cli")
    await _serve_briefly(replace(gateway_config(tmp_path, kafka), host=host, decode_workers=0))
    assert _plaintext_warnings(caplog) == []
