"""What a survey reads: folders (recursive, names relative to SOURCE), lists of paths, one image."""

from __future__ import annotations

import pytest

from headscope.survey.sources import Item, SourceError, list_images


def touch(p, data=b"x"):
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(data)
    return p


def test_a_folder_is_walked_recursively_with_names_relative_to_it(tmp_path):
    for name in ("b.png", "a.JPG", "sub/c.webp", "sub/deeper/d.tiff", "notes.txt", ".hidden.png", ".git/e.png"):
        touch(tmp_path / name)
    items = list_images(tmp_path)
    assert [it.image for it in items] == ["a.JPG", "b.png", "sub/c.webp", "sub/deeper/d.tiff"]
    assert all(it.path == str((tmp_path / it.image).resolve()) for it in items)


def test_a_list_file_keeps_its_order_and_names_paths_relative_to_its_folder(tmp_path):
    inside = touch(tmp_path / "imgs" / "x.png")
    outside = touch(tmp_path.parent / f"{tmp_path.name}-outside.png")
    lst = tmp_path / "list.txt"
    lst.write_text(
        "# pictures\n\nimgs/y.png\n./imgs/x.png\n"
        f"{inside}\n"  # absolute, inside the list's folder: the same picture, listed once
        f"{outside}\n"  # absolute, outside: keeps its full path as its name
        "missing.png\n"
    )
    items = list_images(lst)
    assert [it.image for it in items] == ["imgs/y.png", "imgs/x.png", outside.as_posix(), "missing.png"]
    assert items[1] == Item("imgs/x.png", str(tmp_path / "imgs" / "x.png"))
    assert items[3].path == str(tmp_path / "missing.png")  # kept: recorded as a failure later


def test_one_image_and_bad_sources(tmp_path):
    img = touch(tmp_path / "cat.png")
    assert list_images(img) == [Item("cat.png", str(img.resolve()))]
    with pytest.raises(FileNotFoundError):
        list_images(tmp_path / "nope")
    binary = touch(tmp_path / "data.bin", bytes(range(256)))
    with pytest.raises(SourceError):
        list_images(binary)
    assert list_images(touch(tmp_path / "empty" / "list.txt", b"")) == []
