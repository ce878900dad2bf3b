#!/usr/bin/env bash
# Installs PostgreSQL 15 (Debian) and builds pgvector 0.8.6 from ../shared/vendor, idempotently.
# Run as root on Debian 12. The PostgreSQL tests start their own throwaway cluster with these
# binaries (tests/pg_cluster.py); nothing is started here.
set -euo pipefail
cd "$(dirname "$0")/.."
PG_MAJOR=15
PGV_VERSION=0.8.6
TARBALL="$(cd .. && pwd)/shared/vendor/pgvector-${PGV_VERSION}.tar.gz"

# A machine may have the server without its development headers (postgresql-15 installed,
# postgresql-server-dev-15 not): pgvector's build needs postgres.h, so check for it too.
PG_BIN="/usr/lib/postgresql/${PG_MAJOR}/bin"
if [ ! -x "${PG_BIN}/postgres" ] || [ ! -x "${PG_BIN}/pg_config" ] || ! command -v make >/dev/null \
  || ! command -v gcc >/dev/null \
  || [ ! -f "$("${PG_BIN}/pg_config" --includedir-server 2>/dev/null)/postgres.h" ]; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update
  apt-get install -y --no-install-recommends "postgresql-${PG_MAJOR}" \
    "postgresql-server-dev-${PG_MAJOR}" build-essential
fi

PG_CONFIG="/usr/lib/postgresql/${PG_MAJOR}/bin/pg_config"
EXT_DIR="$("$PG_CONFIG" --sharedir)/extension"
if [ -f "${EXT_DIR}/vector--${PGV_VERSION}.sql" ] && [ -f "$("$PG_CONFIG" --pkglibdir)/vector.so" ]; then
  echo "pgvector ${PGV_VERSION} already installed"
else
  if [ ! -f "$TARBALL" ]; then
    echo "missing $TARBALL (the team kit must sit beside the repository)" >&2
    exit 1
  fi
  build="$(mktemp -d)"
  trap 'rm -rf "$build"' EXIT
  tar xzf "$TARBALL" -C "$build"
  make -C "$build/pgvector-${PGV_VERSION}" PG_CONFIG="$PG_CONFIG"
  make -C "$build/pgvector-${PGV_VERSION}" PG_CONFIG="$PG_CONFIG" install
fi
# The test cluster runs as the unprivileged `postgres` user (the Debian package creates it).
id postgres >/dev/null 2>&1 || useradd --system --home /var/lib/postgresql --shell /bin/bash postgres
echo "PostgreSQL ${PG_MAJOR} + pgvector ${PGV_VERSION} ready"
