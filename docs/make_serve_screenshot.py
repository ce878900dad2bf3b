"""Make docs/serve.png: the web inspector on the bundled demo, in headless Chromium.

Run from the repository root (needs the `serve` and `dev` extras and Debian's chromium and
chromium-driver, see .ci/install-browser.sh):

    python docs/make_serve_screenshot.py [OUT.png]

It starts `reflective-memory serve --demo` in-process on a free local port (real MiniLM
embedder), opens maya's chat, asks a question in a new session, marks the cited memory helpful
and saves a screenshot of the reply with its recalled memories.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import threading
import time
from pathlib import Path

import uvicorn
from reflective_memory.cli import build_parser
from reflective_memory.serve import server as serve_server
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions as ec
from selenium.webdriver.support.ui import WebDriverWait

QUESTION = "What was my half marathon time?"


def main() -> int:
    """Serve the demo, drive the browser, save the screenshot."""
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "docs/serve.png")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    args: argparse.Namespace = build_parser().parse_args(["serve", "--demo", "--port", str(port)])
    prepared = serve_server.prepare(args)
    srv = uvicorn.Server(uvicorn.Config(prepared.app, host="127.0.0.1", port=port, lifespan="off"))
    threading.Thread(target=srv.run, daemon=True).start()
    while not srv.started:
        time.sleep(0.05)
    os.environ["SE_OFFLINE"] = "true"
    opts = webdriver.ChromeOptions()
    opts.binary_location = "/usr/bin/chromium"
    for flag in (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--window-size=1280,1180",
        "--hide-scrollbars",
        f"--user-data-dir=/tmp/rm-shot-profile-{port}",
    ):
        opts.add_argument(flag)
    drv = webdriver.Chrome(service=Service(executable_path="/usr/bin/chromedriver"), options=opts)
    wait = WebDriverWait(drv, 120)
    try:
        base = f"http://127.0.0.1:{port}"
        drv.get(base + "/users/maya/chat")
        old = drv.find_element(By.TAG_NAME, "html")
        drv.find_element(By.ID, "message").send_keys(QUESTION)
        drv.find_element(By.ID, "send").click()
        wait.until(ec.staleness_of(old))
        hit = drv.find_elements(By.CSS_SELECTOR, "li.exchange li.hit.is-cited")[0]
        old = drv.find_element(By.TAG_NAME, "html")
        hit.find_element(By.CSS_SELECTOR, "button.mark-helpful").click()
        wait.until(ec.staleness_of(old))
        drv.execute_script("window.scrollTo(0, 0)")
        drv.save_screenshot(str(out))
    finally:
        drv.quit()
        srv.should_exit = True
        prepared.memory.close()
    sys.stdout.write(f"saved {out}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
