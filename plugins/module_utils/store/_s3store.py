# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""S3-compatible object store backend (boto3), with a node-local cache.

Layout under ``s3://<bucket>/<prefix>``, the same as the filesystem store::

    snapshots/<id>/<file>            uploaded first, in parallel (multipart for large files)
    snapshots/<id>/manifest.json     uploaded last: published = present

A snapshot is staged on local disk (``<cache>/tmp/<uuid>``), uploaded at
publish, and the staged copy becomes this node's cached copy. A restore gets a
local directory: ``<cache>/<store key>/<id>/``, downloaded once per node in
parallel byte ranges (resumable: finished ranges are recorded next to the
``.part`` file), every file's SHA256 checked against the manifest before it is
renamed into place; a cached file that no longer matches is fetched again.

The bucket itself (URL, credentials, server-side encryption, the boto3 client
and its errors, object keys) is ``_s3bucket.S3Bucket``, which ``S3Store`` extends.
"""
from __future__ import annotations

import concurrent.futures
import hashlib
import os
import shutil
import time
import uuid
from typing import Any, Dict, List, Optional, Set, Tuple

from ansible_collections.warmstart.snapshot.plugins.module_utils.core import _paths
from ansible_collections.warmstart.snapshot.plugins.module_utils.core import _safefs as safefs
from ansible_collections.warmstart.snapshot.plugins.module_utils.store import _digest as dg
from ansible_collections.warmstart.snapshot.plugins.module_utils.store import _manifest as mf
from ansible_collections.warmstart.snapshot.plugins.module_utils.store import _peers as peers_
from ansible_collections.warmstart.snapshot.plugins.module_utils.core import _progress as prog
from ansible_collections.warmstart.snapshot.plugins.module_utils.store._checksums import walk_files
from ansible_collections.warmstart.snapshot.plugins.module_utils.store._s3bucket import Progress, S3Bucket
from ansible_collections.warmstart.snapshot.plugins.module_utils.store._store import (
    StoreError, local_staging, lock_down, refuse_encrypted, tree_size)

DEFAULT_CACHE = _paths.CACHE_DIR
PART = 64 << 20           # byte range per download request / multipart part size
THRESHOLD = 64 << 20      # files above this are uploaded multipart


class S3Staging:
    """A snapshot staged on local disk, uploaded on publish."""

    def __init__(self, store: "S3Store", path: str, snapshot_id: str) -> None:
        self.store = store
        self.path = path
        self.snapshot_id = snapshot_id
        self.done = False
        self.uploaded: List[str] = []

    def publish(self, manifest: Dict[str, Any]) -> str:
        mf.dump(manifest, os.path.join(self.path, mf.MANIFEST))
        lock_down(self.path)
        files = [rel for rel in walk_files(self.path) if rel != mf.MANIFEST]
        prog.phase("upload", sum(os.path.getsize(os.path.join(self.path, rel)) for rel in files + [mf.MANIFEST]))
        try:
            self.store.upload_files(self.path, self.snapshot_id, files, self.uploaded)
            self.store.upload_files(self.path, self.snapshot_id, [mf.MANIFEST], self.uploaded)
        except BaseException:
            self.abort()
            raise
        # the staged copy is this node's cached copy: a restore here downloads nothing
        cached = self.store.cache_dir(self.snapshot_id)
        shutil.rmtree(cached, ignore_errors=True)
        os.makedirs(os.path.dirname(cached), mode=0o700, exist_ok=True)
        os.rename(self.path, cached)
        self.done = True
        return self.store.snapshot_dir(self.snapshot_id)

    def abort(self) -> None:
        if self.done:
            return
        shutil.rmtree(self.path, ignore_errors=True)
        if self.uploaded:
            try:
                self.store.delete_keys(self.uploaded)
            except StoreError:
                pass  # left unpublished (no manifest): cleanup lists it as staging
        self.done = True


class S3Store(S3Bucket):
    """An S3-compatible bucket (AWS, MinIO, Ceph RGW, ...) with a node-local cache."""

    kind = "s3"
    admits_encrypted = False  # set by a SecureStore around it

    def __init__(self, url: str, endpoint_url: Optional[str] = None, region: Optional[str] = None,
                 profile: Optional[str] = None, cache: str = DEFAULT_CACHE, concurrency: int = 8,
                 progress: Optional[Progress] = None, client: Any = None,
                 credentials: Optional[Dict[str, str]] = None,
                 sse: Optional[Tuple[Dict[str, Any], Dict[str, Any]]] = None,
                 peers: Optional[peers_.PeerConfig] = None) -> None:
        super().__init__(url, endpoint_url=endpoint_url, region=region, profile=profile, concurrency=concurrency,
                         progress=progress, client=client, credentials=credentials, sse=sse)
        self.peers = peers  # nodes that share this store's downloads (``_peers``)
        self.cache = cache
        self.verified: Dict[str, bool] = {}
        self.transfer: Dict[str, Any] = {"uploaded": 0, "downloaded": 0, "reused": 0, "seconds": 0.0}

    # -- layout ---------------------------------------------------------------
    @property
    def snapshots(self) -> str:
        return f"{self.root}/snapshots"

    def snapshot_dir(self, snapshot_id: str) -> str:
        return f"{self.root}/snapshots/{mf.check_id(snapshot_id)}"

    def describe(self) -> Dict[str, Any]:
        """Where the store is and what kind; a bucket is taken to exist (listing tells otherwise)."""
        return {"url": self.root, "kind": self.kind, "exists": True}

    def cache_root(self) -> str:
        safe = f"{self.bucket}/{self.prefix}".strip("/").replace("/", "__")
        return os.path.join(self.cache, "s3", safe)

    def cache_dir(self, snapshot_id: str) -> str:
        return os.path.join(self.cache_root(), mf.check_id(snapshot_id))

    @property
    def reads_in_place(self) -> bool:
        """Restores read this node's verified copy (``local_dir``), never the bucket's objects in place."""
        return False

    def check_usable(self) -> None:
        """Reach the bucket with these credentials and find the node cache creatable, writing nothing."""
        self._check_bucket()
        path = self.cache
        while not os.path.exists(path) and os.path.dirname(path) != path:
            path = os.path.dirname(path)
        if not os.path.isdir(path) or not os.access(path, os.W_OK | os.X_OK):
            raise StoreError(f"store {self.root}: cannot create the node cache {self.cache}: "
                             f"{path} is not a writable directory")

    def ensure(self) -> None:
        """Reach the bucket with these credentials, or say why not - before any checkpoint."""
        self._check_bucket()
        for path in (self.cache, os.path.join(self.cache, "tmp")):
            try:
                os.makedirs(path, mode=0o700, exist_ok=True)
            except OSError as exc:
                raise StoreError(f"store {self.root}: cannot create the node cache {path}: {exc.strerror}") from None

    # -- writing ----------------------------------------------------------------
    def stage(self, snapshot_id: str) -> S3Staging:
        self.ensure()
        path = os.path.join(self.cache, "tmp", uuid.uuid4().hex)
        os.mkdir(path, 0o700)
        return S3Staging(self, path, mf.check_id(snapshot_id))

    def upload_files(self, top: str, snapshot_id: str, rels: List[str], done: List[str]) -> None:
        from boto3.s3.transfer import TransferConfig  # pylint: disable=import-outside-toplevel
        cfg = TransferConfig(multipart_threshold=THRESHOLD, multipart_chunksize=PART,
                             max_concurrency=self.concurrency, use_threads=True)
        t0 = time.monotonic()

        def one(rel: str) -> str:
            key = self.key(snapshot_id, rel)
            self._call(f"uploading {rel}", self.client.upload_file, Filename=os.path.join(top, rel),
                       Bucket=self.bucket, Key=key, Config=cfg, Callback=self._tick,
                       ExtraArgs=dict(self._sse_upload))
            return key

        # large files already upload in parallel parts; small ones go several at a time
        with concurrent.futures.ThreadPoolExecutor(max_workers=min(4, self.concurrency)) as pool:
            for key in pool.map(one, rels):
                done.append(key)
        self.transfer["uploaded"] += sum(os.path.getsize(os.path.join(top, r)) for r in rels)
        self.transfer["seconds"] += time.monotonic() - t0

    # -- reading ----------------------------------------------------------------
    def _get_manifest(self, snapshot_id: str) -> Dict[str, Any]:
        key = self.key(snapshot_id, mf.MANIFEST)
        try:
            body = self.client.get_object(Bucket=self.bucket, Key=key, **self._sse_read)["Body"].read()
        except Exception as exc:  # pylint: disable=broad-except
            err = self._err(f"reading {key}", exc)
            if "not found" in str(err):
                raise StoreError(f"snapshot {snapshot_id} not found in store {self.root}") from None
            raise err from None
        doc = mf.parse(body, f"{self.root}/{key}")
        if doc["id"] != snapshot_id:
            raise StoreError(f"{self.root}/{key}: manifest id {doc['id']} does not match its prefix {snapshot_id}")
        return doc

    def exists(self, snapshot_id: str) -> bool:
        try:
            self._get_manifest(snapshot_id)
            return True
        except StoreError:
            return False

    def load(self, snapshot_id: str) -> Dict[str, Any]:
        return refuse_encrypted(self, self._get_manifest(mf.check_id(snapshot_id)))

    def _ids(self) -> Dict[str, Dict[str, Any]]:
        """Every snapshot prefix: {id: {'published': bool, 'size': bytes, 'mtime': newest}}."""
        out: Dict[str, Dict[str, Any]] = {}
        prefix = f"{self.prefix}/snapshots/" if self.prefix else "snapshots/"
        paginator = self.client.get_paginator("list_objects_v2")
        pages = self._call("listing snapshots", lambda: list(paginator.paginate(Bucket=self.bucket, Prefix=prefix)))
        for page in pages:
            for obj in page.get("Contents", []):
                rest = obj["Key"][len(prefix):]
                sid, _sep, rel = rest.partition("/")
                try:
                    mf.check_id(sid)
                except mf.ManifestError:
                    continue
                info = out.setdefault(sid, {"published": False, "size": 0, "mtime": 0.0, "keys": []})
                info["size"] += int(obj.get("Size", 0))
                info["keys"].append(obj["Key"])
                stamp = obj.get("LastModified")
                info["mtime"] = max(info["mtime"], stamp.timestamp() if stamp else 0.0)
                if rel == mf.MANIFEST:
                    info["published"] = True
        return out

    def list(self) -> List[Dict[str, Any]]:
        out: List[Dict[str, Any]] = []
        for sid, info in sorted(self._ids().items()):
            if not info["published"]:
                continue
            try:
                out.append(self.load(sid))
            except (mf.ManifestError, StoreError) as exc:
                out.append({"id": sid, "error": str(exc)})
        return out

    def staging_entries(self) -> List[Dict[str, Any]]:
        """Uploads that never got their manifest, and this node's local staging dirs."""
        out = [{"path": self.snapshot_dir(sid), "mtime": info["mtime"], "size": info["size"]}
               for sid, info in sorted(self._ids().items()) if not info["published"]]
        return out + local_staging(os.path.join(self.cache, "tmp"))

    def unlisted_problems(self, doc: Dict[str, Any], sizes: Optional[Dict[str, int]] = None) -> List[str]:
        """Objects under the snapshot's prefix that its manifest does not list (never downloaded, but reported)."""
        sizes = self._object_sizes(doc["id"]) if sizes is None else sizes
        listed = {self.key(doc["id"], e["path"]) for e in doc["files"]} | {self.key(doc["id"], mf.MANIFEST)}
        base = len(self.key(doc["id"], ""))
        return [f"{key[base:]}: in the bucket but not listed in the manifest" for key in sorted(set(sizes) - listed)]

    def remote_problems(self, doc: Dict[str, Any]) -> List[str]:
        """Files of ``doc`` missing from the bucket, of another size, or not listed (no download)."""
        sizes = self._object_sizes(doc["id"])
        problems = self.unlisted_problems(doc, sizes)
        for entry in doc["files"]:
            have = sizes.get(self.key(doc["id"], entry["path"]))
            if have is None:
                problems.append(f"{entry['path']}: missing in the bucket")
            elif have != entry["size"]:
                problems.append(f"{entry['path']}: {have} bytes in the bucket, manifest says {entry['size']}")
        return problems

    def local_dir(self, snapshot_id: str) -> str:
        """This node's verified copy of the snapshot: reused when intact, fetched (resumably) when not; with
        ``peers``, chunks are shared with the other nodes fetching it (``_peers``) while it is fetched."""
        dest = self.cache_dir(snapshot_id)
        if self.verified.get(snapshot_id):
            return dest  # checked by this store object already (one module run)
        doc = self.load(snapshot_id)
        os.makedirs(dest, mode=0o700, exist_ok=True)
        t0 = time.monotonic()
        session = self._share(doc, dest)
        ok = False
        try:
            self._fill(doc, dest, session)
            ok = True
        finally:
            if session is not None:
                session.finish(ok)  # keeps serving while the other nodes still fetch
        mf.dump(doc, os.path.join(dest, mf.MANIFEST))
        lock_down(dest)
        self.transfer["seconds"] += time.monotonic() - t0
        self.verified[snapshot_id] = True
        return dest

    def _share(self, doc: Dict[str, Any], dest: str) -> Optional[peers_.Session]:
        """A started peer session over the files of ``doc`` with 64 MiB chunk digests, or None without peers."""
        if self.peers is None:
            return None
        files = {e["path"]: peers_.Session.entry(os.path.join(dest, e["path"]), int(e["size"]),
                                                 [d for _o, _n, d in dg.pieces(e)])
                 for e in doc["files"] if (e.get("chunks") or {}).get("size") == PART}
        try:
            return peers_.Session(self.peers, str(doc["id"]), files, PART, self.transfer).start()
        except peers_.PeerError as exc:  # cannot serve (the port is taken): this node fetches alone
            self.transfer["peer_error"] = str(exc)
            return None

    def _fill(self, doc: Dict[str, Any], dest: str, session: Optional[peers_.Session]) -> None:
        """Every file of ``doc`` into ``dest``: the intact ones kept, the others fetched."""
        cached = [e for e in doc["files"] if self._cached_size(os.path.join(dest, e["path"])) == e["size"]]
        prog.phase("verify cache", sum(e["size"] for e in cached))
        intact = dg.check_files([(os.path.join(dest, e["path"]), e) for e in cached], prog.add)
        fetch = []
        for entry in doc["files"]:
            path = os.path.join(dest, entry["path"])
            if intact.get(path):
                self.transfer["reused"] += entry["size"]
                if session is not None and entry["path"] in session.files:
                    session.mark_file(entry["path"])
                continue
            if os.path.lexists(path):
                os.unlink(path)  # corrupt or truncated cache: fetched again
            fetch.append((entry, path))
        prog.phase("download", sum(entry["size"] for entry, _path in fetch))
        for entry, path in fetch:
            self._download(doc["id"], entry, path, session)

    def verify(self, doc: Dict[str, Any], fetch: bool = True, cached: bool = False) -> List[str]:
        """Without ``fetch``: the bucket's objects against the manifest (sizes, missing, unlisted), nothing
        downloaded. With it: this node's copy, whose every file was hashed as it was fetched or reused
        (``local_dir``); objects the manifest does not list are reported unless ``cached``."""
        if not fetch:
            return self.remote_problems(doc)
        self.local_dir(doc["id"])
        return [] if cached else self.unlisted_problems(doc)

    def fetch_file(self, snapshot_id: str, entry: Dict[str, Any], path: str, verify: bool = True) -> None:
        """One file of the snapshot downloaded to ``path``; its SHA256 checked on the way (always)."""
        del verify  # a download is always verified
        self._download(snapshot_id, entry, path)

    @staticmethod
    def _cached_size(path: str) -> int:
        return os.path.getsize(path) if os.path.isfile(path) else -1

    @staticmethod
    def _open_part(part: str, ledger: str, size: int) -> Set[int]:
        """Offsets of the ranges already verified into ``part`` (a resumed download), or a fresh ``part``."""
        if os.path.exists(part) and os.path.getsize(part) == size:
            try:
                with open(ledger, "r", encoding="ascii") as handle:
                    return {int(x) for x in handle.read().split()}
            except (OSError, ValueError):
                pass
        safefs.remove(part)
        fd = safefs.create_file(part)
        os.ftruncate(fd, size)
        os.close(fd)
        safefs.write_file(ledger, b"", 0o600)
        return set()

    def _get_range(self, key: str, rel: str, part: str, start: int, end: int) -> str:
        """Bytes ``start``-``end`` of object ``key`` (file ``rel``) written at the same offsets of ``part``; their
        SHA256."""
        resp = self._call(f"downloading {rel}", self.client.get_object, Bucket=self.bucket, Key=key,
                          Range=f"bytes={start}-{end}", **self._sse_read)
        digest = hashlib.sha256()
        fd = safefs.open_file(part, os.O_WRONLY)
        try:
            off = start
            for chunk in iter(lambda: self._read_body(resp, rel), b""):
                os.pwrite(fd, chunk, off)
                digest.update(chunk)
                off += len(chunk)
                self._tick(len(chunk))
            if off != end + 1:
                raise StoreError(f"store {self.root}: {key}: short read ({off - start} of {end - start + 1} bytes)")
            os.fsync(fd)
        finally:
            os.close(fd)
        with self._lock:
            self.transfer["downloaded"] += end + 1 - start
        return digest.hexdigest()

    def _read_body(self, resp: Dict[str, Any], rel: str) -> bytes:
        """The next MiB of a GET's body; a connection lost mid-stream is a StoreError naming the file."""
        try:
            return bytes(resp["Body"].read(1 << 20))
        except Exception as exc:  # socket errors, botocore's and urllib3's streaming errors
            raise self._err(f"downloading {rel} (cut off mid-range; what was verified is kept: run again to "
                            "resume)", exc) from None

    @staticmethod
    def _put_range(part: str, start: int, data: bytes) -> None:
        fd = safefs.open_file(part, os.O_WRONLY)
        try:
            os.pwrite(fd, data, start)
            os.fsync(fd)
        finally:
            os.close(fd)

    def _download(self, snapshot_id: str, entry: Dict[str, Any], path: str,
                  session: Optional[peers_.Session] = None) -> None:
        """One file into ``path``, 64 MiB ranges at a time, several at once, resumable (``.part`` and a ledger
        of verified ranges). A file with chunk digests is checked range by range as it arrives (one range is
        one chunk): only then is the range in the ledger, and offered to peers; with a ``session``, the ranges
        other nodes fetch are asked of them, and read from the store when they cannot send a verified copy."""
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        key, size, rel = self.key(snapshot_id, entry["path"]), entry["size"], entry["path"]
        part, ledger = f"{path}.part", f"{path}.part.done"
        done = self._open_part(part, ledger, size)
        ranges = [(off, min(off + PART, size) - 1) for off in range(0, size, PART) if off not in done]
        prog.add(size - sum(end - start + 1 for start, end in ranges))  # resumed: already here
        chunks = dg.pieces(entry) if (entry.get("chunks") or {}).get("size") == PART else None
        shared = session if session is not None and rel in session.files else None
        if shared is not None:  # what was verified before is offered; this node's share first: others wait for it
            for off in done:
                shared.mark(rel, off)
            ranges.sort(key=lambda rng: not shared.owned_here(rel, rng[0]))

        def fetch(rng: Tuple[int, int]) -> None:
            start, end = rng
            data = None if shared is None or shared.owned_here(rel, start) else shared.fetch(rel, start)
            if data is not None:
                self._put_range(part, start, data)
                self._tick(len(data))
            else:
                got = self._get_range(key, rel, part, start, end)
                if chunks is not None and got != chunks[start // PART][2]:
                    raise StoreError(f"store {self.root}: {key}: chunk {start // PART} (bytes {start}-{end}) does "
                                     "not match its SHA256 in the manifest (corrupted in the store or in transit)")
            with self._lock, os.fdopen(safefs.open_file(ledger, os.O_WRONLY | os.O_APPEND), "a",
                                       encoding="ascii") as handle:
                handle.write(f"{start}\n")
            if shared is not None:
                shared.mark(rel, start)

        if ranges:
            with concurrent.futures.ThreadPoolExecutor(max_workers=self.concurrency) as pool:
                list(pool.map(fetch, ranges))
        # what arrived was checked chunk by chunk; a resumed or unchunked download is hashed here
        if (chunks is None or len(ranges) < len(chunks)) and not dg.check_files([(part, entry)]).get(part):
            os.unlink(part)
            os.unlink(ledger)
            raise StoreError(f"store {self.root}: {key}: SHA256 of the download does not match the manifest "
                             "(corrupted in the store or in transit)")
        os.rename(part, path)
        os.unlink(ledger)

    # -- deleting -----------------------------------------------------------------
    def delete(self, snapshot_id: str) -> int:
        """Unpublish (manifest first), then the rest; and this node's cached copy."""
        info = self._ids().get(mf.check_id(snapshot_id))
        if not info:
            raise FileNotFoundError(self.snapshot_dir(snapshot_id))
        manifest = self.key(snapshot_id, mf.MANIFEST)
        if manifest in info["keys"]:
            self.delete_keys([manifest])
        self.delete_keys([k for k in info["keys"] if k != manifest])
        shutil.rmtree(self.cache_dir(snapshot_id), ignore_errors=True)
        return int(info["size"])

    def delete_staging(self, path: str) -> int:
        if path.startswith("s3://"):
            sid = path.rstrip("/").rsplit("/", 1)[-1]
            info = self._ids().get(sid)
            if not info or info["published"]:
                return 0
            self.delete_keys(info["keys"])
            return int(info["size"])
        size = tree_size(path)
        shutil.rmtree(path, ignore_errors=True)
        return size
