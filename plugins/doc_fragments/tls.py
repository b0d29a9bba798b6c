# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
from __future__ import annotations


class ModuleDocFragment:
    """TLS between a page server and the lazy restore it serves (CRIU's own mutual TLS)."""

    DOCUMENTATION = r"""
options:
  tls:
    description:
      - Mutual TLS between the page server and the lazy restore (CRIU's C(--tls)). Both sides need it - a page
        server with TLS refuses a client without a certificate of its CA in the TLS handshake, before any page is
        sent (and goes on waiting for its restore); a restore with TLS refuses a page server whose certificate is
        not of its CA or does not name the address it connects to.
      - The certificate of the node that serves must name the address the restore connects to (subjectAltName
        IP or DNS); any certificate of the CA is accepted from a restoring node.
      - Files default to C(<keys>/tls/ca.pem), C(<keys>/tls/cert.pem) and C(<keys>/tls/key.pem), the keys
        directory being E(WARMSTART_KEYS_DIR), else C(/etc/warmstart/keys); P(warmstart.snapshot.node_prep#role)
        distributes them (C(node_prep_tls_ca), C(node_prep_tls_cert), C(node_prep_tls_key)).
      - For M(warmstart.snapshot.restore), only with O(warmstart.snapshot.restore#module:page_server).
      - Every file is checked before anything starts - missing, unreadable, not PEM, or a key readable by group or
        others is refused with its path.
    type: bool
    default: false
  tls_ca:
    description: CA certificate (PEM) the peer's certificate must be issued by; needs O(tls).
    type: path
  tls_cert:
    description: This node's certificate (PEM), issued by the CA; needs O(tls).
    type: path
  tls_key:
    description: This node's private key (PEM, mode 0600), the certificate's; needs O(tls).
    type: path
"""
