#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
from __future__ import annotations

DOCUMENTATION = r"""
module: fleet_key
short_description: Make the fleet's snapshot signing key once, and return its public half
version_added: 0.1.0
description:
  - Makes an Ed25519 signing key (PEM, PKCS8) at O(path) when there is none, like C(ssh-keygen) makes a
    user's SSH key, and returns its public key and key id. An existing key is never replaced.
  - Runs where the key is kept, usually the controller (C(delegate_to=localhost), C(run_once=true)).
    The C(warmstart.snapshot.prepare_nodes) playbook does so through P(warmstart.snapshot.node_prep#role)
    to sign snapshots by default; use this module directly to make the key ahead of time or to read its public half.
  - The key file is created exclusively (C(O_EXCL), never through a symlink) with mode C(0600); a key
    that group or others can read is refused, not used.
author:
  - warmstart developers (!UNKNOWN)
requirements:
  - Python library C(cryptography) where the module runs.
extends_documentation_fragment:
  - warmstart.snapshot.attributes.no_diff
  - warmstart.snapshot.attributes
attributes:
  check_mode:
    support: full
    description: Says whether a key would be made (then RV(key_id) and RV(public_key) are null); makes nothing.
  platform:
    support: full
    platforms: posix
    description: Where the key is kept, usually the controller.
options:
  path:
    description:
      - The private key file. Its directory is made (mode C(0700)) when missing.
    type: path
    default: ~/.config/warmstart/fleet-signing.key
"""

EXAMPLES = r"""
- name: Make the fleet signing key on the controller (once)
  warmstart.snapshot.fleet_key:
  delegate_to: localhost
  run_once: true
  register: fleet

- name: Show the key id the snapshots will name
  ansible.builtin.debug:
    msg: "snapshots are signed by {{ fleet.key_id }}"
"""

RETURN = r"""
path:
  description: The private key file.
  returned: always
  type: str
  sample: /home/ops/.config/warmstart/fleet-signing.key
key_id:
  description: The key id signatures name (first 16 hex digits of the SHA256 of the raw public key); null in
    check mode when no key exists yet.
  returned: always
  type: str
  sample: e7bd660aee614df4
public_key:
  description: The public key (PEM), for the nodes' trust set; null in check mode when no key exists yet.
  returned: always
  type: str
  sample: "-----BEGIN PUBLIC KEY-----\nMCowBQYDK2VwAyEA...\n-----END PUBLIC KEY-----\n"
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.warmstart.snapshot.plugins.module_utils.runners import _fleet_key
from ansible_collections.warmstart.snapshot.plugins.module_utils.runners._adapter import run_module

ARGUMENT_SPEC = dict(
    path=dict(type="path", default="~/.config/warmstart/fleet-signing.key", no_log=False),
)


def main() -> None:
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    run_module(module, _fleet_key.run)


if __name__ == "__main__":
    main()
