#!/usr/bin/env bash
# Pack this machine's PostgreSQL (Debian's packages) into one file that starts on a host
# without it, such as the GPU host, so that the benchmarks there run on PostgreSQL too.
#   bench/portable_postgres.sh OUT.tar.xz          (here)
#   tar xJf OUT.tar.xz -C /tmp && /tmp/pgdist/up.sh 5432   (there; as root it runs the
#   server as nobody, with PostgreSQL's default settings, trust auth, user postgres)
# The libraries it links beyond the C library go with it; the host needs a glibc at least
# as new as this machine's.
set -euo pipefail
out=$(realpath "$1")
ver=$(ls /usr/lib/postgresql | sort -n | tail -1)
tmp=$(mktemp -d)
dist=$tmp/pgdist
mkdir -p "$dist/usr/lib/postgresql/$ver/bin" "$dist/usr/lib/postgresql/$ver/lib" \
  "$dist/usr/share/postgresql" "$dist/deps"
cp /usr/lib/postgresql/"$ver"/bin/{postgres,initdb,pg_ctl} "$dist/usr/lib/postgresql/$ver/bin/"
cp /usr/lib/postgresql/"$ver"/lib/{plpgsql.so,dict_snowball.so} "$dist/usr/lib/postgresql/$ver/lib/"
cp -r "/usr/share/postgresql/$ver" "$dist/usr/share/postgresql/"
for f in "$dist"/usr/lib/postgresql/"$ver"/bin/* "$dist"/usr/lib/postgresql/"$ver"/lib/*.so; do
  ldd "$f" | awk '/=>/ {print $3}'
done | sort -u | grep -v -E '/(libc|libm|libpthread|libdl|librt)\.so|ld-linux' \
  | xargs -I{} cp -L {} "$dist/deps/"
cat > "$dist/up.sh" <<UP
#!/bin/sh
# Start a throwaway PostgreSQL $ver from this folder on 127.0.0.1:\${1:-5432}.
set -e
here=\$(cd "\$(dirname "\$0")" && pwd)
port=\${1:-5432}
export LD_LIBRARY_PATH=\$here/deps
bin=\$here/usr/lib/postgresql/$ver/bin
data=/tmp/pgdata-\$port
rm -rf "\$data"; mkdir -p "\$data"; chmod 700 "\$data"; chmod -R a+rX "\$here"
run() {
  if [ "\$(id -u)" = 0 ]; then
    chown nobody "\$data"
    setpriv --reuid=65534 --regid=65534 --clear-groups env LD_LIBRARY_PATH="\$LD_LIBRARY_PATH" "\$@"
  else "\$@"; fi
}
run "\$bin/initdb" -D "\$data" -U postgres -A trust -E UTF8 --no-locale >/tmp/pginit-\$port.log 2>&1 \
  || { cat /tmp/pginit-\$port.log; exit 1; }
run "\$bin/pg_ctl" -D "\$data" -l /tmp/pg-\$port.log -w start \
  -o "-p \$port -k /tmp -c listen_addresses=127.0.0.1 -c max_connections=200"
UP
chmod +x "$dist/up.sh"
tar cJf "$out" -C "$tmp" pgdist
rm -rf "$tmp"
ls -la "$out"
