#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
from __future__ import annotations

DOCUMENTATION = r"""
module: page_server
short_description: Serve a process snapshot's memory to one lazy restore on another node
version_added: 0.1.0
description:
  - On the node that holds a snapshot (its filesystem store, or its object-store cache), verifies the snapshot
    and starts C(criu page-server --lazy-pages) on O(address):O(port) for it, detached. A lazy restore on another
    node (M(warmstart.snapshot.restore) with O(warmstart.snapshot.restore#module:page_server)) then loads the
    pages straight from here, on demand and in the background, while it reads only the small images from the store.
  - The page server serves one restore and exits when that restore has all its memory; it is killed after
    O(timeout) seconds in any case.
  - Needs C(fs.pipe-max-size) of at least 3354624 bytes (CRIU's request pipes); the module raises it to 4 MiB when
    it is lower.
  - The page server holds the snapshot's pages in pipe buffers (kernel memory) while it runs.
  - Whoever can connect to the page server can read the snapshot's memory (its secrets included), and whoever
    can intercept the connection can feed the restore other pages (code that then runs on the restoring node).
    So it listens beyond this node only with O(tls) (mutual TLS - only a node with a certificate of the CA gets a
    page; a client refused in the handshake is noted in the connections log and the page server goes on waiting
    for its restore) or with O(insecure=true); on a loopback address TLS is optional.
author:
  - warmstart developers (!UNKNOWN)
extends_documentation_fragment:
  - warmstart.snapshot.store
  - warmstart.snapshot.store.options
  - warmstart.snapshot.tls
  - warmstart.snapshot.attributes.node
  - warmstart.snapshot.attributes.no_diff
  - warmstart.snapshot.attributes
attributes:
  check_mode:
    support: full
    description: Checks that the snapshot exists and its files have the manifest's sizes; starts nothing.
  platform:
    description: Linux with CRIU >= 4.2.
options:
  snapshot:
    description: Id of the snapshot to serve.
    type: str
    required: true
  address:
    description:
      - Address of this node to listen on (the restoring node connects to it).
      - Anything but a loopback address (V(127.0.0.1), V(::1), V(localhost)) is refused without O(tls), unless
        O(insecure=true).
    type: str
    default: 0.0.0.0
  insecure:
    description:
      - Serve in the clear (no TLS) on a non-loopback O(address).
      - B(Warning) - anyone who can reach the port can then read the snapshot's memory (keys, tokens, user data
        it held), and anyone on the path can feed the restore pages of their own; use it only on a network you
        trust completely (for example a dedicated link between two nodes). Prefer O(tls).
    type: bool
    default: false
  port:
    description: TCP port to listen on; refused when it is in use.
    type: int
    required: true
  timeout:
    description:
      - Seconds after which the page server is killed if it is still running.
      - A duration - seconds, or a number with a unit - V(90s), V(30m), V(12h), V(7d), or a sum such as V(1d12h).
    type: raw
    default: 900
  verify:
    description: Verify every file's size and SHA256 before serving.
    type: bool
    default: true
  criu_path:
    description: CRIU binary (default - the one P(warmstart.snapshot.node_prep#role) installed).
    type: path
  log_dir:
    description: Directory for the page server's log (C(page-server-<port>.log)).
    type: path
    default: /var/lib/warmstart/restore
"""

EXAMPLES = r"""
- name: Serve the snapshot's pages from the node that holds it, over mutual TLS (certificates from node_prep)
  warmstart.snapshot.page_server:
    snapshot: "{{ snap.snapshot.id }}"
    port: 27100
    tls: true
  delegate_to: "{{ snapshot_holder }}"
  register: served

- name: Restore on this node, pages from the holder
  warmstart.snapshot.restore:
    snapshot: "{{ snap.snapshot.id }}"
    page_server: "{{ hostvars[snapshot_holder].ansible_host }}:27100"
    tls: true
"""

RETURN = r"""
page_server:
  description: The page server started (in check mode - what would be).
  returned: success
  type: dict
  contains:
    snapshot_id:
      description: Snapshot id served.
      type: str
      returned: always
      sample: 20261202T124302Z-f6ccdab5
    address:
      description: Address it listens on.
      type: str
      returned: always
      sample: 0.0.0.0
    port:
      description: Port it listens on.
      type: int
      returned: always
      sample: 27100
    tls:
      description: Whether it serves over mutual TLS.
      type: bool
      returned: always
      sample: true
    pid:
      description: PID of C(criu page-server).
      type: int
      returned: not in check mode
      sample: 30211
    log:
      description: Its log file.
      type: str
      returned: not in check mode
      sample: /var/lib/warmstart/restore/page-server-27100.log
reasons:
  description: Every reason the snapshot was refused.
  returned: failure
  type: list
  elements: str
  sample: ["containers/embed/criu/pages-1.img: SHA256 mismatch (corrupted)"]
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.warmstart.snapshot.plugins.module_utils.runners import _page_server
from ansible_collections.warmstart.snapshot.plugins.module_utils.runners._adapter import run_module
from ansible_collections.warmstart.snapshot.plugins.module_utils.runners._specs import store_argument_spec, tls_argument_spec


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(
            snapshot=dict(type="str", required=True),
            address=dict(type="str", default="0.0.0.0"),
            insecure=dict(type="bool", default=False),
            **tls_argument_spec(),
            port=dict(type="int", required=True),
            timeout=dict(type="raw", default=900),
            verify=dict(type="bool", default=True),
            criu_path=dict(type="path"),
            log_dir=dict(type="path", default="/var/lib/warmstart/restore"),
            **store_argument_spec(),
        ),
        supports_check_mode=True,
    )
    run_module(module, _page_server.run)


if __name__ == "__main__":
    main()
