#!/bin/sh
# The stand-in's entrypoint (see Containerfile): the official image's contract, reduced to what
# docker-compose.yml uses. Started as root: owns the data directory, then re-runs as postgres.
# `postgres -c ssl=on -c ssl_cert_file=F -c ssl_key_file=K ...`: the server on its Unix socket
# only, and PostgreSQL's TLS front (python -m stack.pgtls) on 0.0.0.0:5432 with F and K.
set -eu
if [ "$(id -u)" = 0 ]; then
    mkdir -p "$PGDATA"
    chown -R postgres:postgres "$PGDATA" /var/run/postgresql
    chmod 0700 "$PGDATA"
    exec setpriv --reuid=postgres --regid=postgres --init-groups /bin/sh "$0" "$@"
fi
: "${POSTGRES_PASSWORD:?POSTGRES_PASSWORD is required (the official image refuses without it too)}"
POSTGRES_USER=${POSTGRES_USER:-postgres}
POSTGRES_DB=${POSTGRES_DB:-$POSTGRES_USER}
export POSTGRES_USER POSTGRES_DB PGHOST=/var/run/postgresql
if [ ! -s "$PGDATA/PG_VERSION" ]; then
    pwfile=$(mktemp)
    printf '%s\n' "$POSTGRES_PASSWORD" > "$pwfile"
    initdb --username="$POSTGRES_USER" --pwfile="$pwfile" --encoding=UTF8 --locale=C.UTF-8 \
        --auth-local=trust --auth-host=scram-sha-256 -D "$PGDATA" >/dev/null
    rm -f "$pwfile"
    # Like the official image: password logins from every address (the compose network).
    echo "host all all all scram-sha-256" >> "$PGDATA/pg_hba.conf"
    pg_ctl -D "$PGDATA" -o "-c listen_addresses='' -k /var/run/postgresql" -w start >/dev/null
    if [ "$POSTGRES_DB" != postgres ]; then
        psql -v ON_ERROR_STOP=1 --username "$POSTGRES_USER" --dbname postgres \
            -c "CREATE DATABASE \"$POSTGRES_DB\"" >/dev/null
    fi
    for f in /docker-entrypoint-initdb.d/*; do
        case "$f" in
            *.sh) echo "running $f"; . "$f" ;;
            *.sql) echo "running $f"; psql -v ON_ERROR_STOP=1 --username "$POSTGRES_USER" -f "$f" ;;
            *) ;;
        esac
    done
    pg_ctl -D "$PGDATA" -m fast -w stop >/dev/null
    echo "PostgreSQL init process complete; ready for start up."
fi
if [ "${1:-}" != postgres ]; then
    exec "$@"
fi
shift
# `-c ssl=on` with ssl_cert_file/ssl_key_file (docker-compose.yml): pgserver's build has no SSL,
# so those settings go to the TLS front instead, and the server listens on its socket only.
ssl=off cert= key= opts=
while [ $# -gt 0 ]; do
    if [ "$1" = -c ] && [ $# -ge 2 ]; then
        case "$2" in
            ssl=on) ssl=on ;;
            ssl_cert_file=*) cert=${2#ssl_cert_file=} ;;
            ssl_key_file=*) key=${2#ssl_key_file=} ;;
            ssl=* | ssl_*) ;;
            *) opts="$opts -c $2" ;;
        esac
        shift 2
    else
        opts="$opts $1"
        shift
    fi
done
if [ "$ssl" != on ]; then
    # shellcheck disable=SC2086 # the options are words, as given
    exec postgres -c listen_addresses='*' -k /var/run/postgresql $opts
fi
: "${cert:?ssl=on needs -c ssl_cert_file=...}" "${key:?ssl=on needs -c ssl_key_file=...}"
# Connections from the front arrive on the socket: there, too, every login needs its password,
# replication's too (initdb's `local ... trust` rules were for the first-start scripts only).
sed -i 's/^\(local\s.*\s\)trust$/\1scram-sha-256/' "$PGDATA/pg_hba.conf"
# shellcheck disable=SC2086
postgres -c listen_addresses='' -k /var/run/postgresql $opts &
server=$!
trap 'kill -TERM "$server" 2>/dev/null; kill -TERM "$front" 2>/dev/null' TERM INT
until pg_isready -q -h /var/run/postgresql; do
    kill -0 "$server" 2>/dev/null || { wait "$server"; exit 1; }
    sleep 0.5
done
python -m stack.pgtls --listen 0.0.0.0:5432 --upstream-socket /var/run/postgresql/.s.PGSQL.5432 \
    --cert-file "$cert" --key-file "$key" &
front=$!
# Either one ending ends the container (its restart policy restarts both).
while kill -0 "$server" 2>/dev/null && kill -0 "$front" 2>/dev/null; do
    sleep 1
done
kill -TERM "$server" "$front" 2>/dev/null || true
wait "$server" 2>/dev/null || true
wait "$front" 2>/dev/null || true
exit 1
