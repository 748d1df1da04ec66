#!/usr/bin/env python3
"""The dashboard's screenshot for the docs: the recorded 8x H200 inventory, two environments holding GPUs
(created, not started: this machine has no GPU runtime), headless chromium.

Usage (repository root, dockerd running, chromium + chromium-driver + selenium installed):
  python tools/dashboard_screenshot.py docs/img/dashboard-8xh200.png
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
INVENTORY = ROOT / "tests/fixtures/runtime/inventory-8xh200.json"
BASE = os.environ.get("TORCHRIG_TEST_BASE", "torchrig-test/debian:bookworm")


def main() -> int:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "dashboard.png").resolve()
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    state = tempfile.mkdtemp(prefix="torchrig-shot-")
    env = {**os.environ, "TORCHRIG_STATE_DIR": state, "TORCHRIG_GPU_INVENTORY": str(INVENTORY)}
    made = []
    dash = None
    try:
        for name, gpus in (("team-a-pretrain", "4"), ("team-b-finetune", "2")):
            subprocess.run(
                [sys.executable, "-m", "torchrig", "up", "--image", BASE, "--name", name, "--gpus", gpus,
                 "--no-jupyter", "--no-ssh", "--create-only"],
                env=env, check=True, capture_output=True,
            )  # fmt: skip
            made.append(name)
        dash = subprocess.Popen(
            [sys.executable, "-m", "torchrig", "dashboard", "--port", "0", "--interval", "2"],
            env=env, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert dash.stdout is not None
        url = dash.stdout.readline().split(": ", 1)[1].strip()
        opts = webdriver.ChromeOptions()
        opts.binary_location = "/usr/bin/chromium"
        for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1280,1100"):
            opts.add_argument(flag)
        browser = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=opts)
        try:
            browser.get(url)
            time.sleep(8)  # doctor's verdict arrives from its own thread
            browser.get(url.split("?")[0])
            time.sleep(1)
            browser.save_screenshot(str(out))
        finally:
            browser.quit()
    finally:
        if dash is not None:
            dash.terminate()
            dash.wait(10)
        for name in made:
            subprocess.run([sys.executable, "-m", "torchrig", "down", name], env=env, capture_output=True)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
