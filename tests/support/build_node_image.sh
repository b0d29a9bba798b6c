#!/usr/bin/env bash
# Build the local podman image used as a test "node":
#
#     localhost/warmstart-node:<codename>
#
# A Debian minbase root filesystem made with debootstrap from the host's own
# Debian mirror (read from the host's apt configuration at run time, never
# written into this repository) and imported with `podman import`; no image
# registry is needed.
#
# The image holds what Ansible needs to manage the node over the
# containers.podman.podman connection (python3, python3-apt) and what CRIU
# needs at run time besides CRIU itself (iproute2, procps, ...). CRIU and
# python3-protobuf are deliberately absent: the node_prep role installs them.
#
# Cached: does nothing when the image exists with the current recipe version,
# unless --force. Safe to rerun after an interruption: the root filesystem is
# built in a temporary directory that is removed on exit, and leftovers of a
# killed run are removed by the next one.
#
# Usage: build_node_image.sh [--force] [--codename NAME] [--mirror URL]
#                            [--security-mirror URL] [--print-image]
#
# Environment: WARMSTART_NODE_CODENAME (default: VERSION_CODENAME of the
# host), WARMSTART_NODE_REPO (default: localhost/warmstart-node),
# WARMSTART_CACHE_DIR (default: ~/.cache/warmstart; keeps downloaded .debs),
# TMPDIR (where the root filesystem is built; default /var/tmp).
set -euo pipefail

# Bump when the package list or the image layout changes: an image built by
# an older recipe is rebuilt even without --force.
RECIPE_VERSION=2

PACKAGES=(
  python3          # Ansible modules, pycriu (installed by the role)
  python3-apt      # ansible.builtin.apt without auto-installing it
  ca-certificates  # https downloads by the role
  iproute2         # `ip`, used by CRIU for network namespaces
  procps           # ps/pgrep/sysctl for tests and debugging
  xz-utils         # unpacking .tar.xz bundles
)

IMAGE_REPO=${WARMSTART_NODE_REPO:-localhost/warmstart-node}
CODENAME=${WARMSTART_NODE_CODENAME:-}
FORCE=0
PRINT_IMAGE=0
MIRROR=""
SECURITY_MIRROR=""

log() { printf '[build_node_image %(%H:%M:%S)T] %s\n' -1 "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

usage() { sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"; }

while [[ $# -gt 0 ]]; do
  case $1 in
    --force) FORCE=1 ;;
    --codename) CODENAME=${2:?--codename needs a value}; shift ;;
    --codename=*) CODENAME=${1#*=} ;;
    --mirror) MIRROR=${2:?--mirror needs a value}; shift ;;
    --mirror=*) MIRROR=${1#*=} ;;
    --security-mirror) SECURITY_MIRROR=${2:?--security-mirror needs a value}; shift ;;
    --security-mirror=*) SECURITY_MIRROR=${1#*=} ;;
    --print-image) PRINT_IMAGE=1 ;;
    -h|--help) usage; exit 0 ;;
    *) usage >&2; die "unknown argument: $1" ;;
  esac
  shift
done

# shellcheck source=/dev/null
HOST_CODENAME=$( . /etc/os-release && echo "${VERSION_CODENAME:-}" )
CODENAME=${CODENAME:-$HOST_CODENAME}
[[ -n $CODENAME ]] || die "no VERSION_CODENAME in /etc/os-release; pass --codename"
IMAGE="$IMAGE_REPO:$CODENAME"

if [[ $PRINT_IMAGE == 1 ]]; then
  echo "$IMAGE"
  exit 0
fi

[[ $(id -u) == 0 ]] || die "must run as root (debootstrap and rootful podman)"
for tool in podman debootstrap tar flock; do
  command -v "$tool" >/dev/null || die "$tool not found"
done

image_recipe() {
  podman image inspect --format '{{ index .Labels "io.warmstart.node.recipe" }}' \
    "$IMAGE" 2>/dev/null || true
}

