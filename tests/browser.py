"""A headless Chromium driven as a user drives a page: type into it, click, read what it shows. Chrome's DevTools
protocol over a pipe (--remote-debugging-pipe: JSON messages ended by a NUL byte on file descriptors 3 and 4), so
nothing listens on a port and nothing beyond the standard library is needed."""
from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import shutil
import subprocess
import tempfile
import time

BROWSER = shutil.which("chromium") or shutil.which("chromium-browser")


class Browser:
    """with Browser() as browser: browser.open(url); browser.type("abc"); browser.evaluate("1 + 1")"""

    def __enter__(self) -> "Browser":
        to_browser, self._write = os.pipe()  # fd 3 in the browser: what it reads
        self._read, from_browser = os.pipe()  # fd 4 in the browser: what it writes
        # The browser's ends moved above 4 first: os.pipe() may return 3 or 4 itself, and dup2(3, 3) changes nothing,
        # close-on-exec included, so Chromium would start without that end.
        ends = [fcntl.fcntl(end, fcntl.F_DUPFD_CLOEXEC, 5) for end in (to_browser, from_browser)]
        os.close(to_browser)
        os.close(from_browser)
        self._profile = tempfile.TemporaryDirectory()

        def descriptors() -> None:  # in the child, before Chromium starts: the pipes as 3 and 4, kept across exec
            os.dup2(ends[0], 3)
            os.dup2(ends[1], 4)
        try:
            self._process = subprocess.Popen(
                [BROWSER, "--headless", "--no-sandbox", "--disable-gpu", "--remote-debugging-pipe",
                 f"--user-data-dir={self._profile.name}", "about:blank"],
                close_fds=False, preexec_fn=descriptors,  # (subprocess would close 3 and 4 after preexec_fn)
                start_new_session=True,
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        except BaseException:
            self._profile.cleanup()
            os.close(self._write)
            os.close(self._read)
            raise
        finally:
            for end in ends:
                os.close(end)
        self._next_id, self._buffer, self._target = 0, b"", None
        try:
            self.new_page()
        except BaseException:  # no Chromium and no profile folder left behind by a browser that never answered
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc) -> None:
        with contextlib.suppress(ProcessLookupError):  # the browser and its helpers: its own process group
            os.killpg(self._process.pid, signal.SIGKILL)
        self._process.wait()
        os.close(self._write)
        os.close(self._read)
        for attempt in range(50):  # a helper killed a moment ago may still have been writing in the profile
            try:
                self._profile.cleanup()
                return
            except OSError:
                time.sleep(0.1)
        self._profile.cleanup()

    def new_page(self) -> None:
        """A fresh blank tab in place of the last one (closed, its page with it), and no errors recorded yet: one
        browser can open page after page, each from nothing, as a new browser would."""
        if self._target is not None:
            self.call("Target.closeTarget", targetId=self._target)
        self._target = self.call("Target.createTarget", url="about:blank")["targetId"]
        self._session = self.call("Target.attachToTarget", targetId=self._target, flatten=True)["sessionId"]
        self.errors = []
        self.call("Runtime.enable", session=True)
        self.call("Page.enable", session=True)

    def call(self, method: str, session: bool = False, **params) -> dict:
        """One protocol command, to the browser or (session=True) to the page; its result."""
        self._next_id += 1
        message = {"id": self._next_id, "method": method, "params": params}
        if session:
            message["sessionId"] = self._session
        os.write(self._write, json.dumps(message).encode() + b"\0")
        while True:
            reply = self._receive()
            if reply.get("method") == "Runtime.exceptionThrown":  # an uncaught error in the page's script
                self.errors.append(reply["params"]["exceptionDetails"].get("exception", {}).get("description", ""))
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply["result"]

    def _receive(self) -> dict:
        while b"\0" not in self._buffer:
            chunk = os.read(self._read, 1 << 16)
            if not chunk:
                raise RuntimeError("the browser closed its pipe")
            self._buffer += chunk
        message, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(message)

    def open(self, url: str, timeout: float = 60) -> None:
        self.call("Page.navigate", session=True, url=url)
        from conftest import patient  # (imported here: a script that drives the browser without pytest never loads)
        deadline = time.monotonic() + patient(timeout)
        while self.evaluate("document.readyState") != "complete":
            if time.monotonic() > deadline:
                raise TimeoutError(f"{url} did not load in {timeout} s")
            time.sleep(0.05)

    def prefer_language(self, language: str) -> None:
        """The languages the browser says its user reads (navigator.language, Accept-Language) for pages opened
        after this, as a browser set to that language says them: "zh-CN", say."""
        user_agent = self.evaluate("navigator.userAgent")
        self.call("Emulation.setUserAgentOverride", session=True, userAgent=user_agent, acceptLanguage=language)

    def evaluate(self, expression: str):
        """A JavaScript expression's value in the page (JSON-like values)."""
        result = self.call("Runtime.evaluate", session=True, expression=expression, returnByValue=True)
        if "exceptionDetails" in result:
            raise RuntimeError(result["exceptionDetails"].get("exception", {}).get("description", expression))
        return result["result"].get("value")

    def click(self, selector: str) -> None:
        """A real mouse click (press and release) at the middle of the first element the CSS selector finds."""
        box = self._middle(selector)
        for kind in ("mousePressed", "mouseReleased"):
            self.call("Input.dispatchMouseEvent", session=True, type=kind, x=box[0], y=box[1], button="left",
                      clickCount=1)

    def point(self, selector: str, at: tuple[float, float] = (0.5, 0.5)) -> None:
        """The mouse moved onto the first element the CSS selector finds (no button pressed): at its middle, or at
        the fractions (across, down) of its width and height."""
        box = self._middle(selector, at)
        self.call("Input.dispatchMouseEvent", session=True, type="mouseMoved", x=box[0], y=box[1])

    def _middle(self, selector: str, at: tuple[float, float] = (0.5, 0.5)) -> list[float]:
        return self.evaluate(f"(() => {{ const e = document.querySelector({json.dumps(selector)}); "
                             f"e.scrollIntoView({{block: 'center'}}); const r = e.getBoundingClientRect(); "
                             f"return [r.x + r.width * {at[0]}, r.y + r.height * {at[1]}]; }})()")

    def choose(self, selector: str, value: str) -> None:
        """Pick an option of a <select> as a person does from its list: the value changes and "change" fires."""
        self.evaluate(f"(() => {{ const e = document.querySelector({json.dumps(selector)}); e.focus(); "
                      f"e.value = {json.dumps(value)}; e.dispatchEvent(new Event('change', {{bubbles: true}})); }})()")

    def type(self, text: str, into: str, replace: bool = False) -> None:
        """Focus the element (a click) and type text into it, character by character, as a keyboard would;
        replace: select what it holds first (Ctrl-A), so that the typing replaces it."""
        self.click(into)
        if replace:
            self.evaluate(f"document.querySelector({json.dumps(into)}).select()")
        for ch in text:
            self.call("Input.insertText", session=True, text=ch)
