# Sourced by scripts/test and scripts/example: make sure the tools exist, then the venv.
# Idempotent and quiet when everything is already there.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${JOBBERS_VENV:-$ROOT/.venv}"

need_apt=()
# scripts/example sets JOBBERS_REDIS_OPTIONAL when REDIS_URL names a Redis to use instead
command -v redis-server >/dev/null 2>&1 || [ -n "${JOBBERS_REDIS_OPTIONAL:-}" ] \
  || need_apt+=(redis-server)
# the Redis Cluster tests (tests/integration/topology_servers.py) create theirs with redis-cli
command -v redis-cli >/dev/null 2>&1 || [ -n "${JOBBERS_REDIS_OPTIONAL:-}" ] \
  || need_apt+=(redis-tools)
# the TLS tests (tests/integration/tls_helpers.py) make their certificates with openssl
command -v openssl >/dev/null 2>&1 || need_apt+=(openssl)
# the Django quickstart (tests/distribution) reads the API with curl, as the page does
command -v curl >/dev/null 2>&1 || need_apt+=(curl)
# the browser tests (tests/browser) drive Debian's headless Chromium; scripts/test asks for it
if [ -n "${JOBBERS_NEED_BROWSER:-}" ]; then
  command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 \
    || need_apt+=(chromium)
  command -v chromedriver >/dev/null 2>&1 || need_apt+=(chromium-driver)
fi
if ! command -v python3 >/dev/null 2>&1; then
  need_apt+=(python3 python3-venv)
elif [ ! -x "$VENV/bin/python" ] && ! python3 -c "import ensurepip, venv" >/dev/null 2>&1; then
  need_apt+=(python3-venv)  # Debian ships venv's pip bootstrap separately
fi
if [ ${#need_apt[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "==> installing ${need_apt[*]} (apt-get)"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}" >/dev/null
    # Debian starts a redis service on install; jobbers never uses it (tests and the example
    # start their own on a free port), so leave whatever was running as it was.
  else
    echo "missing: ${need_apt[*]}; install them (e.g. sudo apt-get install ${need_apt[*]})" >&2
    exit 1
  fi
fi

stamp="$VENV/.jobbers-installed"
if [ ! -x "$VENV/bin/python" ]; then
  echo "==> creating virtual environment in $VENV"
  python3 -m venv "$VENV"
fi
if [ ! -f "$stamp" ] || [ "$ROOT/pyproject.toml" -nt "$stamp" ]; then
  echo "==> installing jobbers, its development tools and the docs tools into $VENV"
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check --upgrade "pip>=25.1"
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check -e "$ROOT[django,otel]" \
    --group "$ROOT/pyproject.toml:dev" --group "$ROOT/pyproject.toml:docs"
  touch "$stamp"
fi
export PATH="$VENV/bin:$PATH"
cd "$ROOT"
