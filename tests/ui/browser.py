"""Headless Chromium driven through its DevTools protocol (one page, a websocket, no browser-automation library):
open a URL and wait for the page to load, evaluate JavaScript, type into inputs, take screenshots. Stops exactly the
browser it started (its own process group)."""

from __future__ import annotations

import base64
import itertools
import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import requests
import websocket


def chromium_path() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


class Browser:
    def __init__(self, profile: Path, width: int = 1280, height: int = 900, timeout_s: float = 60):
        profile.mkdir(parents=True, exist_ok=True)
        self.process = subprocess.Popen(
            [
                chromium_path(),
                "--headless",
                "--no-sandbox",  # tests run as root in containers
                "--disable-gpu",
                "--disable-dev-shm-usage",
                "--no-first-run",
                "--remote-debugging-port=0",
                f"--user-data-dir={profile}",
                f"--window-size={width},{height}",
                "about:blank",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        port_file = profile / "DevToolsActivePort"
        deadline = time.monotonic() + timeout_s
        while not port_file.exists() or not port_file.read_text().strip():
            if time.monotonic() > deadline or self.process.poll() is not None:
                self.close()
                raise RuntimeError(f"chromium did not open its DevTools port in {timeout_s} s")
            time.sleep(0.2)
        port = int(port_file.read_text().split()[0])
        pages = [
            t for t in requests.get(f"http://127.0.0.1:{port}/json/list", timeout=10).json() if t["type"] == "page"
        ]
        self.ws = websocket.create_connection(pages[0]["webSocketDebuggerUrl"], timeout=timeout_s, suppress_origin=True)
        self.ids = itertools.count(1)
        self.events: list[dict] = []
        self.send("Page.enable")
        self.send("Runtime.enable")

    def send(self, method: str, **params) -> dict:
        """One DevTools command; its result (events that arrive meanwhile are kept in `events`)."""
        ident = next(self.ids)
        self.ws.send(json.dumps({"id": ident, "method": method, "params": params}))
        while True:
            message = json.loads(self.ws.recv())
            if message.get("id") == ident:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message.get("result", {})
            self.events.append(message)

    def wait_for(self, event: str, timeout_s: float = 30) -> dict:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for i, message in enumerate(self.events):
                if message.get("method") == event:
                    return self.events.pop(i)
            self.ws.settimeout(max(deadline - time.monotonic(), 0.1))
            try:
                self.events.append(json.loads(self.ws.recv()))
            except websocket.WebSocketTimeoutException:
                break
        raise TimeoutError(f"no {event} in {timeout_s} s")

    def open(self, url: str, timeout_s: float = 30) -> None:
        """Navigate and wait for the load event."""
        self.events.clear()
        self.send("Page.navigate", url=url)
        self.wait_for("Page.loadEventFired", timeout_s)

    def evaluate(self, expression: str):
        """The value of a JavaScript expression (promises awaited)."""
        result = self.send("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression[:80]}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def wait_until(self, expression: str, timeout_s: float = 30):
        """Poll a JavaScript expression until it is truthy; its value."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            value = self.evaluate(expression)
            if value:
                return value
            time.sleep(0.25)
        raise TimeoutError(f"{expression!r} still false after {timeout_s} s on {self.evaluate('location.href')}")

    def type_into(self, selector: str, text: str) -> None:
        """Focus an input and type `text` as key input (frameworks see real input events)."""
        self.evaluate(f"document.querySelector({json.dumps(selector)}).focus()")
        self.send("Input.insertText", text=text)

    def screenshot(self, path: Path, full_page: bool = True) -> Path:
        """The whole page (or what the window shows) as PNG."""
        data = self.send("Page.captureScreenshot", format="png", captureBeyondViewport=full_page)["data"]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(data))
        return path

    def close(self) -> None:
        if getattr(self, "ws", None) is not None:
            self.ws.close()
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=10)
