#!/usr/bin/env bash
# Builds, once, the local stand-in for the `rayproject/ray` base image and for `postgres:15`, where no
# image registry is reachable (tests/deploy/deploy_stack.py, `make test-deploy`). Prints the two image names.
#   docker/standin/build-base.sh PYTHON          PYTHON: the interpreter whose Ray/torch the base must hold
# The base is Debian 12 (debootstrap; Python 3.11 as in the real py311 image), a non-root user `ray`
# (uid 1000, group users, home /home/ray) who owns the Python environment on PATH, as in the real image,
# and Ray, torch and every other requirement of mocolab[cluster] at the versions PYTHON has. Its pip
# installs offline (no index; setuptools and wheel in /opt/wheelhouse) so docker/Dockerfile's install step
# finds everything present, as it does on the real base plus torch. PostgreSQL 15 is in it too: the
# postgres stand-in is the same root file system with an entrypoint that reads the official image's
# POSTGRES_USER / POSTGRES_PASSWORD / POSTGRES_DB.
# Cached by a key over this folder and the pinned versions: a second run prints the names and returns.
# Run it under `nice -n 19 ionice -c3`: it unpacks several GB of wheels.
set -euo pipefail
python="${1:?usage: build-base.sh PYTHON}"
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
cache="${MOCOLAB_STANDIN_CACHE:-/var/cache/mocolab-standin}"
mirror="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
mkdir -p "$cache"
# What a build from nothing holds on disk at its peak, in GiB (measured: docker/README.md), with room for the
# images built on it. Refused before any work where less is free.
need_gb="${MOCOLAB_STANDIN_NEED_GB:-15}"

pins="$(mktemp)"; trap 'rm -f "$pins"' EXIT
"$python" "$here/pins.py" "$repo" > "$pins"
sum() { cat "$@" | sha256sum | cut -c1-12; }
wheels_key="$(sum "$pins")"                                   # the wheels: only the versions
rootfs_key="$(sum "$pins" "$here/rootfs-setup.sh")"           # the file system: versions and recipe
key="$(echo "$rootfs_key" | sum - "$here/build-base.sh" "$here/base.Containerfile" "$here/postgres.Containerfile" \
       "$here/postgres-entrypoint.sh" "$repo/pyproject.toml")"
base="localhost/mocolab-standin-base:$key"
postgres="localhost/mocolab-standin-postgres:$key"
if podman image exists "$base" && podman image exists "$postgres"; then
  echo "$base $postgres"; exit 0
