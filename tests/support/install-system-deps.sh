#!/usr/bin/env bash
# Install the system packages that the tests and the demo need on a Debian
# (12 or 13) machine. Idempotent: does nothing when everything is present.
# CRIU itself is NOT installed here: the node_prep role builds and installs it.
set -euo pipefail

packages=(
    podman runc uidmap slirp4netns fuse-overlayfs iptables   # test "nodes" and container workloads
    containerd                                               # the containerd runtime's tests (they start their own)
    catatonit                                                # podman run --init (a recommends, skipped above)
    debootstrap                                              # the local node image
    python3 python3-venv                                     # the interpreter modules run with
    shellcheck                                               # ansible-test sanity runs it on our scripts
    gcc libc6-dev                                            # the fake libcuda and the C workload the tests compile
    default-jre-headless                                     # ansible-rulebook (the node agent) runs on Java 17+
    default-jdk-headless nodejs                              # workloads in other languages (test_languages.py)
    zstd                                                     # podman's zstd checkpoint archives, read without python3-zstandard
    git make curl xz-utils ca-certificates
)

missing=()
for pkg in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed' || missing+=("$pkg")
done
if [ ${#missing[@]} -eq 0 ]; then
    exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
    echo "install-system-deps: missing packages (${missing[*]}); run as root or install them" >&2
    exit 1
fi
echo "install-system-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -q
apt-get install -y -q --no-install-recommends "${missing[@]}"
