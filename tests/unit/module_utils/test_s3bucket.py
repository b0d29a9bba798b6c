"""_s3bucket: which S3 errors a later try may not meet (``transient``), as botocore raises them."""
from __future__ import annotations

import botocore.exceptions as bex
import pytest

from ansible_collections.warmstart.snapshot.plugins.module_utils.store import _s3bucket as s3b


def _client_error(code: str) -> bex.ClientError:
    return bex.ClientError({"Error": {"Code": code, "Message": code}}, "GetObject")


@pytest.mark.parametrize("exc,transient,says", [
    (bex.EndpointConnectionError(endpoint_url="http://127.0.0.1:9"), True, "cannot reach the endpoint"),
    (bex.ConnectTimeoutError(endpoint_url="http://127.0.0.1:9"), True, "cannot reach the endpoint"),
    (bex.ReadTimeoutError(endpoint_url="http://127.0.0.1:9"), True, "Read timeout"),
    (ConnectionResetError(104, "Connection reset by peer"), True, "Connection reset"),
    (_client_error("SlowDown"), True, "SlowDown"),
    (_client_error("503"), True, "503"),
    (_client_error("InternalError"), True, "InternalError"),
    (_client_error("NoSuchKey"), False, "not found"),
    (_client_error("AccessDenied"), False, "access denied"),
    (_client_error("SignatureDoesNotMatch"), False, "wrong credentials"),
    (bex.NoCredentialsError(), False, "no credentials found"),
])
def test_errors_a_later_try_may_not_meet_are_transient(exc: BaseException, transient: bool, says: str) -> None:
    bucket = s3b.S3Bucket("s3://snaps/fleet", endpoint_url="http://127.0.0.1:9", client=object())
    err = bucket._err("downloading app/criu/pages-1.img", exc)  # pylint: disable=protected-access
    assert str(err).startswith("store s3://snaps/fleet: downloading app/criu/pages-1.img: ") and says in str(err)
    assert err.details.get("transient", False) is transient
