"""_pstree: a dumped container tree made the leader of its own session (pure logic and the image format).

pycriu is installed for the nodes' Python by node_prep, not in the test venv; these tests build CRIU's
``pstree_entry`` message (images/pstree.proto: uint32 pid = 1, ppid = 2, pgid = 3, sid = 4, repeated
threads = 5) from a descriptor with the venv's protobuf: the same wire format. The integration tests
(test_container_trees.py) run the real pycriu on real CRIU images.
"""
from __future__ import annotations

import struct
from pathlib import Path
from typing import Any, List

import pytest
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from ansible_collections.warmstart.snapshot.plugins.module_utils.criu import _pstree as pstree


def entry_type() -> Any:
    fdp = descriptor_pb2.FileDescriptorProto(name="pstree_test.proto", package="wstest", syntax="proto2")
    msg = fdp.message_type.add(name="pstree_entry")
    for n, name in enumerate(("pid", "ppid", "pgid", "sid"), start=1):
        msg.field.add(name=name, number=n, type=descriptor_pb2.FieldDescriptorProto.TYPE_UINT32,
                      label=descriptor_pb2.FieldDescriptorProto.LABEL_REQUIRED)
    msg.field.add(name="threads", number=5, type=descriptor_pb2.FieldDescriptorProto.TYPE_UINT32,
                  label=descriptor_pb2.FieldDescriptorProto.LABEL_REPEATED)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("wstest.pstree_entry"))


@pytest.fixture(autouse=True)
def fake_pycriu(monkeypatch: pytest.MonkeyPatch) -> None:
    kind = entry_type()
    monkeypatch.setattr(pstree, "_message", lambda: kind)


def image(*tasks: tuple) -> bytes:
    kind = entry_type()
    out = [struct.pack("<II", 0x54564319, 0x50273030)]
    for pid, ppid, pgid, sid in tasks:
        body = kind(pid=pid, ppid=ppid, pgid=pgid, sid=sid, threads=[pid]).SerializeToString()
        out.append(struct.pack("<I", len(body)) + body)
    return b"".join(out)


def fields(data: bytes) -> List[tuple]:
    return [(e.pid, e.ppid, e.pgid, e.sid, list(e.threads)) for e in pstree.decode(data)[1]]


def test_a_tree_in_the_inits_session_leads_its_own(tmp_path: Path) -> None:
    # under --init: root 2 (parent: init 1, outside the dump), its child 3, grandchild 4; child 5 in its own group
    path = tmp_path / "pstree.img"
    path.write_bytes(image((2, 0, 1, 1), (3, 2, 1, 1), (4, 3, 1, 1), (5, 2, 5, 1)))
    path.chmod(0o600)
    changed = pstree.rewrite_file(str(path))
    assert changed == {"sid": {1: 2}, "pgid": {1: 2}}
    assert fields(path.read_bytes()) == [(2, 0, 2, 2, [2]), (3, 2, 2, 2, [3]), (4, 3, 2, 2, [4]), (5, 2, 5, 2, [5])]
    assert path.read_bytes()[:8] == image()[:8] and (path.stat().st_mode & 0o777) == 0o600


def test_ids_inside_the_tree_are_kept_and_a_leader_is_left_alone(tmp_path: Path) -> None:
    path = tmp_path / "pstree.img"
    data = image((7, 0, 7, 7), (8, 7, 8, 8), (9, 8, 7, 7))  # root leads; 8 leads its own session
    path.write_bytes(data)
    assert pstree.rewrite_file(str(path)) == {}
    assert path.read_bytes() == data


@pytest.mark.parametrize("data, fragment", [
    (b"\x19\x43", "has no header"),
    (image((2, 0, 1, 1))[:-2], "truncated"),
    (image((2, 0, 1, 1)) + b"\x01\x00", "truncated at byte"),
])
def test_a_broken_image_is_an_error_naming_it(tmp_path: Path, data: bytes, fragment: str) -> None:
    path = tmp_path / "pstree.img"
    path.write_bytes(data)
    with pytest.raises(pstree.PstreeError, match=fragment):
        pstree.rewrite_file(str(path))
