# The README's two commands are `make serve` and `make test`; everything else is a step of theirs.
PYTHON ?= python3.11
VENV ?= .venv
ACCEL ?= cpu            # cpu | gpu: which ONNX Runtime wheel to install
MODELS_DIR ?= models
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(strip $(ACCEL))
# checkov (the static policy check of k8s/, tests/unit/test_k8s_security.py) pins dozens of
# packages of its own: it lives in its own venv, never in the project's.
CHECKOV_VENV ?= .venv-checkov
CHECKOV_VERSION := 3.3.30
CHECKOV_STAMP := $(CHECKOV_VENV)/.installed-checkov-$(CHECKOV_VERSION)

.PHONY: install models test lint serve bench clean checkov

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip==25.3
	$(PY) -m pip install --quiet -e '.[$(strip $(ACCEL)),export,dev]'
	rm -f $(VENV)/.installed-*
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

lint: install
	$(VENV)/bin/ruff check deployments edge_sim edgectl tests benchmarks
	$(VENV)/bin/ruff format --check deployments edge_sim edgectl tests benchmarks
	$(VENV)/bin/mypy edge_sim deployments/runtime
	$(PY) -m deployments.k8s render --check

# pytest exits 5 when it collects nothing; that is not a failure of ours.
test: install models lint checkov
	$(PY) -m pytest tests; rc=$$?; if [ $$rc -eq 5 ]; then rc=0; fi; exit $$rc

serve: install models
	@echo "Router: http://127.0.0.1:8000  (OpenAI SDK: base_url=http://127.0.0.1:8000/v1; docs: /docs)"
	$(VENV)/bin/serve run serve_config.yaml

bench: install models
	$(PY) -m benchmarks.run

clean:
	rm -rf $(VENV) $(CHECKOV_VENV) $(MODELS_DIR)
