# The README's two commands are `make serve` and `make test`; everything else is a step of theirs.
PYTHON ?= python3.11
VENV ?= .venv
ACCEL ?= cpu            # cpu | gpu: which ONNX Runtime wheel to install
MODELS_DIR ?= models
SERVE_CONFIG ?= serve_config.yaml
# An index with CPU-only torch wheels, for a machine whose index would bring the CUDA build:
#   make serve TORCH_INDEX=https://download.pytorch.org/whl/cpu
TORCH_INDEX ?=
PY := $(VENV)/bin/python
PIP := $(PY) -m pip install --quiet $(if $(strip $(TORCH_INDEX)),--extra-index-url $(strip $(TORCH_INDEX)))
# Two layers in one venv: serving (+ building the default models), then the tests' and
# operators' tools on top. `make serve` on a fresh clone installs only the first.
SERVE_STAMP := $(VENV)/.installed-serve-$(strip $(ACCEL))
DEV_STAMP := $(VENV)/.installed-dev-$(strip $(ACCEL))

.PHONY: install install-dev models test lint serve bench clean

install: $(SERVE_STAMP)
install-dev: $(DEV_STAMP)

$(SERVE_STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip==25.3
	$(PIP) -e '.[$(strip $(ACCEL)),export]'
	rm -f $(VENV)/.installed-*
	touch $@

$(DEV_STAMP): $(SERVE_STAMP)
	$(PIP) -e '.[$(strip $(ACCEL)),export,tools,dev]'
	touch $@

models: install
	$(PY) -m deployments.export defaults --out $(MODELS_DIR)

lint: install-dev
	$(VENV)/bin/ruff check deployments edge_sim edgectl tests benchmarks
	$(VENV)/bin/ruff format --check deployments edge_sim edgectl tests benchmarks
	$(VENV)/bin/mypy edge_sim edgectl deployments/runtime
	$(VENV)/bin/edge k8s render --check

# pytest's exit 5 (no tests collected) is a failure too: with 800+ tests, none means breakage.
test: install-dev models lint
	$(PY) -m pytest tests

serve: install models
	@echo "Router: http://127.0.0.1:8000  (OpenAI SDK: base_url=http://127.0.0.1:8000/v1; docs: /docs)"
	$(VENV)/bin/serve run $(SERVE_CONFIG)

bench: install-dev models
	$(PY) -m benchmarks.run

clean:
	rm -rf $(VENV) $(MODELS_DIR)
