#!/usr/bin/env bash
# CI's compose step (.ci/run calls it after `make install`): the stack in containers, for real.
#   1. a Docker daemon: the running one, else start `dockerd` (under nice; stopped again at the end)
#   2. the images without Docker Hub: scripts/local-images.sh (debootstrap base, wheelhouse,
#      cacheroute:local; each cached by content, so a re-run takes seconds)
#   3. scripts/compose_check.py: up, healthy, demo over gRPC and HTTP, plan roll, down -v
# Where Docker cannot run at all (no docker CLI, no daemon and no dockerd that starts) it
# prints one loud line and exits 0; otherwise any failure exits 1. PY: the Python with the
# package and the openai SDK (default .venv/bin/python).
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}

loud() { echo "ci: !!!!!!!! $* !!!!!!!!"; }
now() { date +%s; }
T0=$(now)

if ! command -v docker >/dev/null 2>&1; then
  loud "compose stack NOT run: no docker CLI on this machine (Debian: apt-get install docker.io)"; exit 0
fi
DOCKERD_PID=
stop_dockerd() {
  [ -n "$DOCKERD_PID" ] || return 0
  kill "$DOCKERD_PID" 2>/dev/null
  for _ in $(seq 60); do kill -0 "$DOCKERD_PID" 2>/dev/null || break; sleep 0.5; done
  echo "ci: stopped the dockerd this step started (pid $DOCKERD_PID)"
}
trap stop_dockerd EXIT
if ! docker info >/dev/null 2>&1; then
  if ! command -v dockerd >/dev/null 2>&1 || [ "$(id -u)" -ne 0 ]; then
    loud "compose stack NOT run: no Docker daemon, and no dockerd this user can start"; exit 0
  fi
  log=$(mktemp /tmp/cacheroute-dockerd.XXXXXX.log)
  # niced: containers inherit the daemon's priority, and other jobs share the machine
  nice -n 19 dockerd >"$log" 2>&1 &
  DOCKERD_PID=$!
  for _ in $(seq 60); do docker info >/dev/null 2>&1 && break; kill -0 "$DOCKERD_PID" 2>/dev/null || break; sleep 0.5; done
  if ! docker info >/dev/null 2>&1; then
    tail -n 5 "$log"
    loud "compose stack NOT run: dockerd would not start (log: $log)"; exit 0
  fi
  echo "ci: started dockerd (pid $DOCKERD_PID) in $(( $(now) - T0 )) s"
fi

T1=$(now)
if ! envs=$(NICE="nice -n 19" scripts/local-images.sh --env); then
  loud "compose stack FAILED: scripts/local-images.sh could not build the images"; exit 1
fi
eval "$envs"
T2=$(now)
echo "ci: images ready in $((T2 - T1)) s"

nice -n 19 "$PY" scripts/compose_check.py
rc=$?
echo "ci: compose step took $(( $(now) - T0 )) s (images $((T2 - T1)) s, stack $(( $(now) - T2 )) s)"
[ "$rc" -eq 0 ] || loud "compose stack FAILED (scripts/compose_check.py above)"
exit "$rc"
