#!/bin/sh
# Installs mmaplock-prof from this tarball (made by `cargo xtask dist`):
#   bin/mmaplock-prof                   -> $PREFIX/bin/mmaplock-prof
#   deploy/systemd/mmaplock-prof.service -> /etc/systemd/system/mmaplock-prof.service
#   README.md, docs/*.md                -> $PREFIX/share/doc/mmaplock-prof/
# and prints the next steps; it starts nothing. PREFIX defaults to /usr/local. DESTDIR, if
# set, is prepended to every destination (staged installs, packaging; then root is not needed).
# Run it again to upgrade: the binary is replaced, not overwritten in place, so a running
# agent is unaffected until it is restarted.
set -eu

here=$(cd "$(dirname "$0")" && pwd)
prefix=${PREFIX:-/usr/local}
destdir=${DESTDIR:-}
unit_dir=/etc/systemd/system

if [ -z "$destdir" ] && [ "$(id -u)" -ne 0 ]; then
    echo "install.sh: run as root (sudo $0), or set DESTDIR for a staged install" >&2
    exit 1
fi

bin="$prefix/bin/mmaplock-prof"
doc="$prefix/share/doc/mmaplock-prof"

install -d "$destdir$prefix/bin" "$destdir$unit_dir" "$destdir$doc"
install -m 0755 "$here/bin/mmaplock-prof" "$destdir$bin"
# The unit names /usr/local; follow PREFIX.
sed -e "s#/usr/local/bin/mmaplock-prof#$bin#g" \
    -e "s#/usr/local/share/doc/mmaplock-prof#$doc#g" \
    "$here/deploy/systemd/mmaplock-prof.service" > "$destdir$unit_dir/mmaplock-prof.service.tmp"
chmod 0644 "$destdir$unit_dir/mmaplock-prof.service.tmp"
mv "$destdir$unit_dir/mmaplock-prof.service.tmp" "$destdir$unit_dir/mmaplock-prof.service"
install -m 0644 "$here/README.md" "$destdir$doc/"
for f in "$here"/docs/*.md; do
    [ -f "$f" ] && install -m 0644 "$f" "$destdir$doc/"
done

echo "installed $destdir$bin"
echo "installed $destdir$unit_dir/mmaplock-prof.service"
echo "installed $destdir$doc/"
cat <<EOF

Next steps:
  1. Check that this host can run it (Linux 5.15+ with BTF; a 2-second system-wide run):
       sudo $bin -d 2
  2. Start the agent (a dynamic user holding only CAP_BPF, CAP_PERFMON, CAP_SYS_PTRACE and
     CAP_DAC_READ_SEARCH; see $doc/privileges.md):
       sudo systemctl daemon-reload
       sudo systemctl enable --now mmaplock-prof
       curl -s http://127.0.0.1:9464/metrics | head
     Options (selection, --listen, -o): sudo systemctl edit mmaplock-prof
  3. Point Prometheus and Grafana at it, from this tarball ($here):
       deploy/prometheus/  recording and alerting rules (promtool check rules ...)
       deploy/grafana/     the dashboard, to import into Grafana
EOF
if [ -z "$destdir" ] && [ ! -d /run/systemd/system ]; then
    echo
    echo "note: systemd is not running on this host: start the agent some other way, e.g."
    echo "  $bin agent --listen 127.0.0.1:9464"
fi
