#!/bin/sh
# Make a Docker engine answer, for the `docker` sandbox backend.
#
# Does nothing when an engine already answers. Otherwise, as root: installs
# docker.io with apt-get when dockerd is missing, starts dockerd in the
# background (its log under the system temp dir) and waits up to
# $DOCKER_WAIT_S seconds (default 60) for it to answer. Without root and
# without an engine it says why and fails. The last line it prints on failure
# is the reason, so a caller can quote it.
#
# The check goes through the Python docker SDK in $PY (default
# .venv/bin/python) when that has it, else through /usr/bin/docker: a
# different `docker` earlier on PATH (/usr/local/bin/docker on some images)
# is not the Docker CLI.
set -eu

PY=${PY:-.venv/bin/python}
WAIT_S=${DOCKER_WAIT_S:-60}
LOG="${TMPDIR:-/tmp}/factory-dockerd.log"

say() { echo "docker-engine: $*"; }
fail() { echo "docker-engine: $*" >&2; exit 1; }

engine_answers() {
    if [ -x "$PY" ] && "$PY" -c 'import docker' >/dev/null 2>&1; then
        "$PY" -c 'import docker; docker.from_env(timeout=5).ping()' >/dev/null 2>&1
    elif [ -x /usr/bin/docker ]; then
        /usr/bin/docker info >/dev/null 2>&1
    else
        return 1
    fi
}

find_dockerd() {
    command -v dockerd 2>/dev/null && return 0
    for candidate in /usr/sbin/dockerd /usr/bin/dockerd; do
        [ -x "$candidate" ] && { echo "$candidate"; return 0; }
    done
    return 1
}

if engine_answers; then
    say "a Docker engine answers"
    exit 0
fi

if [ "$(id -u)" != 0 ]; then
    fail "no Docker engine answers and this is not root, so none can be started here (start dockerd, or join the docker group)"
fi

if ! dockerd=$(find_dockerd); then
    command -v apt-get >/dev/null 2>&1 || fail "dockerd is not installed and there is no apt-get to install docker.io"
    say "installing docker.io"
    if ! { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker.io; }; then
        fail "apt-get could not install docker.io"
    fi
    dockerd=$(find_dockerd) || fail "docker.io is installed but dockerd is not found"
fi

# A dockerd that is already running but not answering yet is waited for, not doubled.
if pgrep -x dockerd >/dev/null 2>&1; then
    say "dockerd is running; waiting for it to answer"
else
    say "starting $dockerd (log: $LOG)"
    if command -v setsid >/dev/null 2>&1; then
        setsid "$dockerd" >"$LOG" 2>&1 </dev/null &
    else
        nohup "$dockerd" >"$LOG" 2>&1 </dev/null &
    fi
fi

waited=0
while [ "$waited" -lt "$WAIT_S" ]; do
    if engine_answers; then
        say "a Docker engine answers (after ${waited} s)"
        exit 0
    fi
    sleep 1
    waited=$((waited + 1))
done

if [ -s "$LOG" ]; then
    echo "docker-engine: last lines of $LOG:" >&2
    tail -n 5 "$LOG" >&2
fi
fail "dockerd did not answer within ${WAIT_S} s (log: $LOG)"
