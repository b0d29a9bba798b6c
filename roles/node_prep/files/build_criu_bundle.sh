#!/usr/bin/env bash
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
#
# Build a self-contained CRIU bundle from a verified source tarball.
#
#   build_criu_bundle.sh SOURCE_TARBALL SOURCE_SHA256 PREFIX OUTPUT.tar.gz
#
# PREFIX is where nodes will install the bundle (the plugin dir is compiled
# in). The bundle holds:
#   bin/criu        wrapper that runs the bundled binary
#   libexec/criu    CRIU, with RPATH $ORIGIN/../lib
#   lib/            every shared library CRIU needs except glibc's own
#   lib/criu/       plugin dir (cuda_plugin.so)
#   python/pycriu/  pycriu built from the same source (pure Python + *_pb2.py)
#   BUNDLE.json     what was built, from what, on what; written last
# The output appears only when complete (written to a temp name, renamed).
set -euo pipefail

src=${1:?source tarball}; sha=${2:?source sha256}; prefix=${3:?install prefix}; out=${4:?output tarball}

log() { printf 'build_criu_bundle: %s\n' "$*" >&2; }
die() { log "$*"; exit 1; }

actual=$(sha256sum "$src" | cut -d' ' -f1)
[ "$actual" = "$sha" ] || die "checksum mismatch for $src: expected $sha, got $actual"
for tool in make gcc pkg-config protoc patchelf; do
    command -v "$tool" >/dev/null || die "$tool not found on the builder (install the build packages)"
done

work=$(mktemp -d "${TMPDIR:-/tmp}/criu-bundle.XXXXXX")
trap 'rm -rf "$work" "$out.partial"' EXIT
tar -xf "$src" -C "$work"
tree=$(find "$work" -mindepth 1 -maxdepth 1 -type d -name 'criu-*' | head -n1)
[ -n "$tree" ] || die "no criu-* directory in $src"

jobs=$(nproc 2>/dev/null || echo 2)
log "compiling $(basename "$tree") with $jobs jobs (log: $work/make.log)"
if ! make -C "$tree" -j"$jobs" PLUGINDIR="$prefix/lib/criu" criu lib cuda_plugin >"$work/make.log" 2>&1; then
    tail -n 40 "$work/make.log" >&2
    die "make failed (last 40 lines above)"
fi

stage=$work/bundle
mkdir -p "$stage/bin" "$stage/libexec" "$stage/lib/criu" "$stage/python"
install -m 0755 "$tree/criu/criu" "$stage/libexec/criu"
# DT_RPATH (not RUNPATH) so that it also covers the libraries' own dependencies.
# shellcheck disable=SC2016 # $ORIGIN is for the dynamic loader, not the shell
patchelf --force-rpath --set-rpath '$ORIGIN/../lib' "$stage/libexec/criu"
install -m 0755 "$tree/plugins/cuda/cuda_plugin.so" "$stage/lib/criu/"

# Bundle every resolved dependency except the C library family, which must
# come from the node (it is tied to the node's loader and kernel interface).
glibc_re='/(libc|libm|libpthread|libdl|librt|libresolv|libutil|ld-linux[^/]*)\.so'
ldd "$stage/libexec/criu" "$stage/lib/criu/cuda_plugin.so" \
    | awk '$2 == "=>" && $3 ~ /^\// {print $3}' | sort -u | grep -Ev "$glibc_re" \
    | while read -r lib; do cp -L "$lib" "$stage/lib/"; done
if ldd "$stage/libexec/criu" | grep -q 'not found'; then
    ldd "$stage/libexec/criu" >&2
    die "bundled criu has unresolved libraries"
fi

cp -r "$tree/lib/pycriu" "$stage/python/"
find "$stage/python" \( -name Makefile -o -name .gitignore -o -name '__pycache__' -o -name '*.pyc' \) -prune -exec rm -rf {} +

cat >"$stage/bin/criu" <<'WRAP'
#!/bin/sh
# warmstart CRIU bundle: run the bundled CRIU (its libraries are found via
# RPATH, its plugins in the compiled-in plugin dir). Works through symlinks.
here=$(dirname "$(readlink -f "$0")")
exec "$here/../libexec/criu" "$@"
WRAP
chmod 0755 "$stage/bin/criu"

version=$(env -i "$stage/bin/criu" --version | awk '/^Version:/ {print $2}')
[ -n "$version" ] || die "the bundled criu does not run: $(env -i "$stage/bin/criu" --version 2>&1 | tail -n 3)"

glibc=$(getconf GNU_LIBC_VERSION | awk '{print $2}')
libs=$(find "$stage/lib" -maxdepth 1 -name '*.so*' -printf '%f\n' | sort | paste -sd, -)
cat >"$stage/BUNDLE.json" <<JSON
{
  "format": 1,
  "criu_version": "$version",
  "source": "$(basename "$src")",
  "source_sha256": "$sha",
  "prefix": "$prefix",
  "arch": "$(uname -m)",
  "glibc": "$glibc",
  "builder": "$(hostname)",
  "built_at": "$(date -u +%Y-%m-%dT%H:%M:%SZ)",
  "libraries": "$libs",
  "plugins": "cuda_plugin.so"
}
JSON
mkdir -p "$(dirname "$out")"
tar -C "$stage" -czf "$out.partial" .
mv -f "$out.partial" "$out"
log "bundle ready: $out ($(du -h "$out" | cut -f1), criu $version, glibc >= $glibc)"
