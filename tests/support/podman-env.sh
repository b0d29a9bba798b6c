#!/usr/bin/env bash
# Write the tests' containers.conf, with nofile/nproc ulimits fitted to the
# hard limits of this shell, into DIR and print the shell line that makes
# podman use it:
#
#     eval "$(tests/support/podman-env.sh [DIR])"
#
# DIR defaults to tests/output/podman in this checkout. The template is
# tests/support/containers.conf next to this script.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
DIR=${1:-$REPO/tests/output/podman}
TEMPLATE=$HERE/containers.conf

fit() {  # fit HARD_LIMIT CAP -> the smaller
  local hard=$1 cap=$2
  if [[ $hard == unlimited ]] || (( hard > cap )); then
    echo "$cap"
  else
    echo "$hard"
  fi
}

# nofile: podman's own default; huge values slow down programs that close
# every fd.
NOFILE=$(fit "$(ulimit -Hn)" 1048576)
# nproc: rootful podman 4.3 lowers its own RLIMIT_NPROC to 32768 at start
# (strace shows setrlimit(RLIMIT_NPROC, 32768) where the hard limit allows),
# and runc, its child, cannot raise it again: 32768 at most.
NPROC=$(fit "$(ulimit -Hu)" 32768)

mkdir -p "$DIR"
DIR=$(cd "$DIR" && pwd)
CONF="$DIR/containers.conf"
TMP=$(mktemp "$CONF.XXXXXX")
trap 'rm -f "$TMP"' EXIT
sed -E "s/^default_ulimits = .*/default_ulimits = [\"nofile=$NOFILE:$NOFILE\", \"nproc=$NPROC:$NPROC\"]/" \
  "$TEMPLATE" >"$TMP"
grep -q "^default_ulimits = \[\"nofile=$NOFILE:" "$TMP" || {
  echo "podman-env.sh: no default_ulimits line in $TEMPLATE" >&2
  exit 1
}
chmod 0644 "$TMP"
mv -f "$TMP" "$CONF"
trap - EXIT

printf 'export CONTAINERS_CONF=%q\n' "$CONF"
