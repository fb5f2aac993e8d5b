# One image for every CacheRoute service (planner, collector, dispatcher, engine) and the CLI.
#   docker build -t cacheroute:local .
#   docker run --rm cacheroute:local cacheroute --help
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /app
COPY pyproject.toml README.md ./
COPY protos ./protos
COPY services ./services
COPY clients ./clients
RUN pip install . \
    && useradd --create-home --uid 10001 cacheroute

# Services bind every interface inside the container; compose publishes the ports.
ENV CACHEROUTE_HOST=0.0.0.0 \
    CACHEROUTE_METRICS_HOST=0.0.0.0
USER cacheroute
CMD ["cacheroute", "--help"]
