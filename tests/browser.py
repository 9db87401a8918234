"""A real headless Chromium for tests, driven over the DevTools protocol (a WebSocket on 127.0.0.1):
open a page, run JavaScript in it, collect its console errors and uncaught exceptions, take a
screenshot. Uses the system's `chromium` (Debian's package; `.ci/run` installs it where it can)."""

from __future__ import annotations

import base64
import contextlib
import json
import re
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx

CHROMIUM = next((shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome") if shutil.which(n)), None)
NO_CHROMIUM = "no chromium on this machine (apt-get install chromium; .ci/run installs it where it can)"


class Browser:
    """One headless Chromium with one page. `errors` collects console errors and exceptions."""

    def __init__(self, profile: Path, width: int = 1400, height: int = 1000):
        from websockets.sync.client import connect

        self.log = profile / "chromium.log"  # a file, not a pipe: nothing can block on a full buffer
        profile.mkdir(parents=True, exist_ok=True)
        with open(self.log, "w") as log:
            self.proc = subprocess.Popen(
                [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-extensions",
                 "--remote-debugging-address=127.0.0.1", "--remote-debugging-port=0", f"--user-data-dir={profile}",
                 "about:blank"], stdout=subprocess.DEVNULL, stderr=log)
        port = self._port()
        page = next(t for t in httpx.get(f"http://127.0.0.1:{port}/json/list", timeout=10).json() if t["type"] == "page")
        self.stack = contextlib.ExitStack()
        self.ws = self.stack.enter_context(connect(page["webSocketDebuggerUrl"], max_size=None, open_timeout=20))
        self.next_id = 0
        self.errors: list[str] = []
        self.loaded = False
        for domain in ("Page", "Runtime", "Log"):
            self.call(f"{domain}.enable")
        self.call("Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=1, mobile=False)

    def _port(self) -> int:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and self.proc.poll() is None:
            if m := re.search(r"DevTools listening on ws://127\.0\.0\.1:(\d+)/", self.log.read_text(errors="replace")):
                return int(m.group(1))
            time.sleep(0.1)
        raise RuntimeError(f"chromium did not start its DevTools endpoint: {self.log.read_text(errors='replace')[-500:]}")

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        """Send one DevTools command and wait for its result, noting the events on the way."""
        self.next_id += 1
        self.ws.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv(timeout=60))
            if msg.get("id") == self.next_id:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})
            self._event(msg)

    def _event(self, msg: dict[str, Any]) -> None:
        method, params = msg.get("method"), msg.get("params", {})
        if method == "Runtime.exceptionThrown":
            self.errors.append(json.dumps(params["exceptionDetails"])[:500])
        elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
            self.errors.append(json.dumps(params.get("args"))[:500])
        elif method == "Log.entryAdded" and params["entry"].get("level") == "error":
            self.errors.append(params["entry"].get("text", "")[:500])
        elif method == "Page.loadEventFired":
            self.loaded = True

    def open(self, path: Path) -> None:
        """Load a file and wait for its load event."""
        self.loaded = False
        self.call("Page.navigate", url=path.resolve().as_uri())
        deadline = time.monotonic() + 30
        while not self.loaded and time.monotonic() < deadline:
            self._event(json.loads(self.ws.recv(timeout=30)))
        assert self.loaded, f"{path} did not finish loading"

    def js(self, expression: str) -> Any:
        """Evaluate `expression` in the page; its value (JSON-able)."""
        out = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in out:
            raise RuntimeError(json.dumps(out["exceptionDetails"])[:500])
        return out["result"].get("value")

    def screenshot(self, path: Path) -> Path:
        """The whole page as a PNG at `path`."""
        size = self.call("Page.getLayoutMetrics")["cssContentSize"]
        shot = self.call("Page.captureScreenshot", format="png", captureBeyondViewport=True,
                         clip={"x": 0, "y": 0, "width": size["width"], "height": min(size["height"], 16000), "scale": 1})
        path.write_bytes(base64.b64decode(shot["data"]))
        return path

    def close(self) -> None:
        try:
            self.stack.close()
        finally:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
