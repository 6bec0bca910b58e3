"""The browser verifier's runner: serves the app and drives headless Chromium, inside the branch's sandbox.

This file runs as a program in the sandbox (``python _browser_runner.py CONFIG_JSON``), next to the
untrusted app, with the standard library and Playwright's Python client only (it never imports
``factory``). It connects to the verifier's Unix socket in the sandbox's shared folder and answers one
JSON request per line:

- ``{"op": "open"}``: load the entry page; reply with the accessibility tree, a DOM summary, console
  errors, blocked requests, what the page can see of automation, and the first screenshot;
- ``{"op": "execute", "actions": [...]}``: run the actions; reply with one record per step (screenshot,
  accessibility-tree diff, URL, console errors, blocked requests, ``ok`` or the error), a step that
  cannot run recorded and the next one tried;
- ``{"op": "close"}``: end.

Screenshots travel base64-encoded in the replies. Every browser call has a deadline, so a page that
never finishes loading or spins the CPU costs bounded time. Requests to anything but the served app's
origin are aborted and recorded (the sandbox has no network besides loopback anyway). The browser is
launched so that the page cannot tell it is automated: ``navigator.webdriver`` false, a normal user
agent (no ``HeadlessChrome``), the PDF plugins present.
"""

from __future__ import annotations

import asyncio
import base64
import difflib
import functools
import http.server
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import Any

#: Actions a plan may hold.
ACTIONS = ("click", "type", "select", "key", "scroll", "wait", "navigate", "drag")

_DOM_SUMMARY_JS = """() => {
  const visible = (el) => { const r = el.getBoundingClientRect(); const s = getComputedStyle(el);
    return r.width > 0 && r.height > 0 && s.visibility !== 'hidden' && s.display !== 'none'; };
  const counts = {};
  for (const el of document.querySelectorAll('*')) {
    const tag = el.tagName.toLowerCase(); counts[tag] = (counts[tag] || 0) + 1; }
  const controls = [];
  const selector = 'button, a[href], input, select, textarea, [role], [onclick], [tabindex]';
  for (const el of document.querySelectorAll(selector)) {
    if (controls.length >= 60) break;
    controls.push({tag: el.tagName.toLowerCase(), id: el.id || null, role: el.getAttribute('role'),
      type: el.getAttribute('type'),
      text: (el.innerText || el.value || el.getAttribute('aria-label') || '').trim().slice(0, 80),
      disabled: !!el.disabled, checked: el.checked === undefined ? null : !!el.checked, visible: visible(el)});
  }
  const canvases = [];
  for (const c of document.querySelectorAll('canvas')) {
    let painted = null;
    try { const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data; painted = 0;
      for (let i = 3; i < d.length; i += 4) if (d[i] > 0) painted++; } catch (e) { painted = null; }
    canvases.push({id: c.id || null, width: c.width, height: c.height, painted_pixels: painted});
  }
  const images = [...document.querySelectorAll('img, svg image, [style*="background-image"]')].length;
  return {title: document.title, element_counts: counts, controls, canvases, images,
          text: (document.body ? document.body.innerText : '').slice(0, 3000)};
}"""

_CANVAS_JS = """() => [...document.querySelectorAll('canvas')].map((c) => {
  try { const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data; let painted = 0;
    for (let i = 3; i < d.length; i += 4) if (d[i] > 0) painted++; return painted; } catch (e) { return null; } })"""

_AUTOMATION_JS = """() => ({webdriver: navigator.webdriver, user_agent: navigator.userAgent,
  plugins: navigator.plugins.length, languages: navigator.languages,
  has_chrome: typeof window.chrome !== 'undefined'})"""


def _static_server(root: str) -> tuple[http.server.ThreadingHTTPServer, int]:
    """A quiet static server for ``root`` on a free loopback port."""

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            return None

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=root))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, server.server_address[1]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _wait_port(port: int, deadline: float) -> bool:
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return True
        except OSError:
            time.sleep(0.1)
    return False


def _diff(before: str, after: str) -> str:
    lines = [line for line in difflib.unified_diff(before.splitlines(), after.splitlines(), lineterm="", n=0)
             if not line.startswith(("---", "+++", "@@"))]
    return "\n".join(lines)[:4000] if lines else "(no change)"


