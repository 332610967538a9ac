#!/usr/bin/env bash
# The Compose cluster's CA and join tokens, made once before `docker-compose up`:
#
#   deploy/compose/init.sh [--project NAME] [--image IMAGE] [--env-file FILE] [--ttl 24h]
#
# makes the volumes NAME_ca (ca.pem, ca.key: the scheduler's) and NAME_trust (ca.pem alone:
# every other node's), and writes FILE (default deploy/compose/.env) with the project name, the
# image and a shard and a learner join token. An existing CA is kept; tokens are new each time.
set -euo pipefail
cd "$(dirname "$0")/../.."
project=rudra
image=rudra-node:latest
env_file=deploy/compose/.env
ttl=24h
while [ $# -gt 0 ]; do
    case "$1" in
        --project) project=$2; shift 2 ;;
        --image) image=$2; shift 2 ;;
        --env-file) env_file=$2; shift 2 ;;
        --ttl) ttl=$2; shift 2 ;;
        *) echo "usage: $0 [--project NAME] [--image IMAGE] [--env-file FILE] [--ttl 24h]" >&2; exit 2 ;;
    esac
done
docker volume create "${project}_ca" >/dev/null
docker volume create "${project}_trust" >/dev/null
run() {
    docker run --rm --network none -v "${project}_ca:/var/lib/rudra/ca" \
        -v "${project}_trust:/var/lib/rudra/trust" "$@"
}
if ! run --entrypoint test "$image" -f /var/lib/rudra/ca/ca.key; then
    run "$image" cert init --dir /var/lib/rudra/ca >/dev/null
fi
run --entrypoint cp "$image" /var/lib/rudra/ca/ca.pem /var/lib/rudra/trust/ca.pem
# Every node that starts without its certificate takes a use: a few restarts' worth.
shard=$(run "$image" cert token --dir /var/lib/rudra/ca --role shard --ttl "$ttl" --uses 16)
learner=$(run "$image" cert token --dir /var/lib/rudra/ca --role learner --ttl "$ttl" --uses 256)
cat >"$env_file" <<ENV
COMPOSE_PROJECT_NAME=$project
RUDRA_IMAGE=$image
SHARD_TOKEN=$shard
LEARNER_TOKEN=$learner
ENV
echo "== ${project}_ca and ${project}_trust ready; tokens in $env_file"
