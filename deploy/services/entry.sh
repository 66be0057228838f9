#!/bin/sh
# One of the compose deployment's stateful services, in the foreground:
#   postgres   a cluster in /data (made on first start), password auth from the network
#   redis      no persistence (Lethe's queue is rebuilt from the database)
#   s3         SeaweedFS's S3 gateway, one identity from S3_ACCESS_KEY / S3_SECRET_KEY
set -eu
case "${1:-}" in
  postgres)
    install -d -o postgres -g postgres -m 700 /data/pg
    if [ ! -s /data/pg/PG_VERSION ]; then
      printf '%s' "${POSTGRES_PASSWORD:?}" > /tmp/pw
      chown postgres /tmp/pw
      su postgres -c "initdb -D /data/pg -U postgres --pwfile=/tmp/pw --auth-local=trust --auth-host=scram-sha-256 -E UTF8" >/dev/null
      rm -f /tmp/pw
      echo "listen_addresses = '*'" >> /data/pg/postgresql.conf
      echo "host all all 0.0.0.0/0 scram-sha-256" >> /data/pg/pg_hba.conf
      su postgres -c "pg_ctl -D /data/pg -o '-c listen_addresses=' -w start" >/dev/null
      su postgres -c "psql -q -c 'CREATE DATABASE ${POSTGRES_DB:-lethe}'"
      su postgres -c "pg_ctl -D /data/pg -w stop" >/dev/null
    fi
    install -d -o postgres -g postgres /var/run/postgresql
    exec su postgres -c "exec postgres -D /data/pg"
    ;;
  redis)
    exec redis-server --bind 0.0.0.0 --protected-mode no --save "" --appendonly no
    ;;
  s3)
    mkdir -p /data/s3
    printf '{"identities":[{"name":"lethe","credentials":[{"accessKey":"%s","secretKey":"%s"}],"actions":["Admin","Read","Write","List","Tagging"]}]}' \
      "${S3_ACCESS_KEY:?}" "${S3_SECRET_KEY:?}" > /tmp/s3.json
    exec weed server -dir=/data/s3 -ip=127.0.0.1 -ip.bind=0.0.0.0 -s3 -filer -s3.port=8333 \
      -s3.config=/tmp/s3.json -master.volumeSizeLimitMB=64 -volume.max=100 -metricsPort=0 \
      -s3.port.iceberg=0 -s3.port.lance=0
    ;;
  *)
    echo "usage: lethe-service postgres|redis|s3" >&2
    exit 2
    ;;
esac
