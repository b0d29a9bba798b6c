# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
from __future__ import annotations


class ModuleDocFragment:
    """How the Kubernetes modules reach the API server (the options of kubernetes.core, a subset)."""

    DOCUMENTATION = r"""
options:
  kubeconfig:
    description:
      - Path to a kubeconfig file.
      - Default E(K8S_AUTH_KUBECONFIG), then C(~/.kube/config) when it exists (unless only O(host) is given), then
        the in-cluster service account of the pod the module runs in.
    type: path
  context:
    description:
      - Context of the kubeconfig to use; default E(K8S_AUTH_CONTEXT), then the kubeconfig's current context.
    type: str
  host:
    description:
      - URL of the API server, for example V(https://10.0.0.1:6443); default E(K8S_AUTH_HOST).
      - Overrides the server of the kubeconfig; given alone (no O(kubeconfig)), no kubeconfig is read.
    type: str
  api_key:
    description:
      - Bearer token to authenticate with; default E(K8S_AUTH_API_KEY). Overrides the kubeconfig's credentials.
      - Never logged or returned.
    type: str
  validate_certs:
    description:
      - Verify the API server's TLS certificate; default E(K8S_AUTH_VERIFY_SSL), then the kubeconfig's setting
        (verify unless it says C(insecure-skip-tls-verify)).
    type: bool
    aliases: [verify_ssl]
  ca_cert:
    description:
      - CA bundle to verify the API server's certificate with; default E(K8S_AUTH_SSL_CA_CERT), then the
        kubeconfig's C(certificate-authority).
    type: path
    aliases: [ssl_ca_cert]
  request_timeout:
    description:
      - Seconds to wait for one answer of the API server.
      - A duration - seconds, or a number with a unit - V(90s), V(30m), V(12h), V(7d), or a sum such as V(1d12h).
    type: raw
    default: 30
requirements:
  - The Python library C(kubernetes) (37.x) for the interpreter the module runs with on the managed node
    (usually the controller, with C(delegate_to=localhost)).
notes:
  - Requests go through the C(kubernetes) client's C(ApiClient), so proxies, client certificates and exec
    credential plugins of the kubeconfig work as with C(kubectl).
"""
