# One image for every CacheRoute service (planner, collector, dispatcher, engine) and the CLI.
#   docker build -t cacheroute:local .
#   docker run --rm cacheroute:local cacheroute --help
# Without Docker Hub (air-gapped): scripts/local-images.sh builds a Debian base image with
# debootstrap and a wheelhouse with the host's pip, then
#   docker build --build-arg BASE_IMAGE=cacheroute-base:local --build-arg WHEELHOUSE=build/wheelhouse .
# Build arguments:
#   BASE_IMAGE  any image with python3 (>= 3.11) and its venv module (default python:3.11-slim)
#   WHEELHOUSE  a directory of wheels inside the build context; pip installs from it alone
#               (--no-index). Empty (default): from the package index.
# The package lives in a virtualenv at /opt/venv (on PATH), built in a first stage; the image
# runs as the unprivileged user cacheroute (uid 10001). Classic builder and BuildKit alike.
ARG BASE_IMAGE=python:3.11-slim

FROM ${BASE_IMAGE} AS build
ARG WHEELHOUSE=
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PATH=/opt/venv/bin:$PATH
# without a wheelhouse this copies pyproject.toml, which nothing reads: COPY needs a source
COPY ${WHEELHOUSE:-pyproject.toml} /wheels/
RUN python3 -m venv /opt/venv
WORKDIR /src
# the dependencies first, in their own layer (reused while only the source or the README
# changes): the project without its modules yet, an empty README for its metadata
COPY pyproject.toml ./
RUN if [ -n "$WHEELHOUSE" ]; then set -- --no-index --find-links /wheels; fi \
    && mkdir -p protos && touch README.md && pip install -q "$@" .
COPY README.md ./
COPY protos ./protos
COPY services ./services
COPY clients ./clients
RUN if [ -n "$WHEELHOUSE" ]; then set -- --no-index --find-links /wheels; fi \
    && pip install -q --no-deps --force-reinstall "$@" . \
    && cacheroute --help >/dev/null

FROM ${BASE_IMAGE}
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PATH=/opt/venv/bin:$PATH \
    CACHEROUTE_HOST=0.0.0.0 \
    CACHEROUTE_METRICS_HOST=0.0.0.0
# Services bind every interface inside the container; compose publishes the ports.
COPY --from=build /opt/venv /opt/venv
RUN useradd --create-home --uid 10001 cacheroute
USER cacheroute
WORKDIR /home/cacheroute
CMD ["cacheroute", "--help"]
