#!/usr/bin/env bash
# Set up (or refresh) the local virtualenv, then run one job: `demo` or `test`.
#   bash scripts/run.sh demo   -> the stickless demo on a 3-node LocalCluster
#   bash scripts/run.sh serve  -> one node with the HTTP gateway and chat page on 127.0.0.1:8000
#   bash scripts/run.sh test   -> lint, type check and the whole test suite
set -euo pipefail
cd "$(dirname "$0")/.."

job="${1:-test}"
shift || true

# The tests start their own redis-server (also with TLS: openssl makes its certificates), haproxy,
# nginx, headless Chromium (Debian's chromium and chromium-driver) and Node (the JavaScript
# client's tests); install what is missing (CI runs as root).
missing=()
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
command -v openssl >/dev/null 2>&1 || missing+=(openssl)
[ -x /usr/sbin/haproxy ] || command -v haproxy >/dev/null 2>&1 || missing+=(haproxy)
[ -x /usr/sbin/nginx ] || command -v nginx >/dev/null 2>&1 || missing+=(nginx)
[ -x /usr/bin/chromium ] || missing+=(chromium)
[ -x /usr/bin/chromedriver ] || missing+=(chromium-driver)
command -v node >/dev/null 2>&1 || missing+=(nodejs)
if [ "${#missing[@]}" -gt 0 ] && [ "$job" = test ] && command -v apt-get >/dev/null 2>&1; then
  apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y "${missing[@]}"
fi

python_bin="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  "$python_bin" -m venv .venv
fi
# Refresh the install every time so a changed pyproject.toml is picked up; each job installs
# only what it needs (the demo: the base package, pydantic and msgpack).
case "$job" in
  demo) spec="." ;;
  serve) spec=".[web]" ;;
  *) spec=".[dev]" ;;
esac
.venv/bin/python -m pip install --quiet --disable-pip-version-check --upgrade pip >/dev/null
.venv/bin/python -m pip install --quiet --disable-pip-version-check -e "$spec"

# The AI SDK drop-in is tested with the real `ai` package from npm (tests/test_ai_sdk_cluster.py):
# install Node and npm when missing, then the client's pinned packages (package-lock.json).
if [ "$job" = test ]; then
  if ! command -v npm >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1; then
    apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y nodejs npm
  fi
  if command -v npm >/dev/null 2>&1; then
    (cd clients/ai-sdk-test && npm ci --no-audit --no-fund --loglevel=error)
  elif [ "${CI:-}" = true ]; then
    echo "scripts/run.sh: npm is required under CI=true (clients/ai-sdk-test)" >&2
    exit 1
  fi
fi

case "$job" in
  demo)
    exec .venv/bin/stickless demo "$@"
    ;;
  serve)
    exec .venv/bin/stickless serve "$@"
    ;;
  test)
    .venv/bin/ruff check stickless tests examples
    .venv/bin/mypy stickless
    exec .venv/bin/python -m pytest -q "$@"
    ;;
  *)
    echo "usage: scripts/run.sh demo|serve|test" >&2
    exit 2
    ;;
esac
