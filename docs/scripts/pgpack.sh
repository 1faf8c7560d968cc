#!/usr/bin/env bash
# A PostgreSQL server and psycopg for the GPU machine, which has neither (the scale simulation
# with the database on cores of its own: docs/BENCHMARKS.md, "Scale by simulation").
# Usage: bash docs/scripts/pgpack.sh DEST_DIR      (then carry DEST_DIR beside .whl; about 8 MB)
# DEST_DIR gets psycopg's wheels for CPython 3.12 and pg.tar.xz: PostgreSQL 16's server, initdb and
# pg_ctl with their libraries and share files, taken from the pgserver wheel (a self-contained
# build). docs/scripts/postgres_here.sh starts it.
set -euo pipefail
dest=${1:?usage: pgpack.sh DEST_DIR}
mkdir -p "$dest"
dest=$(cd "$dest" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 -d "$work/wheels" psycopg==3.3.9 psycopg-binary==3.3.9 pgserver==0.1.4
cp "$work"/wheels/psycopg*.whl "$dest"/
python3 -c "import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])" \
  "$work"/wheels/pgserver-*.whl "$work/x"
install=$work/x/pgserver/pginstall
mkdir -p "$work/pack/pg/bin" "$work/pack/pg/lib" "$work/pack/libs"
cp "$install"/bin/{postgres,initdb,pg_ctl} "$work/pack/pg/bin/"
chmod +x "$work"/pack/pg/bin/*
cp -r "$install/lib/postgresql" "$work/pack/pg/lib/"
cp -r "$install/share" "$work/pack/pg/"
cp "$work"/x/pgserver.libs/libpq-*.so.* "$work/pack/libs/"
tar -C "$work/pack" -cJf "$dest/pg.tar.xz" pg libs
du -sh "$dest"; ls -l "$dest"
