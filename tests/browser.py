"""Debian's Chromium under Playwright for the experience browser's tests, and a bare app served over a
real socket. Playwright's own browser download cannot be fetched here: the system executable is used."""

from __future__ import annotations

import os
import shutil
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import uvicorn
from fastapi import FastAPI
from required import missing

from server.cluster.server_process import ServerProcess, free_port

DEBIAN_PACKAGE = "chromium"
# As root (CI) Chromium needs --no-sandbox; the closed network makes its background services fail loudly.
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def chromium_path() -> str:
    """The system Chromium. Missing, a developer's run skips; CI fails, so CI never passes by skipping."""
    path = os.environ.get("AHC_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    if path is not None:
        return path
    message = (f"Chromium not found: install Debian's `{DEBIAN_PACKAGE}` package "
               f"(apt-get install {DEBIAN_PACKAGE}) or set AHC_CHROMIUM")
    missing(message)


@contextmanager
def launched() -> Iterator[object]:
    from playwright.sync_api import sync_playwright

    executable = chromium_path()
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


@contextmanager
def served(app: FastAPI) -> Iterator[str]:
    """`app` on a loopback port in a thread; yields its base URL."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the test app did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def wait_for_turns(server: ServerProcess, session: str, n: int, timeout: float = 10) -> None:
    """Until the browser's read side lists `n` turns of `session` (recorded within 1 s of each reply)."""
    with server.http() as http:
        deadline = time.monotonic() + timeout
        while True:
            found = http.get(f"/v1/xdb/sessions/{session}/turns").json()
            if len(found["turns"]) >= n:
                return
            assert time.monotonic() < deadline, found
            time.sleep(0.2)


def sign_in(page: Any, server: ServerProcess) -> None:
    """Open /ui/ and give the key the page asks for once (it sends it as a header from then on)."""
    page.goto(f"{server.base_url}/ui/")
    page.locator("#key-form").wait_for(state="visible")
    page.fill("#api-key", server.api_key)
    page.click("#key-form button[type=submit]")
