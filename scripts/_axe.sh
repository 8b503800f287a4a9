# Sourced by scripts/test: axe-core (npm), which the browser tests (tests/browser) run on every
# admin page. Installed once into .cache/axe (git-ignored) when missing; the tests read it
# from JOBBERS_AXE_JS and fail, never skip, without it.
AXE_DIR="${JOBBERS_AXE_DIR:-$ROOT/.cache/axe}"
export JOBBERS_AXE_JS="$AXE_DIR/node_modules/axe-core/axe.min.js"
if [ ! -f "$JOBBERS_AXE_JS" ]; then
  if ! command -v npm >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
      echo "==> installing npm (apt-get)"
      apt-get update -qq
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq npm >/dev/null
    else
      echo "missing: npm (for axe-core); install it (e.g. sudo apt-get install npm)" >&2
      exit 1
    fi
  fi
  echo "==> installing axe-core 4 into $AXE_DIR (npm)"
  mkdir -p "$AXE_DIR"
  npm install --prefix "$AXE_DIR" --no-audit --no-fund --silent axe-core@4 >/dev/null
fi
