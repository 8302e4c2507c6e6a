#!/bin/sh
# PostgreSQL first-start script of docker-compose.yml (mounted into /docker-entrypoint-initdb.d).
# One login role per component, each with only the privileges its component needs
# (docs/architecture.md#trust, NFR-12); passwords come from the generated deploy/compose.env, never from this file.
# Tables are created later by `payouts db migrate` as `migrator`; the default privileges below
# hand each component its own schema's tables as they appear.
set -eu
psql -v ON_ERROR_STOP=1 --username "$POSTGRES_USER" --dbname postgres \
  -v migrator_pw="$MIGRATOR_DB_PASSWORD" -v lock_pw="$LOCK_DB_PASSWORD" \
  -v railproxy_pw="$RAILPROXY_DB_PASSWORD" -v worker_pw="$WORKER_DB_PASSWORD" \
  -v outbox_pw="$OUTBOX_DB_PASSWORD" -v reader_pw="$READER_DB_PASSWORD" <<'SQL'
CREATE ROLE migrator LOGIN PASSWORD :'migrator_pw';
CREATE ROLE lock_server LOGIN PASSWORD :'lock_pw';
CREATE ROLE railproxy LOGIN PASSWORD :'railproxy_pw';
CREATE ROLE worker LOGIN PASSWORD :'worker_pw';
CREATE ROLE outbox LOGIN PASSWORD :'outbox_pw';
CREATE ROLE reader LOGIN PASSWORD :'reader_pw';
CREATE DATABASE payouts OWNER migrator;
REVOKE ALL ON DATABASE payouts FROM PUBLIC;
GRANT CONNECT ON DATABASE payouts TO lock_server, railproxy, worker, outbox, reader;
-- The lock server runs its schema's idempotent set-up at start (CREATE SCHEMA IF NOT EXISTS,
-- which checks the database privilege first): it may create schemas, and owns none but its own.
GRANT CREATE ON DATABASE payouts TO lock_server;
\connect payouts
REVOKE ALL ON SCHEMA public FROM PUBLIC;
SET ROLE migrator;
CREATE SCHEMA lockservice;
CREATE SCHEMA paydb;
CREATE SCHEMA railproxy;
RESET ROLE;
GRANT USAGE, CREATE ON SCHEMA lockservice TO lock_server;
GRANT USAGE ON SCHEMA railproxy TO railproxy;
GRANT USAGE ON SCHEMA paydb TO worker, outbox;
GRANT USAGE ON SCHEMA lockservice, paydb, railproxy TO reader;
ALTER DEFAULT PRIVILEGES FOR ROLE migrator IN SCHEMA lockservice
  GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO lock_server;
ALTER DEFAULT PRIVILEGES FOR ROLE migrator IN SCHEMA lockservice
  GRANT USAGE, SELECT, UPDATE ON SEQUENCES TO lock_server;
ALTER DEFAULT PRIVILEGES FOR ROLE migrator IN SCHEMA railproxy
  GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO railproxy;
ALTER DEFAULT PRIVILEGES FOR ROLE migrator IN SCHEMA railproxy
  GRANT USAGE, SELECT, UPDATE ON SEQUENCES TO railproxy;
ALTER DEFAULT PRIVILEGES FOR ROLE migrator IN SCHEMA paydb
  GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO worker, outbox;
ALTER DEFAULT PRIVILEGES FOR ROLE migrator IN SCHEMA paydb
  GRANT USAGE, SELECT, UPDATE ON SEQUENCES TO worker, outbox;
ALTER DEFAULT PRIVILEGES FOR ROLE migrator IN SCHEMA lockservice, paydb, railproxy
  GRANT SELECT ON TABLES TO reader;
SQL
