"""CRIU's page-server protocol as we serve it to a lazy restore (criu/_pagewire): against a client that speaks it
as criu/page-xfer.c does (32-byte page_server_iov, answers of at most the asked pages, int32 status on close)."""
from __future__ import annotations

import socket
import struct
import threading
from typing import Any, List, Optional, Tuple

import pytest

from ansible_collections.warmstart.snapshot.plugins.module_utils.criu import _pagewire as pw

PAGE = 4096
IOV = struct.Struct("@IQQQ")  # struct page_server_iov as CRIU's C compiler lays it out on this machine


def test_the_header_is_criu_s_page_server_iov() -> None:
    assert pw.HEADER.size == 32 and IOV.size == 32  # u32 cmd, 4 bytes of padding, three u64
    assert (pw.PS_IOV_GET, pw.PS_IOV_ADD_F, pw.PS_IOV_CLOSE, pw.PS_IOV_FORCE_CLOSE) == (7, 6, 0x1023, 0x1024)


def image(name: str, pages: int) -> bytes:
    """Pages whose every byte says which image and page they are."""
    return b"".join(bytes([(sum(name.encode()) + n) % 251]) * PAGE for n in range(pages))


# task 7: pages-1.img holds 4 pages at 0x10000 then 2 at 0x40000; task 9: pages-2.img, 3 pages at 0x7000
INDEX = pw.PageIndex({7: ("pages-1.img", [(0x10000, 0x14000, 0), (0x40000, 0x42000, 4 * PAGE)]),
                      9: ("pages-2.img", [(0x7000, 0xA000, 0)])})
IMAGES = {"pages-1.img": image("pages-1.img", 6), "pages-2.img": image("pages-2.img", 3)}


def test_locate_finds_the_offset_and_cuts_at_the_end_of_the_entry() -> None:
    assert INDEX.locate(7, 0x10000, 4) == ("pages-1.img", 0, 4)
    assert INDEX.locate(7, 0x12000, 8) == ("pages-1.img", 2 * PAGE, 2)  # the client takes fewer than it asked
    assert INDEX.locate(7, 0x41000, 1) == ("pages-1.img", 5 * PAGE, 1)
    assert INDEX.locate(9, 0x7000, 3) == ("pages-2.img", 0, 3)


@pytest.mark.parametrize("task, vaddr, nr, why", [
    (8, 0x10000, 1, "task 8, which the images do not hold"),
    (7, 0x14000, 1, "1 page(s) at 0x14000 are not in its pagemap"),   # between the two entries
    (7, 0x0F000, 1, "1 page(s) at 0xf000 are not in its pagemap"),    # before the first
    (7, 0x10800, 1, "1 page(s) at 0x10800 are not in its pagemap"),   # not page aligned
    (7, 0x10000, 0, "0 page(s) at 0x10000 are not in its pagemap"),
])
def test_locate_refuses_what_the_pagemap_does_not_hold(task: int, vaddr: int, nr: int, why: str) -> None:
    with pytest.raises(pw.WireError) as refused:
        INDEX.locate(task, vaddr, nr)
    assert why in str(refused.value)


class Session:
    """``pw.serve`` on one end of a socket pair (a thread), the test speaking CRIU's client on the other."""

    def __init__(self, read: Optional[Any] = None) -> None:
        self.client, server = socket.socketpair()
        self.reads: List[Tuple[str, int, int]] = []
        self.served = [0, 0]
        self.error: Optional[BaseException] = None

        def reader(name: str, offset: int, length: int) -> bytes:
            self.reads.append((name, offset, length))
            return IMAGES[name][offset:offset + length]

        def run() -> None:
            try:
                pw.serve(server, INDEX, read or reader, self.served)
            except BaseException as exc:  # pylint: disable=broad-exception-caught  # the test looks at it
                self.error = exc
            finally:
                server.close()

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()

    def get(self, task: int, vaddr: int, nr: int) -> Tuple[Tuple[int, int, int, int], bytes]:
        self.client.sendall(IOV.pack(pw.PS_IOV_GET, nr, vaddr, task))
        head = IOV.unpack(self.recv(IOV.size))
        return head, self.recv(head[1] * PAGE)

    def recv(self, size: int) -> bytes:
        data = b""
        while len(data) < size:
            part = self.client.recv(size - len(data))
            if not part:
                break
            data += part
        return data

    def end(self) -> None:
        self.thread.join(5)
        self.client.close()


