#!/usr/bin/env bash
# Makes a Docker engine answer on this machine and builds rollhub/base:bookworm if missing.
#
#  1. installs Debian's docker.io (+ debootstrap, bubblewrap) when dockerd is missing;
#  2. starts dockerd in the background when no engine answers (log: $ROLLHUB_DOCKERD_LOG),
#     with the overlay2 storage driver, falling back to fuse-overlayfs and then vfs when
#     the kernel / filesystem refuses overlay2;
#  3. waits until `docker info` works (timeout $ROLLHUB_DOCKER_WAIT_S, default 60 s);
#  4. builds the base image with debootstrap (no registry) when it is missing;
#  5. removes rollhub containers whose owner process is gone (`rollhub sandbox gc`).
# Fails loudly on any step. Set ROLLHUB_ALLOW_NO_DOCKER=1 to continue without an engine
# (the docker tests then skip with the reason printed here).
# DOCKER_HOST pointing at a remote engine skips steps 1-2.
set -euo pipefail
cd "$(dirname "$0")/.."

LOG=${ROLLHUB_DOCKERD_LOG:-/var/log/rollhub-dockerd.log}
WAIT_S=${ROLLHUB_DOCKER_WAIT_S:-60}

say() { echo "== setup_docker: $*"; }
fail() {
    echo "!! setup_docker: $*" >&2
    if [ "${ROLLHUB_ALLOW_NO_DOCKER:-0}" = "1" ]; then
        echo "!! setup_docker: continuing without Docker (ROLLHUB_ALLOW_NO_DOCKER=1); docker tests will skip" >&2
        exit 0
    fi
    exit 1
}
engine_answers() { timeout 10 docker info >/dev/null 2>&1; }
as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo -n "$@"; fi; }

wait_for_engine() {  # $1 = pid of the dockerd we started
    local deadline=$((SECONDS + WAIT_S))
    while [ $SECONDS -lt $deadline ]; do
        engine_answers && return 0
        kill -0 "$1" 2>/dev/null || return 1
        sleep 1
    done
    return 1
}

if ! engine_answers; then
    [ -n "${DOCKER_HOST:-}" ] && fail "DOCKER_HOST=$DOCKER_HOST is set but no engine answers there"
    if ! command -v dockerd >/dev/null 2>&1 || ! command -v debootstrap >/dev/null 2>&1; then
        say "installing docker.io, debootstrap, bubblewrap (Debian packages)"
        as_root env DEBIAN_FRONTEND=noninteractive apt-get update -q >/dev/null \
            || fail "apt-get update failed"
        as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q docker.io debootstrap bubblewrap >/dev/null \
            || fail "apt-get install docker.io failed"
    fi
    started=0
    for driver in overlay2 fuse-overlayfs vfs; do
        say "starting dockerd (storage driver $driver), log $LOG"
        as_root sh -c "nohup dockerd --storage-driver=$driver >>'$LOG' 2>&1 & echo \$! > /tmp/rollhub-dockerd.pid"
        pid=$(cat /tmp/rollhub-dockerd.pid)
        if wait_for_engine "$pid"; then
            started=1
            break
        fi
        say "dockerd with $driver did not come up; last log lines:"
        tail -n 5 "$LOG" >&2 || true
        as_root kill "$pid" 2>/dev/null || true
        sleep 2
    done
    [ "$started" = 1 ] || fail "no Docker engine could be started (see $LOG)"
fi
say "engine up: $(docker info --format '{{.ServerVersion}} storage={{.Driver}} cgroup={{.CgroupVersion}}' 2>/dev/null)"

if ! docker image inspect rollhub/base:bookworm >/dev/null 2>&1; then
    say "building rollhub/base:bookworm (debootstrap, a few minutes)"
    python3 -m rollhub.cli sandbox build-base || fail "building the base image failed"
fi
say "rollhub/base:bookworm present"
# Start-up sweep: containers left by runs that died (SIGKILL, crashed CI jobs) on this host.
python3 -m rollhub.cli sandbox gc | sed 's/^/== setup_docker: /'
