"""Drive upstream's web UI, served by pipeshard-server at /, in a real
headless Chromium over the DevTools protocol: the page loads, a message is
typed and sent with Enter, the answer streams in (several chunks of one
`stream: true` chat request) and appears on the page.

usage: webui_chromium.py BASE_URL CHROMIUM
Prints one JSON object with what it saw; exits non-zero with a message
otherwise.
"""

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

import websocket  # websocket-client


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Tab:
    def __init__(self, ws_url):
        self.ws = websocket.create_connection(ws_url, timeout=60)
        self.next_id = 0
        self.events = []

    def call(self, method, **params):
        self.next_id += 1
        self.ws.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv())
            if msg.get("id") == self.next_id:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})
            self.events.append(msg)

    def eval(self, expr):
        r = self.call("Runtime.evaluate", expression=expr, returnByValue=True, awaitPromise=True)
        return r.get("result", {}).get("value")

    def pump(self, seconds):
        self.ws.settimeout(seconds)
        try:
            while True:
                self.events.append(json.loads(self.ws.recv()))
        except websocket.WebSocketTimeoutException:
            pass
        finally:
            self.ws.settimeout(60)


def wait_for(what, cond, timeout):
    t0 = time.time()
    while time.time() - t0 < timeout:
        v = cond()
        if v:
            return v
        time.sleep(0.25)
    raise AssertionError(f"timed out waiting for {what}")


def main() -> int:
    base, chromium = sys.argv[1], sys.argv[2]
    port = free_port()
    profile = tempfile.mkdtemp(prefix="webui-chromium-")
    proc = subprocess.Popen(
        [chromium, "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
         f"--remote-debugging-port={port}", "--remote-allow-origins=*", f"--user-data-dir={profile}", "about:blank"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        def targets():
            try:
                return json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/json", timeout=2).read())
            except OSError:
                return None
        page = wait_for("chromium's DevTools endpoint", lambda: next((t for t in targets() or [] if t["type"] == "page"), None), 60)
        tab = Tab(page["webSocketDebuggerUrl"])
        tab.call("Network.enable")
        tab.call("Page.enable")
        tab.call("Page.navigate", url=base + "/")
        wait_for("the chat input", lambda: tab.eval("!!document.querySelector('textarea')"), 60)
        title = tab.eval("document.title")
        tab.eval("document.querySelector('textarea').focus()")
        tab.call("Input.insertText", text="Name one colour.")
        for kind in ("keyDown", "keyUp"):
            tab.call("Input.dispatchKeyEvent", type=kind, key="Enter", code="Enter",
                     windowsVirtualKeyCode=13, nativeVirtualKeyCode=13, **({"text": "\r"} if kind == "keyDown" else {}))

        # The chat request, its streamed chunks, and its end.
        def chat_request():
            for e in tab.events:
                if e.get("method") == "Network.requestWillBeSent":
                    r = e["params"]["request"]
                    if r["url"].endswith("/v1/chat/completions") and r.get("method") == "POST":
                        return e["params"]["requestId"], r
            tab.pump(0.5)
            return None
        req_id, req = wait_for("the chat request", chat_request, 60)
        body = json.loads(req.get("postData") or "{}")
        assert body.get("stream") is True, body

        def finished():
            tab.pump(0.5)
            return any(e.get("method") in ("Network.loadingFinished", "Network.loadingFailed")
                       and e["params"]["requestId"] == req_id for e in tab.events)
        wait_for("the end of the answer", finished, 240)
        failed = [e for e in tab.events if e.get("method") == "Network.loadingFailed" and e["params"]["requestId"] == req_id]
        assert not failed, failed
        chunks = sum(1 for e in tab.events if e.get("method") == "Network.dataReceived" and e["params"]["requestId"] == req_id)
        sse = tab.call("Network.getResponseBody", requestId=req_id)["body"]
        answer = ""
        for line in sse.splitlines():
            if line.startswith("data: ") and line != "data: [DONE]":
                for ch in json.loads(line[6:]).get("choices", []):
                    answer += (ch.get("delta") or {}).get("content") or ""
        assert answer.strip(), sse[:500]
        # The answer is shown on the page (rendered as Markdown: compare words).
        words = re.findall(r"[A-Za-z]{3,}", answer)[:5]
        def shown():
            text = tab.eval("document.body.innerText") or ""
            return all(w in text for w in words) and "Name one colour." in text
        wait_for(f"the answer {answer[:60]!r} on the page", shown, 30)
        print(json.dumps({"title": title, "chunks": chunks, "answer": answer, "stream": body.get("stream")}))
        return 0
    finally:
        proc.kill()
        proc.wait()
        shutil.rmtree(profile, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
