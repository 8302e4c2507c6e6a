#!/bin/sh
# One-shot `tls` job of docker-compose.yml: installs each service's own TLS certificate and key
# (issued by deploy/gen_env.py under deploy/secrets/tls/, mounted read-only at /src) into that
# service's volume /dst/<service>/ as cert.pem (0444) and key.pem (0400), owned by the uid the
# service's image runs as: a bind-mounted key keeps its host owner and mode 0600, which the
# service could not read, and PostgreSQL refuses a key readable by group or others. Each service
# mounts only its own volume, read-only, at /run/tls: no service sees another's key. The CA
# certificate is public and reaches every service as the compose secret `tls-ca`. Runs on every
# `up`, so a re-issued certificate reaches a service when it is recreated.
# Usage: install-tls.sh [SRC=/src] [DST=/dst] [UID] (tests/deploy runs it as itself, with UID:
# every file then owned by that uid instead of each image's).
set -eu
src=${1:-/src}
dst=${2:-/dst}
as=${3:-}
put() {  # put <service> <uid its image runs as> <certificate name under $src>
    owner=${as:-$2}
    install -d -o "$owner" -g "$owner" -m 0700 "$dst/$1"
    install -o "$owner" -g "$owner" -m 0444 "$src/$3.pem" "$dst/$1/cert.pem"
    install -o "$owner" -g "$owner" -m 0400 "$src/$3.key" "$dst/$1/key.pem"
}
# The project image (uid 10001): the HTTP servers; the lock server's certificate is also its
# etcd client certificate; the operator tool's is its etcd client certificate (bump-epoch). The
# workers' /metrics and /health (one certificate, one volume, for every replica) and the outbox
# publisher's /metrics.
put lock-server 10001 lock-server
put railstub 10001 railstub
put railproxy 10001 railproxy
put finledger 10001 finledger
put worker 10001 worker
put outbox 10001 outbox
put operator 10001 operator
# postgres:16.4 runs the server as uid 999 (postgres); the stand-in too.
put postgres 999 postgres
put temporal-postgres 999 temporal-postgres
# temporalio/auto-setup runs as uid 1000 (temporal); the stand-in too.
put temporal 1000 temporal
# The etcd image runs as root; each member's certificate is served to clients and presented
# to its peers.
put etcd-0 0 etcd-0
put etcd-1 0 etcd-1
put etcd-2 0 etcd-2
# prom/prometheus runs as nobody (65534): its etcd client certificate.
put prometheus 65534 prometheus
