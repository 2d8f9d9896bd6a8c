"""The project's own test suite (the testbed's pytest plugin does the rest).

Its workers run root-tier tests beside each other (`./tb test` uses pytest-xdist), so the
`testbed run` processes they start share the host (``--shared-host``): several hold the
host lock at once, and a noisy sample is kept, marked, rather than measured again. A test
that needs the host alone drops the variable for its own runs and is marked ``alone``."""
from __future__ import annotations

import json
import os
import select
import shutil
import subprocess
import time

import pytest

os.environ.setdefault("TESTBED_SHARED_HOST", "1")


# -- a real browser ---------------------------------------------------------------------------

class Browser:
    """Headless Chromium driven over its DevTools protocol on a pipe (--remote-debugging-pipe:
    JSON messages ending in NUL on fds 3 and 4), so no port is opened and no websocket client
    is needed. The network is closed: every host name but 127.0.0.1 fails to resolve and any
    request that does go out is sent to a dead proxy; as root the browser also runs in a
    network namespace of its own when no local server is needed. Every request a page makes
    and every script error is recorded (``Page.requests``, ``Page.errors``)."""

    def __init__(self, profile, *, own_netns: bool) -> None:
        browser = next((found for name in ("/usr/bin/chromium", "chromium", "chromium-browser")
                        if (found := shutil.which(name))), None)
        if browser is None:
            pytest.skip("Chromium not installed (Debian: apt-get install -y chromium)")
        wrap = ["unshare", "--net"] if own_netns and os.geteuid() == 0 and shutil.which("unshare") else []
        argv = [*wrap, browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                "--no-first-run", "--disable-background-networking", "--disable-component-update",
                "--disable-sync", "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1",
                "--proxy-server=http://127.0.0.1:9", f"--user-data-dir={profile}",
                "--remote-debugging-pipe", "--window-size=1200,900", "about:blank"]
        to_child, self._w = os.pipe()
        self._r, from_child = os.pipe()

        def fds() -> None:
            os.dup2(to_child, 3)
            os.dup2(from_child, 4)
        # 3 and 4 are kept too: the child closes what is not listed after preexec_fn ran
        self.proc = subprocess.Popen(argv, preexec_fn=fds, pass_fds=(to_child, from_child, 3, 4),
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        os.close(to_child)
        os.close(from_child)
        self._buf = b""
        self._id = 0
        self.events: list[dict] = []

    def call(self, method: str, params: dict | None = None, session: str | None = None,
             timeout: float = 30) -> dict:
        self._id += 1
        msg = {"id": self._id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self._w, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            while b"\0" in self._buf:
                raw, self._buf = self._buf.split(b"\0", 1)
                reply = json.loads(raw)
                if "method" in reply:
                    self.events.append(reply)
                elif reply.get("id") == self._id:
                    if "error" in reply:
                        raise RuntimeError(f"{method}: {reply['error']}")
                    return reply["result"]
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._r], [], [], left)[0]:
                raise TimeoutError(f"no answer to {method} within {timeout} s")
            chunk = os.read(self._r, 1 << 16)
            if not chunk:
                raise RuntimeError(f"Chromium closed the pipe while waiting for {method}")
            self._buf += chunk

    def open(self, url: str, timeout: float = 60) -> Page:
        """A new tab on ``url``, once its load event has fired."""
        target = self.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        sess = self.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        page = Page(self, sess, target)
        for domain in ("Network", "Runtime", "Page"):
            self.call(f"{domain}.enable", session=sess)
        self.call("Page.navigate", {"url": url}, session=sess)
        deadline = time.monotonic() + timeout
        while not any(e["method"] == "Page.loadEventFired" and e.get("sessionId") == sess for e in self.events):
            assert time.monotonic() < deadline, f"{url} did not load within {timeout} s"
            self.call("Runtime.evaluate", {"expression": "1"}, session=sess)     # reads pending events
            time.sleep(0.05)
        return page

    def close(self) -> None:
        os.close(self._w)
        os.close(self._r)
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)


class Page:
    def __init__(self, browser: Browser, session: str, target: str) -> None:
        self.browser, self.session, self.target = browser, session, target

    def js(self, expr: str):
        r = self.browser.call("Runtime.evaluate", {"expression": expr, "returnByValue": True,
                                                   "awaitPromise": True}, session=self.session)
        if "exceptionDetails" in r:
            raise RuntimeError(f"{expr[:80]}: {r['exceptionDetails']}")
        return r["result"].get("value")

    def wait(self, expr: str, what: str, timeout: float = 60):
        deadline = time.monotonic() + timeout
        while not (value := self.js(expr)):
            assert time.monotonic() < deadline, f"{what}: not within {timeout} s"
            time.sleep(0.2)
        return value

    def _events(self, method: str) -> list[dict]:
        return [e["params"] for e in self.browser.events
                if e["method"] == method and e.get("sessionId") == self.session]

    @property
    def requests(self) -> list[str]:
        """Every URL the page asked for, whether it loaded or not."""
        return [e["request"]["url"] for e in self._events("Network.requestWillBeSent")]

    @property
    def errors(self) -> list[str]:
        return [e["exceptionDetails"].get("exception", {}).get("description")
                or e["exceptionDetails"].get("text", "") for e in self._events("Runtime.exceptionThrown")]

    def close(self) -> None:
        self.browser.call("Target.closeTarget", {"targetId": self.target})


def _chromium(tmp_path, own_netns: bool):
    # under the test's own tmp_path: a Chromium helper still writing after the browser has
    # gone recreated a profile folder removed in /tmp, which stayed there
    profile = tmp_path / "chromium-profile"
    profile.mkdir()
    b = Browser(profile, own_netns=own_netns)
    try:
        yield b
    finally:
        b.close()
        shutil.rmtree(profile, ignore_errors=True)



@pytest.fixture
def chromium(tmp_path):
    """Headless Chromium with no network at all (its own network namespace as root): for pages
    opened from files."""
    yield from _chromium(tmp_path, own_netns=True)


@pytest.fixture
def chromium_local(tmp_path):
    """Headless Chromium that reaches 127.0.0.1 and nothing else: for pages served locally."""
    yield from _chromium(tmp_path, own_netns=False)


# The suite's own machinery: tiers, parallel scheduling, host checks, shared helpers and the
# older fixture names (the public plugin, testbed.pytest_plugin, comes from the entry point).
from testbed._suite_plugin import *  # noqa: E402,F401,F403

# The suite's time beside it: the quick tier (--quick) and the critical path (suites/suite_time.py).
pytest_plugins = ["suite_time"]
