#!/usr/bin/env bash
# Runs the web console's browser tests (tests/web_browser.rs): installs Debian's Chromium and
# chromedriver when missing (scripts/bootstrap.sh), starts chromedriver on a free port chosen now, runs the tests
# headlessly, stops chromedriver by its pid. Screenshots land in
# $CARGO_TARGET_DIR/tmp/web-screenshots/; with --update-docs the overview is copied to
# docs/console-overview.png (the README's picture).
set -euo pipefail
cd "$(dirname "$0")/.."
ROCKQ_NEED_BROWSER=1 source scripts/bootstrap.sh

update_docs=0
if [ "${1:-}" = "--update-docs" ]; then update_docs=1; shift; fi

# chromedriver on a port chosen now. Plain bash (no python, no ss on a fresh machine): a
# random high port; if chromedriver cannot bind it, it exits and another is tried. Ready once
# the port accepts connections while chromedriver is still alive.
log="$(mktemp -t chromedriver.XXXXXX.log)"
driver_pid=""
# In a process group of its own (setsid), so that stopping it by its pid's group also stops
# any browser it started, even if a test died before closing its session.
stop_driver() {
  if [ -n "$driver_pid" ]; then
    kill -- "-$driver_pid" 2>/dev/null || true
    wait "$driver_pid" 2>/dev/null || true
  fi
}
trap stop_driver EXIT
for attempt in 1 2 3 4 5 6 7 8; do
  port=$(( 20000 + RANDOM % 40000 ))
  setsid chromedriver --port="$port" --allowed-ips=127.0.0.1 >"$log" 2>&1 &
  driver_pid=$!
  ready=0
  for _ in $(seq 1 100); do
    kill -0 "$driver_pid" 2>/dev/null || break
    if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && kill -0 "$driver_pid" 2>/dev/null; then
      ready=1
      break
    fi
    sleep 0.1
  done
  [ "$ready" = 1 ] && break
  stop_driver
  driver_pid=""
done
if [ "$ready" != 1 ]; then
  echo "browser-tests: chromedriver did not start:" >&2; cat "$log" >&2; exit 1
fi
echo "browser-tests: chromedriver (pid $driver_pid) on 127.0.0.1:$port" >&2

export ROCKQ_BROWSER_TESTS=1 CHROMEDRIVER="127.0.0.1:$port" CHROMIUM="$(command -v chromium)"
if [ "$update_docs" = 1 ]; then
  export ROCKQ_SCREENSHOT_OVERVIEW="$PWD/docs/console-overview.png"
fi
# The test command's feature set: any other set would compile RocksDB a second time.
cargo test --features cli,postcard,tower,web,etcd,otel --test web_browser "$@" -- --nocapture
