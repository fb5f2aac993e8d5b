#!/usr/bin/env bash
# Build CacheRoute's container images without Docker Hub (air-gapped clusters, CI machines).
#
#   scripts/local-images.sh            # base image, wheelhouse, cacheroute:local
#   eval "$(scripts/local-images.sh --env)"   # the same, then export the compose variables
#   docker-compose up -d
#
# Three steps, each cached by content and skipped when its inputs did not change:
#   1. base image  cacheroute-base:<key> (also tagged cacheroute-base:local): a Debian root
#      filesystem with python3, python3-venv and redis-server, made by
#      `debootstrap --variant=minbase` from a Debian mirror and turned into an image with
#      `docker import`. key = hash of suite, mirror, packages and this recipe's version.
#      Needs root (debootstrap) and a running Docker daemon.
#   2. wheelhouse  build/wheelhouse/: every wheel the image needs (pyproject's dependencies,
#      setuptools and wheel for building the package), fetched by the HOST's pip (its index,
#      proxy and certificates are set up; a container's are not) for the base image's Python
#      and glibc, binary wheels only. key = hash of pyproject.toml and the target tags.
#   3. cacheroute:local  `docker build --build-arg BASE_IMAGE=cacheroute-base:<key>
#      --build-arg WHEELHOUSE=build/wheelhouse`: pip installs from the wheelhouse alone
#      (--no-index). Docker's layer cache makes an unchanged rebuild a few seconds.
#
# Settings (environment): CACHEROUTE_DEBIAN_SUITE (bookworm), CACHEROUTE_DEBIAN_MIRROR
# (http://deb.debian.org/debian), CACHEROUTE_IMAGE (cacheroute:local), PIP (the host's pip
# command; default .venv/bin/python -m pip if .venv exists, else python3 -m pip), NICE (prefix
# for the heavy commands, e.g. "nice -n 19"). Exit status: 0 when every image exists, 1 on a
# failed step, 2 when a tool is missing (one line saying which and how to get it).
set -euo pipefail
cd "$(dirname "$0")/.."

