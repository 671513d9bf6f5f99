#!/usr/bin/env bash
# A Docker engine for the deployment test (tests/deploy/test_compose.py): use the running
# one, else start an installed dockerd, else install Debian's docker.io (with
# docker-compose v1 and debootstrap) and start it. Prints the compose command to use on
# its last line; exits 3 when no engine can be had (the test then skips and says why).
set -uo pipefail
LOG=${VRAMLAB_DOCKERD_LOG:-/tmp/vramlab-dockerd.log}
up() { docker info >/dev/null 2>&1; }
if ! up; then
  if ! command -v dockerd >/dev/null || ! command -v debootstrap >/dev/null \
    || ! { command -v docker-compose >/dev/null || docker compose version >/dev/null 2>&1; }; then
    echo "installing docker.io, docker-compose and debootstrap from Debian" >&2
    (export DEBIAN_FRONTEND=noninteractive; apt-get update -qq \
      && apt-get install -y -qq docker.io docker-compose debootstrap) >/dev/null 2>&1 \
      || { echo "no engine: could not install docker.io" >&2; exit 3; }
  fi
  if ! up; then
    echo "starting dockerd (log: $LOG)" >&2
    nohup dockerd >"$LOG" 2>&1 &
    echo $! >/tmp/vramlab-dockerd.pid
    for _ in $(seq 60); do up && break; sleep 1; done
    up || { echo "no engine: dockerd did not start: $(tail -3 "$LOG")" >&2; exit 3; }
  fi
fi
if docker compose version >/dev/null 2>&1; then echo "docker compose"
elif command -v docker-compose >/dev/null; then echo "docker-compose"
else echo "no engine: neither docker compose nor docker-compose" >&2; exit 3; fi
