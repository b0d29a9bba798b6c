# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The argument specs several modules share, each as the doc fragment of the same name documents it.

A module's ``main()`` builds its ``AnsibleModule`` from its own options and these. Plain dicts: this file
imports nothing from the engine but the node paths (the defaults), so a module that uses one ships almost nothing more.
"""
from __future__ import annotations

from typing import Any, Dict

from ansible_collections.warmstart.snapshot.plugins.module_utils.core import _paths


def runtime_option() -> Dict[str, Any]:
    """The one ``runtime`` option of every module that names containers: the runtime that owns them, by default
    whichever installed one knows them (``_runtime.Auto``)."""
    return dict(type="str", choices=["podman", "containerd", "auto"], default="auto")


def auth_argument_spec() -> Dict[str, Any]:
    """The Kubernetes auth options, as the doc fragment warmstart.snapshot.k8s_auth documents them.

    ``_k8s_client.connect`` reads them from the params (with their K8S_AUTH_* fallbacks, ``_k8s_client.AUTH_ENV``).
    """
    return dict(
        kubeconfig=dict(type="path"),
        context=dict(type="str"),
        host=dict(type="str"),
        api_key=dict(type="str", no_log=True),
        validate_certs=dict(type="bool", aliases=["verify_ssl"]),
        ca_cert=dict(type="path", aliases=["ssl_ca_cert"]),
        request_timeout=dict(type="raw", default=30),
    )


def tls_argument_spec() -> Dict[str, Any]:
    """``tls``, ``tls_ca``, ``tls_cert``, ``tls_key``, as the doc fragment warmstart.snapshot.tls documents them."""
    return dict(tls=dict(type="bool", default=False), tls_ca=dict(type="path"), tls_cert=dict(type="path"),
                tls_key=dict(type="path", no_log=False))


def store_argument_spec() -> Dict[str, Any]:
    """``store`` and ``store_options``, as the doc fragment warmstart.snapshot.store documents them."""
    return dict(
        store=dict(type="str", default=_paths.STORE_DIR),
        store_options=dict(type="dict", default={}, options=dict(
            endpoint_url=dict(type="str"),
            region=dict(type="str"),
            profile=dict(type="str"),
            cache_dir=dict(type="path", default=_paths.CACHE_DIR),
            concurrency=dict(type="int", default=8),
            peers=dict(type="list", elements="str"),
            peer_listen=dict(type="str"),
            peer_tls=dict(type="bool", default=False),
            peer_insecure=dict(type="bool", default=False),
            peer_wait=dict(type="float", default=60.0),
            peer_linger=dict(type="float", default=10.0),
            encryption=dict(type="bool", default=False),
            compression=dict(type="str", choices=["none", "zstd"]),
            compression_level=dict(type="int", default=3),
            kek_dir=dict(type="path", no_log=False),
            kek=dict(type="str", no_log=False),
            sse=dict(type="str", choices=["AES256", "aws:kms"]),
            sse_kms_key_id=dict(type="str", no_log=False),
            sse_customer_key=dict(type="str", no_log=True),
            access_key_id=dict(type="str", no_log=False),
            secret_access_key=dict(type="str", no_log=True),
            session_token=dict(type="str", no_log=True),
            signing_key=dict(type="path", no_log=False),
            trusted_keys=dict(type="path"),
        )),
    )


def pod_argument_spec(**extra: Any) -> Dict[str, Any]:
    """A pod target (checkpoint ``pod``, restore ``into.pod``): found on the node by its CRI labels."""
    return dict(type="dict", options=dict(
        namespace=dict(type="str", default="default"),
        name=dict(type="str", required=True),
        container=dict(type="str", required=True),
        container_id=dict(type="str"),
        **extra,
    ))


def metrics_argument_spec() -> Dict[str, Any]:
    """``metrics_dir``, as the doc fragment warmstart.snapshot.metrics documents it."""
    return dict(metrics_dir=dict(type="path"))


def progress_argument_spec() -> Dict[str, Any]:
    """``progress_interval`` and ``progress_file``, as the doc fragment warmstart.snapshot.store.progress documents them."""
    return dict(progress_interval=dict(type="float", default=10.0), progress_file=dict(type="path"))