if [[ $FORCE == 0 ]] && podman image exists "$IMAGE"; then
  if [[ $(image_recipe) == "$RECIPE_VERSION" ]]; then
    log "image $IMAGE exists (recipe $RECIPE_VERSION); nothing to do (--force rebuilds)"
    exit 0
  fi
  log "image $IMAGE exists but was built by another recipe; rebuilding"
fi

# --- mirrors, from the host's apt configuration ---------------------------
#
# `apt-get indextargets` lists every configured repository whatever the file
# format (sources.list or deb822 .sources); the file parsers below are the
# fallback for an apt too old to have it.
apt_repos() {  # prints "URI SUITE COMPONENT" lines
  # shellcheck disable=SC2016  # $(...) are apt's format fields
  if apt-get indextargets --no-release-info \
       --format '$(TARGET_OF) $(SITE) $(RELEASE) $(COMPONENT)' 2>/dev/null \
       | awk '$1 == "deb" { print $2, $3, $4 }' | sort -u | grep .; then
    return 0
  fi
  local f
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
    [[ -r $f ]] || continue
    # deb [options] URI suite component...
    sed -e 's/#.*//' -e 's/\[[^]]*\]//' "$f" |
      awk '$1 == "deb" { for (i = 4; i <= NF; i++) print $2, $3, $i }'
  done
  for f in /etc/apt/sources.list.d/*.sources; do
    [[ -r $f ]] || continue
    awk '
      function flush(  u, s, c, nu, ns, nc, i, j, k, us, ss, cs) {
        if (types ~ /(^|[ \t])deb([ \t]|$)/ && enabled !~ /^[Nn]o/) {
          nu = split(uris, us); ns = split(suites, ss); nc = split(comps, cs)
          for (i = 1; i <= nu; i++) for (j = 1; j <= ns; j++) for (k = 1; k <= nc; k++)
            print us[i], ss[j], cs[k]
        }
        types = uris = suites = comps = enabled = ""
      }
      /^[ \t]*#/ { next }
      /^[ \t]*$/ { flush(); next }
      tolower($1) == "types:" { $1 = ""; types = $0 }
      tolower($1) == "uris:" { $1 = ""; uris = $0 }
      tolower($1) == "suites:" { $1 = ""; suites = $0 }
      tolower($1) == "components:" { $1 = ""; comps = $0 }
      tolower($1) == "enabled:" { enabled = $2 }
      END { flush() }' "$f"
  done
}

REPOS=$(apt_repos | sed 's#/ # #' | sort -u || true)
[[ -n $REPOS ]] || [[ -n $MIRROR ]] || die "no Debian repository in the host's apt configuration; pass --mirror"

# The main mirror serves the host's release itself; the security mirror serves
# "<release>-security" (or "<release>/updates" before bullseye).
if [[ -z $MIRROR ]]; then
  MIRROR=$(awk -v s="$HOST_CODENAME" '$2 == s { print $1; exit }' <<<"$REPOS")
  [[ -n $MIRROR ]] || MIRROR=$(awk '$2 !~ /[-\/]/ { print $1; exit }' <<<"$REPOS")
fi
[[ -n $MIRROR ]] || die "no main Debian mirror found in apt configuration; pass --mirror"
if [[ -z $SECURITY_MIRROR ]]; then
  SECURITY_MIRROR=$(awk '$2 ~ /-security$|\/updates$/ { print $1; exit }' <<<"$REPOS")
fi
# Components the host uses on the main mirror (main at least).
COMPONENTS=$(awk -v m="$MIRROR" '$1 == m { print $3 }' <<<"$REPOS" | sort -u | paste -sd, -)
COMPONENTS=${COMPONENTS:-main}
HAS_UPDATES=$(awk -v m="$MIRROR" '$1 == m && $2 ~ /-updates$/ { print "yes"; exit }' <<<"$REPOS")

KEYRING=/usr/share/keyrings/debian-archive-keyring.gpg
[[ -r $KEYRING ]] || die "$KEYRING missing (apt-get install debian-archive-keyring)"

# An apt proxy configured on the host is used by debootstrap too.
eval "$(apt-config shell APT_HTTP_PROXY Acquire::http::Proxy)"
if [[ -n ${APT_HTTP_PROXY:-} && -z ${http_proxy:-} ]]; then
  export http_proxy=$APT_HTTP_PROXY
fi

# --- build ------------------------------------------------------------------

CACHE_DIR=${WARMSTART_CACHE_DIR:-${HOME:-/root}/.cache/warmstart}
ARCH=$(dpkg --print-architecture)
DEB_CACHE="$CACHE_DIR/debootstrap/$CODENAME-$ARCH"
WORK_PARENT=${TMPDIR:-/var/tmp}
WORK_PREFIX="warmstart-node-$CODENAME."
mkdir -p "$DEB_CACHE" "$WORK_PARENT"

# One build per codename at a time; with the lock held, any work directory
# left under WORK_PARENT is from a killed run.
LOCK="$CACHE_DIR/build-$CODENAME.lock"
exec 9>"$LOCK"
if ! flock -n 9; then
  log "another build of $IMAGE is running; waiting for it"
  flock 9
  if [[ $FORCE == 0 ]] && podman image exists "$IMAGE" && [[ $(image_recipe) == "$RECIPE_VERSION" ]]; then
    log "image $IMAGE was built meanwhile; nothing to do"
    exit 0
  fi
fi

unmount_under() {  # unmount everything mounted below $1, deepest first
  local dir
  dir=$(realpath -m "$1")
  awk -v d="$dir/" 'index($2, d) == 1 { print $2 }' /proc/self/mounts |
    sort -r | while read -r m; do
      umount -l "$(printf '%b' "$m")" 2>/dev/null || true
    done
}

remove_workdir() {
  local dir=$1
  [[ -d $dir ]] || return 0
  unmount_under "$dir"
  # --one-file-system: never descend into anything still mounted.
  rm -rf --one-file-system "$dir" || log "WARNING: could not remove $dir"
}

for stale in "$WORK_PARENT/$WORK_PREFIX"*; do
  [[ -d $stale ]] || continue
  log "removing $stale (left by an interrupted build)"
  remove_workdir "$stale"
done

WORK=$(mktemp -d "$WORK_PARENT/${WORK_PREFIX}XXXXXX")
cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  remove_workdir "$WORK"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

ROOTFS="$WORK/rootfs"
mkdir "$ROOTFS"
START=$SECONDS

log "building $IMAGE ($ARCH) with debootstrap --variant=minbase"
log "mirror from host apt configuration: $MIRROR (components: $COMPONENTS)"
[[ -n $SECURITY_MIRROR ]] && log "security mirror: $SECURITY_MIRROR"
log "extra packages: ${PACKAGES[*]}"

DEBOOTSTRAP_LOG="$WORK/debootstrap.log"
# debootstrap prints one line per package and step; show only the stages.
show_stages() {
  local line
  while IFS= read -r line; do
    case $line in
      "I: "*" packages..."|"I: "*"base system"*|"I: Base system"*|"I: Retrieving Release"|"I: Resolving"*|"I: Checking"*) log "debootstrap: $line" ;;
      "I: "*) ;;
      *) log "debootstrap: $line" ;;
    esac
  done
}
if ! debootstrap --variant=minbase --arch="$ARCH" \
      --keyring="$KEYRING" --cache-dir="$DEB_CACHE" \
      --components="$COMPONENTS" \
      --include="$(IFS=,; echo "${PACKAGES[*]}")" \
      "$CODENAME" "$ROOTFS" "$MIRROR" 2>&1 </dev/null |
      tee "$DEBOOTSTRAP_LOG" | show_stages; then
  tail -n 40 "$DEBOOTSTRAP_LOG" >&2 || true
  [[ -f $ROOTFS/debootstrap/debootstrap.log ]] && tail -n 40 "$ROOTFS/debootstrap/debootstrap.log" >&2
  die "debootstrap failed (output above)"
fi
# Progress lines of debootstrap (I: ...) condensed to a count.
log "debootstrap done in $((SECONDS - START))s ($(grep -c '^I: ' "$DEBOOTSTRAP_LOG" || true) steps)"

log "configuring the root filesystem"
# Same mirror as the host, so the role can apt-get install on the node.
{
  echo "# Written by build_node_image.sh from the build host's apt configuration."
  echo "deb $MIRROR $CODENAME ${COMPONENTS//,/ }"
  [[ -n $HAS_UPDATES ]] && echo "deb $MIRROR $CODENAME-updates ${COMPONENTS//,/ }"
  if [[ -n $SECURITY_MIRROR ]]; then
    case $CODENAME in
      stretch|buster) echo "deb $SECURITY_MIRROR $CODENAME/updates ${COMPONENTS//,/ }" ;;
      *) echo "deb $SECURITY_MIRROR $CODENAME-security ${COMPONENTS//,/ }" ;;
    esac
  fi
} >"$ROOTFS/etc/apt/sources.list"
rm -f "$ROOTFS"/etc/apt/sources.list.d/*

if [[ -n ${APT_HTTP_PROXY:-} ]]; then
  printf 'Acquire::http::Proxy "%s";\n' "$APT_HTTP_PROXY" >"$ROOTFS/etc/apt/apt.conf.d/01proxy"
fi

# No daemons started by package scripts inside a container (as in Debian's
# official container images).
printf '#!/bin/sh\nexit 101\n' >"$ROOTFS/usr/sbin/policy-rc.d"
chmod 0755 "$ROOTFS/usr/sbin/policy-rc.d"

# Things podman provides at run time, and caches.
rm -f "$ROOTFS/etc/hostname" "$ROOTFS/etc/resolv.conf"
: >"$ROOTFS/etc/hosts"
rm -rf "$ROOTFS"/var/lib/apt/lists/* "$ROOTFS"/var/cache/apt/*.bin \
       "$ROOTFS"/var/cache/apt/archives/*.deb "$ROOTFS"/var/log/*.log \
       "$ROOTFS/debootstrap"
# Empty package lists must not look fresh: apt tools (ansible.builtin.apt
# with cache_valid_time) judge freshness by the mtime of the lists directory
# and would skip `apt-get update` on a node built within the hour.
touch -d @0 "$ROOTFS/var/lib/apt/lists"

OLD_ID=$(podman image inspect --format '{{.Id}}' "$IMAGE" 2>/dev/null || true)
log "packing and importing into podman"
tar --numeric-owner --xattrs --acls -C "$ROOTFS" -cf "$WORK/rootfs.tar" .
podman import --quiet \
  --change 'CMD ["/bin/sleep", "infinity"]' \
  --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change 'ENV LANG=C.UTF-8' \
  --change "LABEL io.warmstart.node.recipe=$RECIPE_VERSION" \
  --change "LABEL io.warmstart.node.codename=$CODENAME" \
  --change "LABEL io.warmstart.node.packages=${PACKAGES[*]}" \
  --message "warmstart test node ($CODENAME minbase)" \
  "$WORK/rootfs.tar" "$IMAGE" >/dev/null

if [[ -n $OLD_ID ]]; then
  # The previous build, now untagged; kept if a container still uses it.
  podman image rm "$OLD_ID" >/dev/null 2>&1 || true
fi

log "built $IMAGE in $((SECONDS - START))s ($(podman image inspect --format '{{.Size}}' "$IMAGE" | numfmt --to=iec) bytes)"