RECIPE=1      # bump when the base image recipe below changes
WH_RECIPE=2   # bump when the wheelhouse recipe changes
SUITE=${CACHEROUTE_DEBIAN_SUITE:-bookworm}
MIRROR=${CACHEROUTE_DEBIAN_MIRROR:-http://deb.debian.org/debian}
PACKAGES=python3,python3-venv,redis-server
IMAGE=${CACHEROUTE_IMAGE:-cacheroute:local}
WHEELHOUSE=build/wheelhouse
NICE=${NICE:-}
EMIT_ENV=0
[ "${1:-}" = "--env" ] && EMIT_ENV=1

say() { echo "local-images: $*" >&2; }
missing() { say "missing: $1"; exit 2; }
sha() { sha256sum | cut -c1-16; }
now() { date +%s; }

# --- tools --------------------------------------------------------------------------------
command -v docker >/dev/null 2>&1 || missing "docker (the Docker CLI; Debian: apt-get install docker.io)"
docker info >/dev/null 2>&1 || missing "a running Docker daemon (start one as root: dockerd >/tmp/dockerd.log 2>&1 &)"
if [ -z "${PIP:-}" ]; then
  if [ -x .venv/bin/python ]; then PIP=".venv/bin/python -m pip"; else PIP="python3 -m pip"; fi
fi
$PIP --version >/dev/null 2>&1 || missing "pip on the host ($PIP; Debian: apt-get install python3-pip, or set PIP=...)"
HOST_PY=${PIP% -m pip}
[ "$HOST_PY" != "$PIP" ] || HOST_PY=python3
$HOST_PY -c 'import tomllib' 2>/dev/null || missing "Python >= 3.11 on the host to read pyproject.toml ($HOST_PY)"

# --- 1. base image ------------------------------------------------------------------------
base_key=$(printf '%s\n' "$RECIPE" "$SUITE" "$MIRROR" "$PACKAGES" "$(uname -m)" | sha)
BASE=cacheroute-base:$base_key
if docker image inspect "$BASE" >/dev/null 2>&1; then
  say "base image $BASE exists (cached)"
else
  command -v debootstrap >/dev/null 2>&1 || missing "debootstrap (Debian: apt-get install debootstrap)"
  [ "$(id -u)" -eq 0 ] || missing "root for debootstrap (run as root or with sudo)"
  t0=$(now)
  root=$(mktemp -d /tmp/cacheroute-base.XXXXXX)
  trap 'rm -rf "$root"' EXIT
  say "debootstrap $SUITE ($PACKAGES) from $MIRROR ..."
  if ! $NICE debootstrap --variant=minbase --include="$PACKAGES" "$SUITE" "$root/fs" "$MIRROR" \
      >"$root/debootstrap.log" 2>&1; then
    tail -n 20 "$root/debootstrap.log" >&2
    say "debootstrap failed (log above)"; exit 1
  fi
  # what an image does not need: the package cache and lists, docs, man pages, locales
  rm -rf "$root"/fs/var/cache/apt/archives/*.deb "$root"/fs/var/lib/apt/lists/* \
    "$root"/fs/usr/share/doc/* "$root"/fs/usr/share/man/* "$root"/fs/usr/share/locale/* \
    "$root"/fs/etc/resolv.conf "$root"/fs/etc/hostname
  t1=$(now)
  $NICE tar -C "$root/fs" --numeric-owner -c . | docker import \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8' \
    --change 'CMD ["/bin/bash"]' \
    --message "cacheroute base: debootstrap $SUITE $PACKAGES (recipe $RECIPE)" - "$BASE" >/dev/null
  rm -rf "$root"; trap - EXIT
  say "base image $BASE built: debootstrap $((t1 - t0)) s, docker import $(( $(now) - t1 )) s"
fi
docker tag "$BASE" cacheroute-base:local

# --- 2. wheelhouse ------------------------------------------------------------------------
# the base image's Python and glibc decide which wheels it can install
read -r pyver glibc machine < <(docker run --rm --network none "$BASE" python3 -c \
  'import platform, sys; print(f"{sys.version_info[0]}{sys.version_info[1]}", platform.libc_ver()[1], platform.machine())')
[ -n "${machine:-}" ] || { say "could not run python3 in $BASE (docker run failed)"; exit 1; }
glibc_minor=${glibc#*.}
platforms=()
for ((m = glibc_minor; m >= 17; m--)); do platforms+=(--platform "manylinux_2_${m}_${machine}"); done
platforms+=(--platform "manylinux2014_${machine}")
mapfile -t deps < <($HOST_PY -c 'import tomllib; print(*tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"], sep="\n")')
build_reqs=("setuptools>=68" "wheel")
wh_key=$( (cat pyproject.toml; echo "recipe $WH_RECIPE cp$pyver glibc$glibc $machine") | sha)
if [ -f "$WHEELHOUSE/.key" ] && [ "$(cat "$WHEELHOUSE/.key")" = "$wh_key" ]; then
  say "wheelhouse $WHEELHOUSE is current (cached, key $wh_key)"
else
  t0=$(now)
  rm -rf "$WHEELHOUSE"; mkdir -p "$WHEELHOUSE"
  say "wheelhouse for cp$pyver, glibc $glibc, $machine with the host's pip ($PIP) ..."
  fetch() {   # pip download REQUIREMENT... into the wheelhouse, for the base image's tags
    if ! $NICE $PIP download -q --only-binary=:all: --dest "$WHEELHOUSE" \
        --python-version "$pyver" --implementation cp --abi "cp$pyver" --abi abi3 --abi none \
        "${platforms[@]}" "$@" >build/pip-download.log 2>&1; then
      tail -n 20 build/pip-download.log >&2
      say "pip download failed (log above): every dependency needs a binary wheel for cp$pyver/$machine"; exit 1
    fi
  }
  fetch "${deps[@]}" "${build_reqs[@]}"
  # The host's pip evaluates environment markers for ITS interpreter (e.g. redis needs
  # async-timeout only below Python 3.11.3), so resolve offline in the base image itself and
  # fetch whatever it reports missing, until nothing is.
  printf '%s\n' "${deps[@]}" "${build_reqs[@]}" >"$WHEELHOUSE/.requirements"
  resolved=0
  for _ in 1 2 3 4 5 6 7 8; do
    if out=$(docker run --rm --network none -v "$PWD/$WHEELHOUSE:/wheels:ro" "$BASE" sh -c \
        'python3 -m venv /tmp/v && /tmp/v/bin/pip install -q --dry-run --no-index --find-links /wheels -r /wheels/.requirements' 2>&1); then
      resolved=1; break
    fi
    missing_req=$(printf '%s\n' "$out" | sed -n 's/.*No matching distribution found for \([^;]*\).*/\1/p' | head -n 1)
    [ -n "$missing_req" ] || { printf '%s\n' "$out" >&2; say "the offline resolve in $BASE failed (above)"; exit 1; }
    say "  the image also needs $missing_req"
    fetch "$missing_req"
  done
  [ "$resolved" -eq 1 ] || { say "the wheelhouse still misses wheels after 8 rounds"; exit 1; }
  echo "$wh_key" >"$WHEELHOUSE/.key"
  say "wheelhouse built: $(ls "$WHEELHOUSE"/*.whl | wc -l) wheels in $(( $(now) - t0 )) s"
fi

# --- 3. cacheroute:local ------------------------------------------------------------------
t0=$(now)
say "docker build $IMAGE (FROM $BASE, offline from $WHEELHOUSE) ..."
mkdir -p build
if ! $NICE docker build --force-rm -t "$IMAGE" --build-arg BASE_IMAGE="$BASE" --build-arg WHEELHOUSE="$WHEELHOUSE" . \
    >build/docker-build.log 2>&1; then
  tail -n 30 build/docker-build.log >&2
  say "docker build failed (log above, all of it in build/docker-build.log)"
  exit 1
fi
say "$IMAGE built in $(( $(now) - t0 )) s"

if [ "$EMIT_ENV" -eq 1 ]; then
  echo "export CACHEROUTE_IMAGE=$IMAGE CACHEROUTE_REDIS_IMAGE=$BASE"
  echo "export CACHEROUTE_BASE_IMAGE=$BASE CACHEROUTE_WHEELHOUSE=$WHEELHOUSE"
fi
