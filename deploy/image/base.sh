#!/usr/bin/env bash
# The image's base, made offline from Debian's packages: a minimal bookworm (debootstrap
# --variant=minbase) with the libraries rudra-node links (fontconfig, freetype) and a font for
# the plots, trimmed of documentation and package lists, imported as rudra-base:bookworm.
# The root file system is cached as a tarball under target/ and the engine keeps the imported
# image, so a second build takes seconds.
#
#   deploy/image/base.sh [--force]      # --force: make the tarball again
set -euo pipefail
cd "$(dirname "$0")/../.."
tag=rudra-base:bookworm
cache=${RUDRA_BASE_CACHE:-target/rudra-base-bookworm.tar}
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
packages=libfontconfig1,fonts-dejavu-core,ca-certificates

if [ "${1:-}" = "--force" ]; then
    rm -f "$cache"
elif docker image inspect "$tag" >/dev/null 2>&1; then
    exit 0  # the engine already holds it
fi
if [ ! -f "$cache" ]; then
    if ! command -v debootstrap >/dev/null; then
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends debootstrap
    fi
    root=$(mktemp -d)
    trap 'rm -rf "$root"' EXIT
    echo "== debootstrap --variant=minbase bookworm (with $packages)"
    debootstrap --variant=minbase --include="$packages" bookworm "$root" "$mirror" >"$root.log" 2>&1 \
        || { tail -20 "$root.log"; exit 1; }
    rm -f "$root.log"
    # What a container never reads: documentation, manuals, translations, package lists.
    rm -rf "$root"/usr/share/doc/* "$root"/usr/share/man/* "$root"/usr/share/info/* \
        "$root"/usr/share/locale/* "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/* \
        "$root"/var/cache/debconf/*-old "$root"/var/log/*
    mkdir -p "$(dirname "$cache")"
    tar --numeric-owner -C "$root" -cf "$cache.tmp" .
    mv "$cache.tmp" "$cache"
fi
docker import "$cache" "$tag" >/dev/null
echo "== $tag from $cache ($(du -h "$cache" | cut -f1))"
