#!/bin/sh
# PostgreSQL first-start script of docker-compose.yml (mounted into /docker-entrypoint-initdb.d).
# Creates only the database the migrate job needs. The roles are the migrations' own
# (common/db_roles.py, docs/database-roles.md): `payouts db migrate`, run by the migrate job
# with the superuser's DSN, creates payouts_lockservice, payouts_railproxy, payouts_paydb,
# payouts_outbox, payouts_reconciler and payouts_checker, grants each CONNECT and only its own
# statements, and sets their passwords from DB_ROLE_PASSWORDS_DIR. No password is in this file.
# It also makes every login over TCP a TLS one: the image's own rule for the network (`host all
# all all scram-sha-256`, written before this script runs) becomes `hostssl`, so a plaintext
# login is refused (the server runs with ssl=on, docker-compose.yml). The stand-in has no TCP
# listener of its own (its TLS front takes the port), so there the edit changes nothing.
set -eu
if [ -n "${PGDATA:-}" ] && [ -f "$PGDATA/pg_hba.conf" ]; then
    sed -i 's/^host\(\s\+all\s\+all\s\+all\s\+scram-sha-256\)$/hostssl\1/' "$PGDATA/pg_hba.conf"
fi
psql -v ON_ERROR_STOP=1 --username "$POSTGRES_USER" --dbname postgres <<'SQL'
CREATE DATABASE payouts;
-- Nobody but the roles migrate grants CONNECT to (and the superuser) may connect.
REVOKE ALL ON DATABASE payouts FROM PUBLIC;
\connect payouts
REVOKE ALL ON SCHEMA public FROM PUBLIC;
SQL
