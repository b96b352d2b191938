"""read_picture_file: the one way a picture file becomes bytes (issue 33, items 1-3).

Real files of every kind: what is not a regular file is refused without being opened (a FIFO
nobody writes to would block a reader for good), a file over the limit before a byte is read.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from headscope.serving.pictures import ImageError, PictureFileError, read_picture_file
from helpers.server import SAMPLES

pytestmark = pytest.mark.timeout(60)  # a read that blocks on a FIFO fails here instead of hanging
LIMIT = 1000


def refused(path: Path, code: str, max_bytes: int = LIMIT) -> PictureFileError:
    with pytest.raises(PictureFileError) as e:
        read_picture_file(path, max_bytes)
    assert e.value.code == code, e.value
    assert str(path) not in str(e.value)  # callers name the file; the message says why
    return e.value


def test_a_regular_file_and_a_link_to_one_give_their_bytes(tmp_path):
    data = (SAMPLES / "cat.png").read_bytes()
    assert read_picture_file(SAMPLES / "cat.png", len(data)) == data  # exactly at the limit
    (tmp_path / "link.png").symlink_to(SAMPLES / "cat.png")
    assert read_picture_file(str(tmp_path / "link.png"), 20 * 1024 * 1024) == data


def test_what_is_not_a_regular_file_is_refused_without_blocking(tmp_path):
    os.mkfifo(tmp_path / "pipe.png")
    assert "FIFO" in str(refused(tmp_path / "pipe.png", "not_a_file"))
    (tmp_path / "zero.png").symlink_to("/dev/zero")  # endless: read whole it would never end
    assert "character device" in str(refused(tmp_path / "zero.png", "not_a_file"))
    (tmp_path / "dir.png").mkdir()
    assert "folder" in str(refused(tmp_path / "dir.png", "not_a_file"))
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(tmp_path / "sock.png"))
        assert "socket" in str(refused(tmp_path / "sock.png", "not_a_file"))


def test_missing_files_broken_links_and_loops(tmp_path):
    refused(tmp_path / "nope.png", "not_found")
    (tmp_path / "gone.png").symlink_to(tmp_path / "nope.png")
    refused(tmp_path / "gone.png", "not_found")
    (tmp_path / "loop.png").symlink_to(tmp_path / "loop.png")
    refused(tmp_path / "loop.png", "symlink_loop")
    (tmp_path / "file").write_bytes(b"x")
    refused(tmp_path / "file" / "under-a-file.png", "read_error")  # ENOTDIR


def test_unreadable_and_empty_files(tmp_path):
    (tmp_path / "empty.png").write_bytes(b"")
    refused(tmp_path / "empty.png", "empty_file")
    # Write-only for root too (the sysctl checks the owner's bits for root): see test_cli_unreadable_files.
    locked = tmp_path / "locked.png"
    locked.symlink_to("/proc/sys/vm/drop_caches")
    if not os.access("/proc/sys/vm/drop_caches", os.F_OK):
        pytest.skip("no /proc/sys/vm/drop_caches here")
    refused(locked, "permission_denied")


def test_a_file_over_the_limit_is_refused_before_it_is_read(tmp_path):
    big = tmp_path / "big.png"
    with open(big, "wb") as f:
        f.truncate(2 * 1024**3)  # sparse: the check must come from its size, not from reading it
    e = refused(big, "file_too_large", 20 * 1024 * 1024)
    assert e.status == 413 and "2,147,483,648 bytes" in str(e)
    (tmp_path / "one-over.png").write_bytes(b"x" * (LIMIT + 1))
    refused(tmp_path / "one-over.png", "file_too_large")
    assert read_picture_file(big.with_name("one-over.png"), LIMIT + 1) == b"x" * (LIMIT + 1)


def test_it_is_an_image_error_for_every_caller():
    """The survey and extract catch ImageError: a file error is one, with its code."""
    assert issubclass(PictureFileError, ImageError)