def test_pages_are_answered_with_criu_s_header_then_the_bytes_of_their_place() -> None:
    s = Session()
    head, data = s.get(7, 0x11000, 2)
    assert head == (pw.PS_IOV_ADD_F | 4 << 16, 2, 0x11000, 7)  # ADD_F with PE_PRESENT, as criu's dump side says
    assert data == IMAGES["pages-1.img"][PAGE:3 * PAGE]
    head, data = s.get(7, 0x40000, 16)  # asked past the entry: the two it holds
    assert head[1] == 2 and data == IMAGES["pages-1.img"][4 * PAGE:]
    head, data = s.get(9, 0x9000, 1)
    assert data == IMAGES["pages-2.img"][2 * PAGE:]
    s.client.sendall(IOV.pack(pw.PS_IOV_CLOSE, 0, 0, 0))
    assert struct.unpack("@i", s.recv(4)) == (0,)  # the status CRIU's disconnect waits for
    s.end()
    assert s.error is None and s.served == [3, 5 * PAGE]
    assert s.reads == [("pages-1.img", PAGE, 2 * PAGE), ("pages-1.img", 4 * PAGE, 2 * PAGE),
                       ("pages-2.img", 2 * PAGE, PAGE)]


def test_force_close_ends_the_session_too_and_a_daemon_that_goes_away_ends_it_quietly() -> None:
    s = Session()
    s.client.sendall(IOV.pack(pw.PS_IOV_FORCE_CLOSE, 0, 0, 0))
    assert struct.unpack("@i", s.recv(4)) == (0,)
    s.end()
    assert s.error is None
    quiet = Session()
    quiet.client.shutdown(socket.SHUT_WR)
    quiet.end()
    assert quiet.error is None and quiet.served == [0, 0]


def test_a_piece_that_does_not_check_ends_the_session_before_any_byte_of_its_answer() -> None:
    def corrupt(name: str, offset: int, length: int) -> bytes:
        raise pw.WireError(f"{name}: chunk 0 (bytes 0-{length - 1}): SHA256 mismatch (corrupted)")

    s = Session(corrupt)
    s.client.sendall(IOV.pack(pw.PS_IOV_GET, 1, 0x10000, 7))
    assert s.recv(IOV.size) == b""  # not a header, not a page: the connection is closed
    s.end()
    assert isinstance(s.error, pw.WireError) and "SHA256 mismatch" in str(s.error)


@pytest.mark.parametrize("request_, why", [
    (IOV.pack(1, 1, 0x10000, 7), "command 0x1 is not one a lazy restore sends"),      # PS_IOV_ADD: a dump's
    (IOV.pack(pw.PS_IOV_GET, 1, 0x20000, 7), "1 page(s) at 0x20000 are not in its pagemap"),
    (IOV.pack(pw.PS_IOV_GET, 1, 0x10000, 3), "task 3, which the images do not hold"),
    (IOV.pack(pw.PS_IOV_GET, 1, 0x10000, 7)[:20], "a request cut short (20 of 32 bytes)"),
])
def test_what_a_lazy_restore_never_asks_ends_the_session_naming_it(request_: bytes, why: str) -> None:
    s = Session()
    s.client.sendall(request_)
    if len(request_) < IOV.size:
        s.client.shutdown(socket.SHUT_WR)
    assert s.recv(IOV.size) == b""
    s.end()
    assert isinstance(s.error, pw.WireError) and why in str(s.error), s.error


def test_an_answer_holds_at_most_max_pages(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pw, "MAX_PAGES", 3)
    s = Session()
    head, data = s.get(7, 0x10000, 4)
    assert head[1] == 3 and data == IMAGES["pages-1.img"][:3 * PAGE]
    head, data = s.get(7, 0x13000, 1)  # the client asks again for the rest
    assert head[1] == 1 and data == IMAGES["pages-1.img"][3 * PAGE:4 * PAGE]
    s.client.close()
    s.end()


def test_a_short_read_is_an_error_not_a_short_page() -> None:
    s = Session(lambda name, offset, length: IMAGES[name][offset:offset + length - 1])
    s.client.sendall(IOV.pack(pw.PS_IOV_GET, 1, 0x10000, 7))
    assert s.recv(IOV.size) == b""
    s.end()
    assert isinstance(s.error, pw.WireError) and f"{PAGE - 1} of {PAGE} bytes at 0" in str(s.error)
