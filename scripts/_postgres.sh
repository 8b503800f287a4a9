# Sourced by scripts/test: make sure a PostgreSQL server answers on 127.0.0.1:5432 for the
# jobbers_django tests (user postgres, no password). Starts the machine's cluster if it is
# installed but stopped; installs one (Debian) if there is none. Never changes an existing
# server's authentication.
pg_up() {
  python3 - <<'PY' 2>/dev/null
import socket, sys
s = socket.socket(); s.settimeout(1)
sys.exit(0 if s.connect_ex(("127.0.0.1", 5432)) == 0 else 1)
PY
}
if ! pg_up; then
  if ! command -v pg_ctlcluster >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
      echo "==> installing postgresql (apt-get) for the jobbers_django tests"
      apt-get update -qq
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null
      ver="$(ls /etc/postgresql | sort -V | tail -1)"
      # a cluster made here, for tests only: trust loopback connections
      sed -i '1i host all all 127.0.0.1/32 trust\nhost all all ::1/128 trust' \
        "/etc/postgresql/$ver/main/pg_hba.conf"
    else
      echo "PostgreSQL is not running on 127.0.0.1:5432 and cannot be installed here;" \
           "install it (apt-get install postgresql) with trust auth for 127.0.0.1" >&2
      exit 1
    fi
  fi
  echo "==> starting PostgreSQL"
  for ver in $(ls /etc/postgresql); do
    pg_ctlcluster --skip-systemctl-redirect "$ver" main start || true
  done
  for _ in $(seq 1 60); do pg_up && break; sleep 0.5; done
  pg_up || { echo "PostgreSQL did not come up on 127.0.0.1:5432" >&2; exit 1; }
fi
