# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The admission webhook's HTTPS server (``_admission`` decides). Run in the node agent's image::

    python3 -m ansible_collections.warmstart.snapshot.plugins.module_utils.agent._admission_server \\
        --port 8443 --cert /etc/warmstart/admission/tls.crt --key /etc/warmstart/admission/tls.key

``POST /mutate-pods`` answers AdmissionReviews of pod CREATEs; ``GET /healthz`` says ``ok``. For each review it
lists the PodSnapshotPolicies and PodSnapshots of the pod's namespace (the in-cluster service account, or
``--kubeconfig``; it writes nothing). It never blocks a pod: a review it cannot read is answered 400, and when
the API cannot be read the pod is allowed unchanged with a warning (the webhook's ``failurePolicy: Ignore``
covers the server being down). One log line per decision on standard error.
"""
from __future__ import annotations

import argparse
import json
import logging
import ssl
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, List, Optional, Sequence, Tuple

from ansible_collections.warmstart.snapshot.plugins.module_utils.agent import _admission as admission
from ansible_collections.warmstart.snapshot.plugins.module_utils.core._errors import WarmstartError
from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s import _podapi as podapi

LOG = logging.getLogger("warmstart.admission")

JSON = admission.JSON
Lister = Callable[[str], Tuple[List[JSON], List[JSON]]]  # namespace -> (PodSnapshotPolicies, PodSnapshots)
MAX_BODY = 8 << 20  # bytes of one review (a pod is far smaller; the API server's own limit is 3 MiB objects)
PATH_MUTATE, PATH_HEALTH = "/mutate-pods", "/healthz"


def cluster_lister(kubeconfig: Optional[str] = None) -> Lister:
    """Lists through the Kubernetes API (``_k8s_client``; in-cluster without ``kubeconfig``)."""
    from ansible_collections.warmstart.snapshot.plugins.module_utils.k8s import _k8s_client as k8s  # pylint: disable=import-outside-toplevel

    cluster = k8s.cluster_from({"kubeconfig": kubeconfig, "request_timeout": 3})

    def lister(namespace: str) -> Tuple[List[JSON], List[JSON]]:
        return cluster.list(podapi.KIND_POLICY, namespace), cluster.list(podapi.KIND_SNAPSHOT, namespace)
    return lister


def answer(body: bytes, lister: Lister, log: Callable[[str], None]) -> Tuple[int, JSON]:
    """(HTTP status, AdmissionReview) for one request body."""
    try:
        review = json.loads(body)
    except ValueError as exc:
        return 400, {"error": f"the body is no JSON: {exc}"}
    request, problems = admission.review_request(review)
    if request is None:
        return 400, {"error": "; ".join(problems)}
    pod: JSON = request["object"]
    namespace = str(request.get("namespace") or podapi.as_dict(pod.get("metadata")).get("namespace") or "")
    meta = podapi.as_dict(pod.get("metadata"))
    what = f"pod {namespace}/{meta.get('name') or str(meta.get('generateName') or '') + '*'}"
    try:
        policies, snapshots = lister(namespace)
    except (WarmstartError, OSError) as exc:
        log(f"{what}: admitted unchanged: the PodSnapshotPolicies of {namespace} cannot be read: {exc}")
        return 200, admission.response(str(request["uid"]), None, None,
                                       [f"warmstart: the pod was not checked for auto-restore: {exc}"])
    decision = admission.decide(pod, namespace, policies, snapshots)
    if decision.verdict:
        log(f"{what}: {decision.verdict}")
    return 200, admission.response(str(request["uid"]), decision, pod)


class _Handler(BaseHTTPRequestHandler):
    server: "AdmissionServer"
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - BaseHTTPRequestHandler's signature
        pass  # one line per decision instead (AdmissionServer.log)

    def _send(self, code: int, doc: Any) -> None:
        data = json.dumps(doc).encode() if not isinstance(doc, bytes) else doc
        self.send_response(code)
        self.send_header("Content-Type", "application/json" if not isinstance(doc, bytes) else "text/plain")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:  # noqa: N802 - BaseHTTPRequestHandler's name
        if self.path.split("?")[0] == PATH_HEALTH:
            self._send(200, b"ok")
        else:
            self._send(404, {"error": f"no {self.path} here (POST {PATH_MUTATE}, GET {PATH_HEALTH})"})

    def do_POST(self) -> None:  # noqa: N802 - BaseHTTPRequestHandler's name
        if self.path.split("?")[0] != PATH_MUTATE:
            self._send(404, {"error": f"no {self.path} here (POST {PATH_MUTATE})"})
            return
        try:
            length = int(self.headers.get("Content-Length") or "-1")
        except ValueError:
            length = -1
        if not 0 <= length <= MAX_BODY:
            self._send(400 if length < 0 else 413, {"error": f"a review of 0 to {MAX_BODY} bytes with a Content-Length"})
            return
        code, doc = answer(self.rfile.read(length), self.server.lister, self.server.log)
        self._send(code, doc)


class AdmissionServer(ThreadingHTTPServer):
    """The webhook on ``(host, port)`` (port 0: any free one, see ``port``), TLS with ``cert`` and ``key``."""
    daemon_threads = True

    def __init__(self, host: str, port: int, cert: str, key: str, lister: Lister,
                 log: Optional[Callable[[str], None]] = None) -> None:
        super().__init__((host, port), _Handler)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.load_cert_chain(cert, key)
        self.socket = context.wrap_socket(self.socket, server_side=True)
        self.lister = lister
        self.log = log or LOG.info

    @property
    def port(self) -> int:
        return int(self.server_address[1])

    def start(self) -> "AdmissionServer":
        threading.Thread(target=self.serve_forever, daemon=True, name="warmstart-admission").start()
        return self


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="warmstart-admission", description=__doc__.split("\n", 1)[0])
    parser.add_argument("--host", default="0.0.0.0", help="address to listen on (default all)")  # nosec B104
    parser.add_argument("--port", type=int, default=8443)
    parser.add_argument("--cert", required=True, help="the server certificate (PEM), e.g. a kubernetes.io/tls Secret's tls.crt")
    parser.add_argument("--key", required=True, help="its private key (PEM)")
    parser.add_argument("--kubeconfig", help="a kubeconfig (default: K8S_AUTH_KUBECONFIG, ~/.kube/config, in-cluster)")
    args = parser.parse_args(argv)
    logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="%(message)s")
    try:
        server = AdmissionServer(args.host, args.port, args.cert, args.key, cluster_lister(args.kubeconfig))
    except (WarmstartError, OSError, ssl.SSLError) as exc:
        LOG.error("warmstart-admission: cannot start: %s", exc)
        return 2
    server.log(f"warmstart-admission: serving https://{args.host}:{server.port}{PATH_MUTATE}")
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