class Runner:
    """One browser, one page, one served app; answers the verifier's requests."""

    def __init__(self, config: dict[str, Any]):
        self.config = config
        self.step_timeout_ms = int(config["step_timeout_s"] * 1000)
        self.console: list[str] = []
        self.blocked: list[str] = []
        self.origin = ""
        self.serve_process: subprocess.Popen[bytes] | None = None
        self.serve_problem: str | None = None
        self.browser: Any = None
        self.page: Any = None
        self.agent = ""
        self.aria = ""
        self.unresponsive = False

    # -- serving

    def serve(self) -> None:
        command = self.config.get("serve")
        if not command:
            _, port = _static_server(self.config["root"])
        else:
            port = _free_port()
            env = {**os.environ, "PORT": str(port), "HOST": "127.0.0.1"}
            self.serve_process = subprocess.Popen(  # the task's own command: untrusted, as the page is
                ["sh", "-c", command], cwd=self.config["root"], env=env, stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
            if not _wait_port(port, time.monotonic() + self.config["serve_timeout_s"]):
                self.serve_problem = f"the serve command did not listen on 127.0.0.1:{port} in time"
        self.origin = f"http://127.0.0.1:{port}"

    # -- browser

    async def start(self, playwright: Any) -> None:
        self.browser = await playwright.chromium.launch(
            executable_path=self.config["chromium"],
            # --no-sandbox: Chromium's own sandbox needs user namespaces, which ours forbids; this sandbox holds it.
            args=["--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                  "--disable-blink-features=AutomationControlled", "--js-flags=--max-old-space-size=256"],
            ignore_default_args=["--enable-automation"])
        probe = await self.browser.new_page()
        self.agent = (await probe.evaluate("navigator.userAgent")).replace("HeadlessChrome", "Chrome")
        await probe.close()

    async def _fresh_page(self) -> None:
        """A new browser context (no cookies, storage or history of an earlier open) and its page."""
        if self.page is not None:
            await self._bounded(self.page.context.close())
        self.console.clear()
        self.blocked.clear()
        self.unresponsive = False
        context = await self.browser.new_context(user_agent=self.agent, viewport={"width": 800, "height": 600},
                                                 locale="en-US")
        context.set_default_timeout(self.step_timeout_ms)
        context.set_default_navigation_timeout(self.config["load_timeout_s"] * 1000)
        await context.route("**/*", self._route)
        self.page = await context.new_page()
        self.page.on("console", lambda msg: self.console.append(msg.text[:300]) if msg.type == "error" else None)
        self.page.on("pageerror", lambda exc: self.console.append(f"uncaught: {str(exc)[:300]}"))

    async def _route(self, route: Any) -> None:
        url = route.request.url
        if url.startswith((self.origin + "/", "data:", "blob:", "about:")) or url == self.origin:
            await route.continue_()
        else:
            self.blocked.append(url[:300])
            await route.abort("blockedbyclient")

    @property
    def _deadline_s(self) -> float:
        # Once the page has failed to answer, later looks get a second each: a page spinning its main thread
        # would otherwise spend the whole time budget on snapshots nobody can take.
        return 1.0 if self.unresponsive else self.step_timeout_ms / 1000

    async def _bounded(self, awaitable: Any, default: Any = None) -> Any:
        """The awaitable's result, or ``default`` past the deadline (a spinning page answers nothing)."""
        try:
            return await asyncio.wait_for(awaitable, self._deadline_s)
        except asyncio.TimeoutError:
            self.unresponsive = True
            return default
        except Exception:  # noqa: BLE001 - a page that cannot answer is evidence, recorded by the caller
            return default

    async def _snapshot(self) -> str:
        return await self._bounded(self.page.locator("body").aria_snapshot(timeout=self.step_timeout_ms),
                                   "(accessibility tree unavailable: the page did not answer)")

    async def _screenshot(self) -> str | None:
        data = await self._bounded(self.page.screenshot(type="png", timeout=self.step_timeout_ms,
                                                        animations="disabled"))
        return base64.b64encode(data).decode() if data else None

    async def open(self) -> dict[str, Any]:
        await self._fresh_page()
        load_error = self.serve_problem
        try:
            await self.page.goto(f"{self.origin}/{self.config['entry']}", wait_until="load")
        except Exception as exc:  # noqa: BLE001 - never finishing loading is what some pages do; recorded
            load_error = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
        self.aria = await self._snapshot()
        return {"url": self.page.url, "load_error": load_error, "aria": self.aria[:8000],
                "dom": await self._bounded(self.page.evaluate(_DOM_SUMMARY_JS), {"unavailable": True}),
                "automation": await self._bounded(self.page.evaluate(_AUTOMATION_JS), None),
                "console_errors": list(self.console), "blocked_requests": list(self.blocked),
                "screenshot": await self._screenshot()}

    def _locator(self, target: Any) -> Any:
        if not isinstance(target, dict):
            raise ValueError("target must be an object with 'selector', or 'name' (and optional 'role')")
        if isinstance(target.get("selector"), str):
            return self.page.locator(target["selector"]).first
        name = target.get("name")
        if not isinstance(name, str):
            raise ValueError("target needs a 'selector' or a 'name'")
        if isinstance(target.get("role"), str):
            return self.page.get_by_role(target["role"], name=name, exact=True).first
        return self.page.get_by_label(name, exact=True).or_(self.page.get_by_text(name, exact=True)).first

    async def _act(self, action: dict[str, Any]) -> None:
        kind = action.get("action")
        if kind == "click":
            position = action.get("position")
            await self._locator(action.get("target")).click(position=position if isinstance(position, dict) else None)
        elif kind == "type":
            locator = self._locator(action.get("target"))
            await locator.fill("")
            await locator.type(str(action.get("text", "")), delay=5)
        elif kind == "select":
            await self._locator(action.get("target")).select_option(str(action.get("value", "")))
        elif kind == "key":
            await self.page.keyboard.press(str(action.get("key", "")))
        elif kind == "scroll":
            await self.page.mouse.wheel(0, float(action.get("dy", 400)))
        elif kind == "wait":
            await asyncio.sleep(min(float(action.get("ms", 300)), 3000) / 1000)
        elif kind == "navigate":
            url = str(action.get("url", ""))
            await self.page.goto(url if "://" in url else f"{self.origin}/{url.lstrip('/')}", wait_until="load")
        elif kind == "drag":
            box = await self._locator(action.get("target")).bounding_box()
            if box is None:
                raise ValueError("drag target is not visible")
            points = action.get("points") or [[0.2, 0.5], [0.8, 0.5]]
            (x0, y0), *rest = [(box["x"] + box["width"] * px, box["y"] + box["height"] * py) for px, py in points]
            await self.page.mouse.move(x0, y0)
            await self.page.mouse.down()
            for x, y in rest:
                await self.page.mouse.move(x, y, steps=8)
            await self.page.mouse.up()
        else:
            raise ValueError(f"unknown action {kind!r} (one of {', '.join(ACTIONS)})")

    async def perform(self, actions: list[Any]) -> dict[str, Any]:
        steps = []
        deadline = time.monotonic() + self.config["execute_timeout_s"]
        for index, action in enumerate(actions[: self.config["max_steps"]]):
            if time.monotonic() > deadline:
                steps.append({"index": index, "action": action, "ok": False, "error": "time limit reached"})
                break
            console_from, blocked_from = len(self.console), len(self.blocked)
            error = None
            try:
                if not isinstance(action, dict):
                    raise ValueError("an action must be an object")
                await asyncio.wait_for(self._act(action), self._deadline_s + 1)
            except Exception as exc:  # noqa: BLE001 - a step that cannot run is recorded, never fatal
                error = f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:200]}"
            await asyncio.sleep(0.15)  # let the page's handlers and transitions settle before looking
            aria = await self._snapshot()
            canvases = await self._bounded(self.page.evaluate(_CANVAS_JS), None)
            steps.append({"index": index, "action": action, "ok": error is None, "error": error,
                          "canvas_painted_pixels": canvases or None,
                          "url": self.page.url, "aria_diff": _diff(self.aria, aria),
                          "console_errors": self.console[console_from:],
                          "blocked_requests": self.blocked[blocked_from:],
                          "screenshot": await self._screenshot()})
            self.aria = aria
        return {"steps": steps, "aria": self.aria[:8000], "skipped": max(0, len(actions) - self.config["max_steps"])}

    def close(self) -> None:
        if self.serve_process is not None and self.serve_process.poll() is None:
            os.killpg(self.serve_process.pid, signal.SIGKILL)


async def _main(config: dict[str, Any]) -> None:
    from playwright.async_api import async_playwright

    runner = Runner(config)
    reader, writer = await asyncio.open_unix_connection(config["socket"], limit=64 * 1024 * 1024)
    try:
        runner.serve()
        async with async_playwright() as playwright:
            started = time.monotonic()
            await runner.start(playwright)
            writer.write((json.dumps({"op": "ready", "browser_start_s": round(time.monotonic() - started, 3),
                                      "version": runner.browser.version}) + "\n").encode())
            await writer.drain()
            while line := await reader.readline():
                request = json.loads(line)
                if request.get("op") == "open":
                    reply = await runner.open()
                elif request.get("op") == "execute":
                    reply = await runner.perform(list(request.get("actions") or []))
                else:
                    break
                writer.write((json.dumps(reply) + "\n").encode())
                await writer.drain()
            await runner.browser.close()
    finally:
        runner.close()
        writer.close()


if __name__ == "__main__":
    asyncio.run(_main(json.loads(sys.argv[1])))
