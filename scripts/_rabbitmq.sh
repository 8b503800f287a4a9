# Sourced by scripts/test: make sure a RabbitMQ broker answers on 127.0.0.1:5672 (guest/guest)
# for the tests that run jobbers on an amqp:// broker (tests/integration/test_on_rabbitmq.py,
# tests/django/test_end_to_end_rabbitmq.py). Starts the machine's server if it is installed but
# stopped; installs Debian's rabbitmq-server if there is none. Each test session then makes
# its own vhost with rabbitmqctl (tests/rabbitmq.py) and deletes it at the end.
rabbitmq_up() {
  python3 - <<'PY' 2>/dev/null
import socket, sys
s = socket.socket(); s.settimeout(1)
sys.exit(0 if s.connect_ex(("127.0.0.1", 5672)) == 0 else 1)
PY
}
if ! rabbitmq_up; then
  if ! command -v rabbitmq-server >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
      echo "==> installing rabbitmq-server (apt-get) for the RabbitMQ broker tests"
      # a server installed here, for tests only: loopback only, and a node name that resolves
      # whatever the machine's hostname (written first: the package may start it at once)
      mkdir -p /etc/rabbitmq
      [ -f /etc/rabbitmq/rabbitmq-env.conf ] || cat > /etc/rabbitmq/rabbitmq-env.conf <<'ENV'
NODENAME=rabbit@localhost
ERL_EPMD_ADDRESS=127.0.0.1
export ERL_FLAGS="-kernel inet_dist_use_interface {127,0,0,1}"
ENV
      [ -f /etc/rabbitmq/rabbitmq.conf ] || \
        echo "listeners.tcp.local = 127.0.0.1:5672" > /etc/rabbitmq/rabbitmq.conf
      apt-get update -qq
      # the package's postinst may fail to start it through an init system a container lacks
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq rabbitmq-server >/dev/null || true
      command -v rabbitmq-server >/dev/null 2>&1 || {
        echo "could not install rabbitmq-server" >&2; exit 1; }
    else
      echo "RabbitMQ is not running on 127.0.0.1:5672 and cannot be installed here;" \
           "install it (apt-get install rabbitmq-server) with the default guest user" >&2
      exit 1
    fi
  fi
  rabbitmq_up || {
    echo "==> starting RabbitMQ"
    # Debian's wrapper runs it as the rabbitmq user when called as root
    rabbitmq-server -detached || true
    rabbitmqctl -q await_startup --timeout 60 >/dev/null 2>&1 || true
    for _ in $(seq 1 120); do rabbitmq_up && break; sleep 0.5; done
    rabbitmq_up || { echo "RabbitMQ did not come up on 127.0.0.1:5672" >&2; exit 1; }
  }
fi