fi
# 1-3: the root file system image, where podman does not hold it yet
rootfs="$cache/rootfs-$rootfs_key"
rootfs_image="localhost/mocolab-standin-rootfs:$rootfs_key"
wheels="$cache/wheels-$wheels_key"
if command -v zstd >/dev/null; then zip=(zstd -q -T0 -1); ext=zst; else zip=(gzip -1); ext=gz; fi
tarball="$cache/rootfs-$rootfs_key.tar.$ext"
free_gb() { df -P --block-size=1G "$1" | awk 'NR == 2 { print $4 }'; }
if ! podman image exists "$rootfs_image"; then
  graph="$(podman info --format '{{.Store.GraphRoot}}')"; mkdir -p "$graph"
  for dir in "$cache" "$graph"; do
    if (( $(free_gb "$dir") < need_gb )); then
      echo "build-base.sh: $(free_gb "$dir") GiB free on the file system of $dir; building the stand-in from" \
           "nothing needs about $need_gb GiB there (MOCOLAB_STANDIN_CACHE moves the cache)" >&2
      exit 3
    fi
  done
  if [ ! -e "$tarball" ] && [ ! -e "$rootfs/.complete" ]; then
    # 1. Debian 12 with Python 3.11 and PostgreSQL 15
    debian="$cache/debian12"
    if [ ! -e "$debian/.complete" ]; then
      rm -rf "$debian.partial"
      debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates,procps,netbase,postgresql-15 \
        bookworm "$debian.partial" "$mirror" >&2
      touch "$debian.partial/.complete"; rm -rf "$debian"; mv "$debian.partial" "$debian"
    fi
    # 2. the wheels at the pinned versions, built or fetched by PYTHON's pip (it knows this machine's indexes)
    if [ ! -e "$wheels/.complete" ]; then
      mkdir -p "$wheels"
      "$python" -m pip wheel -q --no-deps -w "$wheels" -r "$pins" 2> >(grep -v "is ignored: it is neither" >&2)
      "$python" -m pip download -q --no-deps -d "$wheels/wheelhouse" 'setuptools>=77' wheel 2> >(grep -v "is ignored" >&2)
      cp "$pins" "$wheels/pins.txt"
      touch "$wheels/.complete"
    fi
    # 3. the root file system: Debian plus rootfs-setup.sh run inside it
    rm -rf "$rootfs"; cp -a "$debian" "$rootfs"; rm -f "$rootfs/.complete"
    mkdir -p "$rootfs/tmp/wheels" "$rootfs/opt/wheelhouse"
    cp "$wheels"/wheelhouse/*.whl "$rootfs/opt/wheelhouse/"
    cp "$here/rootfs-setup.sh" "$rootfs/tmp/rootfs-setup.sh"
    cleanup() { umount "$rootfs/proc" 2>/dev/null || true; umount "$rootfs/tmp/wheels" 2>/dev/null || true; rm -f "$pins"; }
    trap cleanup EXIT
    mount --bind "$wheels" "$rootfs/tmp/wheels"
    mount -t proc proc "$rootfs/proc"
    chroot "$rootfs" /bin/bash /tmp/rootfs-setup.sh >&2
    cleanup; trap 'rm -f "$pins"' EXIT
    rmdir "$rootfs/tmp/wheels"; rm -f "$rootfs/tmp/rootfs-setup.sh"
    touch "$rootfs/.complete"
  fi
  rm -rf "$wheels"                                             # installed in the root file system now
  # ... imported as an image, compressed, and the tree removed before podman copies the tar into its storage:
  # the tree, the tar and the image layer (about 7 GB each) never lie on the disk uncompressed at once.
  if [ ! -e "$tarball" ]; then
    tar -C "$rootfs" --exclude=./.complete -c . | "${zip[@]}" > "$tarball.partial"
    mv "$tarball.partial" "$tarball"
  fi
  rm -rf "$rootfs"
  podman import \
    --change 'USER ray' --change 'WORKDIR /home/ray' --change 'ENV HOME=/home/ray' \
    --change 'ENV PATH=/home/ray/python/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'CMD ["bash"]' "$tarball" "$rootfs_image" >&2
fi
rm -rf "$rootfs" "$wheels" "$tarball"                          # the image holds them now
# 4. the base: the project's build requirements beside pip (docker/Dockerfile builds mocolab offline), and
#    the postgres stand-in
podman image rm -f "$base" "$postgres" >/dev/null 2>&1 || true
house="$cache/wheelhouse-$key"
rm -rf "$house"; mkdir -p "$house"
"$python" -c 'import sys, tomllib; print("\n".join(tomllib.load(open(sys.argv[1], "rb"))["build-system"]["requires"]))' \
  "$repo/pyproject.toml" > "$house/requires.txt"
"$python" -m pip download -q -d "$house" -r "$house/requires.txt" 2> >(grep -v "is ignored" >&2)
podman build --isolation chroot --runtime runc -q -f "$here/base.Containerfile" --build-arg "ROOTFS=$rootfs_image" \
  -t "$base" "$house" >&2
podman build --isolation chroot --runtime runc -q -f "$here/postgres.Containerfile" --build-arg "BASE=$base" \
  -t "$postgres" "$repo" >&2
echo "$base $postgres"
