#!/usr/bin/env bash
# Local stand-ins for the two base images the compose stack names (python:3.12-slim and
# postgres:16), for a machine whose Docker engine reaches no image registry. Each is made
# only when the engine has no image of that name and a pull fails; a real pull wins.
# They are Debian bookworm (Python 3.11, PostgreSQL 15) made with debootstrap, and behave
# like the official images as far as the Dockerfile and docker-compose.yml use them.
set -euo pipefail
CACHE=${VRAMLAB_STANDIN_CACHE:-/var/cache/vramlab-standins}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
HERE="$(cd "$(dirname "$0")" && pwd)"

have() { docker image inspect "$1" >/dev/null 2>&1; }
pulled() { timeout 60 docker pull -q "$1" >/dev/null 2>&1; }

# A minimal Debian root with the given packages, cleaned of docs, caches and apt lists.
rootfs() { # DIR PACKAGES
  local dir=$1 pkgs=$2
  rm -rf "$dir" "$dir.tmp"
  debootstrap --variant=minbase --include="$pkgs" bookworm "$dir.tmp" "$MIRROR" >"$dir.log" 2>&1 \
    || { tail -20 "$dir.log" >&2; return 1; }
  # The host's CA bundle: pip inside the image must trust what the host trusts.
  cp /etc/ssl/certs/ca-certificates.crt "$dir.tmp/etc/ssl/certs/ca-certificates.crt"
  rm -rf "$dir.tmp"/usr/share/{doc,man,info,locale,lintian} "$dir.tmp"/var/cache/apt/* \
    "$dir.tmp"/var/lib/apt/lists/* "$dir.tmp"/var/log/* "$dir.tmp"/tmp/*
  mv "$dir.tmp" "$dir"
}

mkdir -p "$CACHE"
need_python=0 need_postgres=0
if ! have python:3.12-slim && ! pulled python:3.12-slim; then need_python=1; fi
if ! have postgres:16 && ! pulled postgres:16; then need_postgres=1; fi
# The two roots are made side by side (each mostly waits on the mirror and on dpkg).
pids=()
if [ "$need_python" = 1 ]; then
  echo "stand-in python:3.12-slim (debootstrap bookworm, python3.11)"
  rootfs "$CACHE/python" python3,python3-venv,ca-certificates & pids+=($!)
fi
if [ "$need_postgres" = 1 ]; then
  echo "stand-in postgres:16 (debootstrap bookworm, postgresql 15)"
  rootfs "$CACHE/postgres" postgresql-15,ca-certificates & pids+=($!)
fi
for pid in ${pids[@]+"${pids[@]}"}; do wait "$pid"; done
if [ "$need_python" = 1 ]; then
  ln -sf python3 "$CACHE/python/usr/bin/python"
  tar -C "$CACHE/python" -c . | docker import \
    --change 'ENV LANG=C.UTF-8 PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'CMD ["python3"]' - python:3.12-slim >/dev/null
  rm -rf "$CACHE/python"
fi
if [ "$need_postgres" = 1 ]; then
  install -m 0755 "$HERE/standin/postgres-entrypoint.sh" "$CACHE/postgres/usr/local/bin/docker-entrypoint.sh"
  tar -C "$CACHE/postgres" -c . | docker import \
    --change 'ENV LANG=C.UTF-8 PGDATA=/var/lib/postgresql/data PATH=/usr/lib/postgresql/15/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENTRYPOINT ["docker-entrypoint.sh"]' --change 'CMD ["postgres"]' \
    --change 'EXPOSE 5432' - postgres:16 >/dev/null
  rm -rf "$CACHE/postgres"
fi
for i in python:3.12-slim postgres:16; do docker image inspect -f "$i {{.Size}}" "$i"; done
