#!/bin/sh
# The stand-in's server (see Containerfile). Without TEMPORAL_TLS_FRONTEND_CERT: the dev server on
# 0.0.0.0:7233, plain gRPC. With it (and TEMPORAL_TLS_FRONTEND_KEY, auto-setup's own variables):
# the dev server on 127.0.0.1:7234 and its metrics on 127.0.0.1:9091, unreachable from the
# network, and HAProxy in front: TLS on 0.0.0.0:7233 (the certificate and key given, TLS 1.2+,
# ALPN h2 for gRPC) and the metrics, plain HTTP as auto-setup's PROMETHEUS_ENDPOINT serves them,
# on 0.0.0.0:9090. Either process ending ends the container.
set -eu
db=/var/lib/temporal/temporal.db
if [ -z "${TEMPORAL_TLS_FRONTEND_CERT:-}" ]; then
    exec temporal server start-dev --ip 0.0.0.0 --port 7233 --headless --metrics-port 9090 \
        --db-filename "$db" --log-level warn
fi
: "${TEMPORAL_TLS_FRONTEND_KEY:?TEMPORAL_TLS_FRONTEND_CERT needs TEMPORAL_TLS_FRONTEND_KEY}"
conf=$(mktemp -d)
# HAProxy takes the certificate and its key as one PEM: made here, 0600, in the container's /tmp.
umask 077
cat "$TEMPORAL_TLS_FRONTEND_CERT" "$TEMPORAL_TLS_FRONTEND_KEY" > "$conf/frontend.pem"
cat > "$conf/haproxy.cfg" <<CFG
global
    log stdout format raw local0 notice
    ssl-default-bind-options ssl-min-ver TLSv1.2
defaults
    mode tcp
    log global
    timeout connect 5s
    # gRPC long polls (a worker's poll waits up to 70 s) and streams: idle for long on purpose
    timeout client 10m
    timeout server 10m
frontend temporal_grpc
    bind 0.0.0.0:7233 ssl crt $conf/frontend.pem alpn h2
    default_backend dev_server
backend dev_server
    server dev 127.0.0.1:7234
frontend temporal_metrics
    bind 0.0.0.0:9090
    default_backend dev_metrics
backend dev_metrics
    server metrics 127.0.0.1:9091
CFG
temporal server start-dev --ip 127.0.0.1 --port 7234 --headless --metrics-port 9091 \
    --db-filename "$db" --log-level warn &
server=$!
haproxy -db -f "$conf/haproxy.cfg" &
front=$!
trap 'kill -TERM "$server" "$front" 2>/dev/null' TERM INT
while kill -0 "$server" 2>/dev/null && kill -0 "$front" 2>/dev/null; do
    sleep 1
done
kill -TERM "$server" "$front" 2>/dev/null || true
wait "$server" 2>/dev/null || true
wait "$front" 2>/dev/null || true
exit 1
