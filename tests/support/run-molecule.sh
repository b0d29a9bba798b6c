#!/usr/bin/env bash
# Run a molecule scenario of this collection against podman "nodes":
#
#     tests/support/run-molecule.sh [SCENARIO] [-- MOLECULE_TEST_ARGS...]
#     tests/support/run-molecule.sh node_prep
#     MOLECULE_COMMAND=converge tests/support/run-molecule.sh node_prep
#
# Builds the node image when missing (build_node_image.sh), points podman at
# the tests' containers.conf (podman-env.sh), puts .venv/bin first on PATH,
# uses the repository's ansible.cfg and runs `molecule test -s SCENARIO`
# (or MOLECULE_COMMAND) from the repository root, where molecule finds the
# collection's scenarios under extensions/molecule/. Exits with molecule's
# status.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)

SCENARIO=node_prep
if [[ $# -gt 0 && $1 != -- ]]; then
  SCENARIO=$1
  shift
fi
[[ ${1:-} == -- ]] && shift
COMMAND=${MOLECULE_COMMAND:-test}

log() { printf '[run-molecule %(%H:%M:%S)T] %s\n' -1 "$*" >&2; }

cd "$REPO"
[[ -f extensions/molecule/$SCENARIO/molecule.yml ]] || {
  log "no scenario extensions/molecule/$SCENARIO"
  exit 2
}

if [[ -d $REPO/.venv/bin ]]; then
  export PATH="$REPO/.venv/bin:$PATH"
fi
command -v molecule >/dev/null || { log "molecule not found (make venv?)"; exit 2; }

# FQCNs warmstart.snapshot.* resolve through ./.collections (see ansible.cfg).
if [[ ! -e .collections/ansible_collections/warmstart/snapshot ]]; then
  mkdir -p .collections/ansible_collections/warmstart
  ln -sfn ../../.. .collections/ansible_collections/warmstart/snapshot
fi
export ANSIBLE_CONFIG="$REPO/ansible.cfg"
export MOLECULE_PROJECT_DIRECTORY="$REPO"

# podman: the tests' containers.conf (runc, ulimits within the hard limits).
eval "$("$HERE/podman-env.sh" "$REPO/tests/output/podman")"
log "CONTAINERS_CONF=$CONTAINERS_CONF"

# The node image (skipped when it exists); its tag follows the host codename
# (WARMSTART_NODE_CODENAME overrides). WARMSTART_NODE_IMAGE, the image the
# scenarios start, may name another, existing image instead.
BUILT_IMAGE=$("$HERE/build_node_image.sh" --print-image)
export WARMSTART_NODE_IMAGE=${WARMSTART_NODE_IMAGE:-$BUILT_IMAGE}
if [[ $WARMSTART_NODE_IMAGE == "$BUILT_IMAGE" ]]; then
  "$HERE/build_node_image.sh"
fi
log "node image: $WARMSTART_NODE_IMAGE"

log "molecule $COMMAND -s $SCENARIO $*"
START=$SECONDS
rc=0
molecule "$COMMAND" -s "$SCENARIO" "$@" || rc=$?
log "molecule $COMMAND -s $SCENARIO: exit $rc after $((SECONDS - START))s"
exit "$rc"
