#!/usr/bin/env bash
# Build the rudra-node image offline, from a clean checkout:
#
#   deploy/image/build.sh [--binary PATH] [--tag TAG]
#
# Without --binary it builds the release binary first (cargo build --release). The base comes
# from deploy/image/base.sh; the binary is stripped of debug information on the way in.
set -euo pipefail
cd "$(dirname "$0")/../.."
binary=""
tag=rudra-node:latest
while [ $# -gt 0 ]; do
    case "$1" in
        --binary) binary=$2; shift 2 ;;
        --tag) tag=$2; shift 2 ;;
        *) echo "usage: $0 [--binary PATH] [--tag TAG]" >&2; exit 2 ;;
    esac
done
if [ -z "$binary" ]; then
    cargo build --release --locked --bin rudra-node
    binary=target/release/rudra-node
fi
deploy/image/base.sh
context=target/image-context
rm -rf "$context"
mkdir -p "$context/data"
objcopy --strip-debug "$binary" "$context/rudra-node"
cp -r data/mnist "$context/data/mnist"
cp -r configs "$context/configs"
docker build --quiet --tag "$tag" --file deploy/image/Dockerfile "$context" >/dev/null
rm -rf "$context"
size=$(docker image inspect --format '{{.Size}}' "$tag")
echo "== built $tag: $((size / 1000000)) MB"
