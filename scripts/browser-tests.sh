#!/usr/bin/env bash
# Runs the web console's browser tests (tests/web_browser.rs): installs Debian's Chromium and
# chromedriver when missing, starts chromedriver on a free port chosen now, runs the tests
# headlessly, stops chromedriver by its pid. Screenshots land in
# $CARGO_TARGET_DIR/tmp/web-screenshots/; with --update-docs the overview is copied to
# docs/console-overview.png (the README's picture).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/bootstrap.sh

update_docs=0
if [ "${1:-}" = "--update-docs" ]; then update_docs=1; shift; fi

if ! command -v chromium >/dev/null 2>&1 || ! command -v chromedriver >/dev/null 2>&1; then
  echo "browser-tests: installing chromium and chromium-driver" >&2
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null
fi

# A free port, chosen by the kernel now (bind to 0, read it, release it).
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()')
log="$(mktemp -t chromedriver.XXXXXX.log)"
# In a process group of its own (setsid), so that stopping it by its pid's group also stops
# any browser it started, even if a test died before closing its session.
setsid chromedriver --port="$port" --allowed-ips=127.0.0.1 >"$log" 2>&1 &
driver_pid=$!
trap 'kill -- "-$driver_pid" 2>/dev/null || true; wait "$driver_pid" 2>/dev/null || true' EXIT

# Ready when its status endpoint answers.
for _ in $(seq 1 100); do
  if python3 -c "import urllib.request,sys; urllib.request.urlopen('http://127.0.0.1:$port/status', timeout=1)" 2>/dev/null; then
    break
  fi
  if ! kill -0 "$driver_pid" 2>/dev/null; then
    echo "browser-tests: chromedriver exited:" >&2; cat "$log" >&2; exit 1
  fi
  sleep 0.1
done

export ROCKQ_BROWSER_TESTS=1 CHROMEDRIVER="127.0.0.1:$port" CHROMIUM="$(command -v chromium)"
if [ "$update_docs" = 1 ]; then
  export ROCKQ_SCREENSHOT_OVERVIEW="$PWD/docs/console-overview.png"
fi
cargo test --features cli,postcard,tower,web --test web_browser "$@" -- --nocapture
