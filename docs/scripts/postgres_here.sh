#!/usr/bin/env bash
# Start a throwaway PostgreSQL on 127.0.0.1:PORT (trust auth, database `test`) from a pack made by
# docs/scripts/pgpack.sh, as on the CPU machine. For the GPU machine; as root it runs the server
# as `nobody` (PostgreSQL refuses root).
# Usage: bash docs/scripts/postgres_here.sh PACK_DIR [PORT]     (stop: pg_ctl -D /tmp/pg_here/data stop)
set -euo pipefail
pack=$(cd "${1:?usage: postgres_here.sh PACK_DIR [PORT]}" && pwd)
port=${2:-5432}
root=/tmp/pg_here
rm -rf "$root" && mkdir -p "$root"
tar -C "$root" -xJf "$pack/pg.tar.xz"
mkdir -p "$root/data" && chmod -R a+rX "$root"
as=()
if [ "$(id -u)" = 0 ]; then
  chown nobody "$root/data"
  as=(setpriv --reuid=nobody --regid="$(id -gn nobody)" --clear-groups)
fi
run() { (cd /tmp && "${as[@]}" env LD_LIBRARY_PATH="$root/libs" "$@"); }
run "$root/pg/bin/initdb" -D "$root/data" -U postgres --auth=trust --encoding=utf8 --no-sync >/dev/null
run "$root/pg/bin/pg_ctl" -D "$root/data" -l "$root/data/server.log" -w \
  -o "-p $port -k $root/data -c listen_addresses=127.0.0.1" start >/dev/null
run "$root/pg/bin/postgres" --version
python3 -c "import psycopg, sys; psycopg.connect(sys.argv[1], autocommit=True).execute('CREATE DATABASE test')" \
  "postgresql://postgres@127.0.0.1:$port/postgres"
echo "postgresql://postgres@127.0.0.1:$port/test"
