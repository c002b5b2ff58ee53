# The README's two commands are `make serve` and `make test`; everything else is a step of theirs.
PYTHON ?= python3.11
VENV ?= .venv
ACCEL ?= cpu            # cpu | gpu: which ONNX Runtime wheel to install
MODELS_DIR ?= models
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(strip $(ACCEL))

.PHONY: install models test lint serve bench clean

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip==25.3
	$(PY) -m pip install --quiet -e '.[$(strip $(ACCEL)),export,dev]'
	rm -f $(VENV)/.installed-*
	touch $@

models: install
	$(PY) -m deployments.export defaults --out $(MODELS_DIR)

lint: install
	$(VENV)/bin/ruff check deployments edge_sim edgectl tests benchmarks
	$(VENV)/bin/ruff format --check deployments edge_sim edgectl tests benchmarks
	$(VENV)/bin/mypy edge_sim deployments/runtime
	$(PY) -m deployments.k8s render --check

# pytest exits 5 when it collects nothing; that is not a failure of ours.
test: install models lint
	$(PY) -m pytest tests; rc=$$?; if [ $$rc -eq 5 ]; then rc=0; fi; exit $$rc

serve: install models
	@echo "Router: http://127.0.0.1:8000  (OpenAI SDK: base_url=http://127.0.0.1:8000/v1; docs: /docs)"
	$(VENV)/bin/serve run serve_config.yaml

bench: install models
	$(PY) -m benchmarks.run

clean:
	rm -rf $(VENV) $(MODELS_DIR)
