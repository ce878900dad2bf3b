#!/usr/bin/env bash
# Install Debian's headless browser for the web app's end-to-end tests (tests/serve/
# test_serve_browser.py). Idempotent; run as root on Debian 12. The tests use
# /usr/bin/chromium and /usr/bin/chromedriver; selenium comes from the `dev` extra.
set -euo pipefail
if command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1; then
    echo "chromium and chromedriver already installed: $(chromium --version 2>/dev/null | head -n1)"
    exit 0
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update
apt-get install -y --no-install-recommends chromium chromium-driver
chromium --version 2>/dev/null | head -n1 || true
chromedriver --version
