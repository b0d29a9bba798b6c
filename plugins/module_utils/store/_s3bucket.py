# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""An S3-compatible bucket (boto3): its URL, credentials, server-side encryption, and the calls on its objects.

``S3Bucket`` is what ``_s3store.S3Store`` builds on: the boto3 client, made on
first use; provider errors turned into StoreErrors that say what to check;
the object key of each snapshot file (``<prefix>/snapshots/<id>/<file>``);
ranged reads, listing and deleting of objects.

Credentials come from boto3's usual chain (AWS_* variables, AWS_PROFILE /
``profile``, config files, instance roles); warmstart never reads, returns or
logs them.

Server-side encryption (``sse_settings``) is passed through to the provider:
SSE-S3 (``AES256``) or SSE-KMS (``aws:kms``, optionally a key id) on every
upload, or SSE-C (a 32-byte customer key) on every upload, GET and HEAD. The
customer key is never in a message, ``describe()`` or a result.
"""
from __future__ import annotations

import base64
import binascii
import os
import threading
from typing import Any, Callable, Dict, List, Optional, Tuple

from ansible_collections.warmstart.snapshot.plugins.module_utils.core import _progress as prog
from ansible_collections.warmstart.snapshot.plugins.module_utils.store._store import StoreError

CREDENTIAL_OPTIONS = ("access_key_id", "secret_access_key", "session_token")  # store_options that are credentials
SSE_CHOICES = ("AES256", "aws:kms")
Progress = Callable[[int], None]


def parse_url(url: str) -> Tuple[str, str]:
    if not url.startswith("s3://") or len(url) <= 5:
        raise StoreError(f"store {url!r} is not an s3://bucket[/prefix] URL")
    bucket, _sep, prefix = url[5:].partition("/")
    if not bucket:
        raise StoreError(f"store {url!r} names no bucket")
    return bucket, prefix.strip("/")


def _customer_key(text: str) -> bytes:
    """An SSE-C key as boto3 takes it (32 raw bytes): the base64 of 32 bytes, or 32 bytes of text as they are."""
    try:
        raw = base64.b64decode(text, validate=True)
        if len(raw) == 32:
            return raw
    except (binascii.Error, ValueError):
        pass
    raw = text.encode()
    if len(raw) != 32:
        raise StoreError(f"store_options.sse_customer_key: {len(raw)} bytes; an SSE-C key is 32 bytes "
                         "(given raw, or as base64)")
    return raw


def sse_settings(sse: Optional[str] = None, kms_key_id: Optional[str] = None,
                 customer_key: Optional[str] = None) -> Tuple[Dict[str, Any], Dict[str, Any]]:
    """(ExtraArgs of every upload, arguments added to every GET/HEAD of an object) for the store_options
    ``sse``, ``sse_kms_key_id`` and ``sse_customer_key``; StoreError naming the options that do not go together."""
    if sse and sse not in SSE_CHOICES:
        raise StoreError(f"store_options.sse {sse!r}: use one of {', '.join(SSE_CHOICES)}")
    if sse and customer_key:
        raise StoreError("store_options: sse and sse_customer_key exclude each other (SSE-S3/SSE-KMS, or SSE-C)")
    if kms_key_id and sse != "aws:kms":
        raise StoreError("store_options.sse_kms_key_id goes with sse: aws:kms")
    if customer_key:
        args = {"SSECustomerAlgorithm": "AES256", "SSECustomerKey": _customer_key(customer_key)}
        return dict(args), dict(args)
    upload: Dict[str, Any] = {"ServerSideEncryption": sse} if sse else {}
    if kms_key_id:
        upload["SSEKMSKeyId"] = kms_key_id
    return upload, {}


# What a later try may not meet (details ``transient``: the agent tries again without spending a pod's attempt):
# the endpoint unreachable or cut off mid-stream, the server overloaded or failing.
UNREACHABLE = ("EndpointConnectionError", "ConnectTimeoutError", "ConnectionClosedError")
CUT_OFF = ("ReadTimeoutError", "IncompleteReadError", "ResponseStreamingError", "ProtocolError")
TRANSIENT_CODES = ("500", "502", "503", "504", "InternalError", "ServiceUnavailable", "SlowDown", "RequestTimeout")


class S3Bucket:
    """An S3-compatible bucket (AWS, MinIO, Ceph RGW, ...) at ``url`` (``s3://bucket[/prefix]``)."""

    def __init__(self, url: str, endpoint_url: Optional[str] = None, region: Optional[str] = None,
                 profile: Optional[str] = None, concurrency: int = 8, progress: Optional[Progress] = None,
                 client: Any = None, credentials: Optional[Dict[str, str]] = None,
                 sse: Optional[Tuple[Dict[str, Any], Dict[str, Any]]] = None) -> None:
        self.bucket, self.prefix = parse_url(url)
        self._sse_upload, self._sse_read = sse or ({}, {})  # never in a message, describe() or a result
        self._credentials = dict(credentials or {})  # never in a message, describe() or a result
        self.root = url.rstrip("/")
        self.endpoint_url = endpoint_url or os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
        self.region = region
        self.profile = profile
        self.concurrency = max(1, concurrency)
        self.progress = progress
        self._client = client
        self._lock = threading.Lock()

    # -- connection ---------------------------------------------------------
    @property
    def client(self) -> Any:
        if self._client is None:
            try:
                import boto3  # pylint: disable=import-outside-toplevel
                from botocore.config import Config  # pylint: disable=import-outside-toplevel
            except ImportError:
                raise StoreError(
                    "an s3:// store needs boto3 for the module's Python on this node "
                    "(node_prep installs it: node_prep_s3_client; or apt-get install python3-boto3)") from None
            keys = self._credentials
            if keys and not (keys.get("access_key_id") and keys.get("secret_access_key")):
                raise StoreError("store_options: access_key_id and secret_access_key go together (one is missing)")
            session = boto3.session.Session(profile_name=None if keys else self.profile, region_name=self.region,
                                            aws_access_key_id=keys.get("access_key_id"),
                                            aws_secret_access_key=keys.get("secret_access_key"),
                                            aws_session_token=keys.get("session_token"))
            self._client = session.client("s3", endpoint_url=self.endpoint_url,
                                          config=Config(max_pool_connections=self.concurrency + 2,
                                                        retries={"max_attempts": 5, "mode": "standard"},
                                                        connect_timeout=10, read_timeout=120))
        return self._client

    def _err(self, what: str, exc: BaseException) -> StoreError:
        code = ""
        resp = getattr(exc, "response", None)
        if isinstance(resp, dict):
            code = str((resp.get("Error") or {}).get("Code") or "")
        text = {
            "NoSuchBucket": f"bucket {self.bucket} does not exist",
            "403": "access denied (check the credentials for this store: AWS_* variables or the profile)",
            "AccessDenied": "access denied (check the credentials for this store: AWS_* variables or the profile)",
            "InvalidAccessKeyId": "the access key is not known to this endpoint (wrong credentials)",
            "SignatureDoesNotMatch": "the secret key does not match the access key (wrong credentials)",
            "404": "not found",
            "NoSuchKey": "not found",
        }.get(code)
        name = type(exc).__name__
        if text is None:
            if name in UNREACHABLE:
                text = f"cannot reach the endpoint {self.endpoint_url or 'of AWS S3'} ({exc})"
            elif name == "NoCredentialsError":
                text = "no credentials found (set AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or a profile)"
            else:
                text = str(exc)
        transient = code in TRANSIENT_CODES or name in UNREACHABLE or name in CUT_OFF or isinstance(exc, OSError)
        return StoreError(f"store {self.root}: {what}: {text}", transient=transient)

    def _call(self, what: str, func: Callable[..., Any], **kwargs: Any) -> Any:
        try:
            return func(**kwargs)
        except StoreError:
            raise
        except Exception as exc:  # botocore's exceptions; boto3 may not be importable here
            raise self._err(what, exc) from None

    # -- layout ---------------------------------------------------------------
    def key(self, snapshot_id: str, rel: str = "") -> str:
        base = f"{self.prefix}/snapshots/{snapshot_id}" if self.prefix else f"snapshots/{snapshot_id}"
        return f"{base}/{rel}" if rel else base

    def _check_bucket(self) -> None:
        try:
            self._call("checking the bucket", self.client.head_bucket, Bucket=self.bucket)
        except StoreError as exc:
            if str(exc).endswith(": not found"):
                raise StoreError(f"store {self.root}: bucket {self.bucket} does not exist at "
                                 f"{self.endpoint_url or 'AWS S3'}") from None
            raise

    def _tick(self, n: int) -> None:
        prog.add(n)
        if self.progress is not None:
            with self._lock:
                self.progress(n)

    # -- objects ----------------------------------------------------------------
    def _object_sizes(self, snapshot_id: str) -> Dict[str, int]:
        sizes = {}
        paginator = self.client.get_paginator("list_objects_v2")
        pages = self._call("listing a snapshot",
                           lambda: list(paginator.paginate(Bucket=self.bucket, Prefix=self.key(snapshot_id, ""))))
        for page in pages:
            for obj in page.get("Contents", []):
                sizes[obj["Key"]] = int(obj.get("Size", 0))
        return sizes

    def read_range(self, snapshot_id: str, rel: str, offset: int, length: int) -> bytes:
        """``length`` bytes at ``offset`` of one object of the snapshot (a ranged GET)."""
        if length == 0:
            return b""
        resp = self._call(f"reading {rel}", self.client.get_object, Bucket=self.bucket, Key=self.key(snapshot_id, rel),
                          Range=f"bytes={offset}-{offset + length - 1}", **self._sse_read)
        return bytes(resp["Body"].read())

    def delete_keys(self, keys: List[str]) -> None:
        for i in range(0, len(keys), 1000):
            batch = [{"Key": k} for k in keys[i:i + 1000]]
            self._call("deleting objects", self.client.delete_objects, Bucket=self.bucket,
                       Delete={"Objects": batch, "Quiet": True})
