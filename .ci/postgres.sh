# Source me: start a throwaway PostgreSQL server for the memory-store tests and export
# SPECPILOT_TEST_PG_URL; the server and its folder go away when the sourcing shell exits.
# Installs Debian's server package first when it is missing (CI runs as root on a clean machine).
# The cluster listens on a Unix socket in its own temp folder only (no TCP port to collide on).

specpilot_pg_start() {
  if ! compgen -G "/usr/lib/postgresql/*/bin/pg_ctl" >/dev/null; then
    # No default cluster: we start our own, and installing one would only cost time.
    if [ ! -e /etc/postgresql-common/createcluster.conf ]; then
      mkdir -p /etc/postgresql-common
      echo "create_main_cluster = false" >/etc/postgresql-common/createcluster.conf
    fi
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends postgresql >/dev/null
  fi
  local bin
  bin=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -n 1)
  SPECPILOT_PG_DIR=$(mktemp -d /tmp/specpilot-pg.XXXXXX)
  local as=()
  if [ "$(id -u)" = 0 ]; then  # postgres refuses to run as root
    chown postgres: "$SPECPILOT_PG_DIR"
    as=(runuser -u postgres --)
  fi
  "${as[@]}" "$bin/initdb" -D "$SPECPILOT_PG_DIR/data" -U postgres -A trust -E UTF8 --locale=C --no-sync >/dev/null
  "${as[@]}" "$bin/pg_ctl" -D "$SPECPILOT_PG_DIR/data" -l "$SPECPILOT_PG_DIR/log" -w -s \
    -o "-k $SPECPILOT_PG_DIR -c listen_addresses= -c fsync=off -c synchronous_commit=off -c full_page_writes=off" start
  SPECPILOT_PG_STOP=("${as[@]}" "$bin/pg_ctl" -D "$SPECPILOT_PG_DIR/data" -s -m immediate stop)
  trap specpilot_pg_stop EXIT
  export SPECPILOT_TEST_PG_URL="postgresql://postgres@/postgres?host=$SPECPILOT_PG_DIR"
}

specpilot_pg_stop() {
  "${SPECPILOT_PG_STOP[@]}" || true
  rm -rf "$SPECPILOT_PG_DIR"
}

specpilot_pg_start
