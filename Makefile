# Two commands do everything on a fresh machine with Python 3.10+: `make demo` and `make test`.
# Set-up is a virtualenv in .venv with the exact versions of requirements.lock; it reruns only when the
# lock file or pyproject.toml changes.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
DEMO := artifacts/demo
export PATH := $(abspath $(BIN)):$(PATH)

.PHONY: demo test test-all lint format bench clean setup matrix handoff

setup: $(STAMP)

# uv (pinned in the lock file, installed first by pip) installs the lock file: 95 s from a cold cache against
# pip's 272 s on 2 cores, bytecode compiled by both (benchmarks/raw/setup_install.json). It reads its own
# settings (UV_INDEX_URL, ~/.config/uv), not pip's.
$(STAMP): requirements.lock pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade "pip>=24"
	$(BIN)/python -m pip install --quiet "$$(grep '^uv==' requirements.lock)"
	$(BIN)/uv pip install --quiet --compile-bytecode --python $(BIN)/python -r requirements.lock
	$(BIN)/python -m pip install --quiet --no-deps --no-build-isolation -e .
	@touch $(STAMP)

# The main job on the embedded default: synthetic speakers -> train notebook -> infer notebook -> score.
demo: $(STAMP)
	$(BIN)/python -m pipeline data synthetic --out $(DEMO)/data --overwrite
	$(BIN)/papermill --log-output notebooks/train.ipynb $(DEMO)/train.out.ipynb \
		-p data_dir $(DEMO)/data -p artifact_dir $(DEMO)/model
	$(BIN)/papermill notebooks/infer.ipynb $(DEMO)/infer.out.ipynb \
		-p data_dir $(DEMO)/data -p artifact_dir $(DEMO)/model -p submission_path $(DEMO)/submission.csv
	$(BIN)/python -m pipeline score --submission $(DEMO)/submission.csv --solution $(DEMO)/data/solution.csv

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: $(STAMP)
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .
	$(BIN)/jupytext --sync notebooks/*.ipynb

# The suite a change must pass. Tests marked `extended` repeat on other shapes what this suite already guards
# (pyproject.toml's markers say which); `make test-all` runs them too. Two pytest workers take the test modules
# in turn, a module whole so that its fixtures are built once: most tests wait on one busy thread (a notebook's
# kernel, XLA's compiler, a rank), which left the second of this machine's 2 cores idle. OMP_WAIT_POLICY=PASSIVE
# (for the workers and every process they start): torch's OpenMP threads otherwise spin while they wait, and
# two processes' spinning threads took each other's cores. On 2 cores: serial 864 s; two workers 1074 s
# spinning (twice the CPU time), 581 s passive (benchmarks/raw/fresh_clone_workers.json,
# make_test_workers_passive.log). `make test PYTEST_WORKERS=0` runs serially. The 25 slowest tests are listed
# at the end: what to make cheaper, or mark extended, when `.ci/run` nears its 20 minutes.
PYTEST_WORKERS ?= 2
PYTEST := OMP_WAIT_POLICY=PASSIVE $(BIN)/python -m pytest -n $(PYTEST_WORKERS) --dist loadscope
test: lint
	$(PYTEST) -q -ra -m "not extended" --durations=25

test-all: lint
	$(PYTEST) -q -ra

bench: $(STAMP)
	$(BIN)/python -m benchmarks.run

# The version matrix (pipeline/tooling/versions.py): Kaggle's TPU image trains an artifact that Kaggle's GPU image
# predicts from offline, plus the floor of pyproject's ranges and the newest they allow; each leg in a fresh
# venv under .matrix/ (uv's cache: about 7 GB per torch build, downloaded once). MATRIX_ARGS="--only LEG --keep".
matrix: $(STAMP)
	$(BIN)/python -m matrix.run $(MATRIX_ARGS)

# CI's part of the matrix: Kaggle's TPU image trains the artifact on 8 XLA CPU devices, its training exporting
# the ONNX files; Kaggle's GPU image predicts from it offline, and SpeechBrain and ONNX Runtime on those files
# agree (2.4 min in benchmarks/raw/fresh_clone.json's .ci/run, ~2 more with a cold uv cache).
handoff: $(STAMP)
	$(BIN)/python -m matrix.run --handoff

clean:
	rm -rf artifacts/demo benchmarks/out .pytest_cache
