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
# Two layers in one venv: serving, building the default models and the operator's `edge` command
# (the `tools` extra: whoever runs the platform gets the command that operates it), then the
# tests' tools on top. `make serve` on a fresh clone installs only the first.
SERVE_STAMP := $(VENV)/.installed-serve-$(strip $(ACCEL))
DEV_STAMP := $(VENV)/.installed-dev-$(strip $(ACCEL))
# checkov (the static policy check of k8s/, tests/unit/test_k8s_security.py) pins dozens of
# packages of its own: it lives in its own venv, never in the project's.
CHECKOV_VENV ?= .venv-checkov
CHECKOV_VERSION := 3.3.30
CHECKOV_STAMP := $(CHECKOV_VENV)/.installed-checkov-$(CHECKOV_VERSION)

.PHONY: install install-dev system-deps models models-large test lint serve bench clean checkov dashboard-screenshot

install: $(SERVE_STAMP)
install-dev: $(DEV_STAMP)

$(SERVE_STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip==25.3
	$(PIP) -e '.[$(strip $(ACCEL)),export,tools]'
	rm -f $(VENV)/.installed-*
	touch $@

$(DEV_STAMP): $(SERVE_STAMP)
	$(PIP) -e '.[$(strip $(ACCEL)),export,tools,dev,otel]'
	touch $@

checkov: $(CHECKOV_STAMP)

$(CHECKOV_STAMP):
	test -x $(CHECKOV_VENV)/bin/python || $(PYTHON) -m venv $(CHECKOV_VENV)
	$(CHECKOV_VENV)/bin/python -m pip install --quiet --upgrade pip==25.3
	$(CHECKOV_VENV)/bin/python -m pip install --quiet checkov==$(CHECKOV_VERSION)
	rm -f $(CHECKOV_VENV)/.installed-checkov-*
	touch $@

models: install
	$(PY) -m deployments.export defaults --out $(MODELS_DIR)

# GLM-4 and Kimi-K2 stand-ins at size (real vocabularies, >= 300M parameters; docs/models.md):
# minutes and a few GB of memory, so not part of `make serve`.
MODELS_LARGE_DIR ?= models-large
models-large: install
	$(PY) -m deployments.export large --out $(MODELS_LARGE_DIR)

lint: install-dev
	$(VENV)/bin/ruff check deployments edge_sim edgectl tests benchmarks
	$(VENV)/bin/ruff format --check deployments edge_sim edgectl tests benchmarks
	$(VENV)/bin/mypy edge_sim edgectl deployments benchmarks
	$(VENV)/bin/edge k8s render --check
	$(PY) -m deployments.observability.grafana render --check

# The Debian packages the tests drive (.ci/system-packages.sh holds the list): as root, what is
# missing is installed; otherwise it stops at once, naming the `sudo apt-get install` to run.
system-deps:
	@.ci/system-packages.sh

# pytest's exit 5 (no tests collected) is a failure too: with 800+ tests, none means breakage.
test: system-deps install-dev models lint checkov
	$(PY) -m pytest tests

# Ray Serve's switches are serve_config.yaml's controller_options: `serve run` from any shell (or
# on a cluster you started yourself with a plain `ray start`) applies them, no environment needed.
serve: install models
	@echo "Router: http://127.0.0.1:8000  (OpenAI SDK: base_url=http://127.0.0.1:8000/v1; docs: /docs)"
	$(VENV)/bin/serve run $(SERVE_CONFIG)

# The picture of /dashboard in docs/, from a running router (`EDGE_ADMIN_KEY=... make serve`)
# with the system's headless Chromium (apt-get install chromium).
DASHBOARD_URL ?= http://127.0.0.1:8000
dashboard-screenshot: install-dev
	$(PY) -m deployments.ingress.dashboard.screenshot --url $(DASHBOARD_URL) --out docs/dashboard.png

bench: install-dev models
	$(PY) -m benchmarks.run

clean:
	rm -rf $(VENV) $(CHECKOV_VENV) $(MODELS_DIR)
