"""dnnkit.files: a file is replaced whole or not at all (a full disk shown by a file-size limit
in a child process, an exception of the caller's, a folder as the target), and text files that
are not UTF-8 are refused with a message naming the file and the line."""

import os
import stat
import subprocess
import sys
import textwrap

import pytest

from dnnkit import files

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _leftovers(folder, keep):
    return sorted(set(os.listdir(folder)) - set(keep))


def test_atomic_open_replaces_the_file_whole(tmp_path):
    path = tmp_path / "out.txt"
    files.write_text(path, "first\n")
    with files.atomic_open(path, "w") as f:
        f.write("second ")
        assert path.read_text() == "first\n"      # nothing visible until the block ends
        f.write("line\r\n")
    assert path.read_bytes() == b"second line\r\n"       # newlines as written
    files.write_bytes(str(path), b"\x00\xff")
    assert path.read_bytes() == b"\x00\xff"
    assert _leftovers(tmp_path, ["out.txt"]) == []


def test_an_exception_in_the_block_keeps_the_old_file(tmp_path):
    path = tmp_path / "model.bin"
    path.write_bytes(b"good")
    with pytest.raises(KeyError):
        with files.atomic_open(path, "wb") as f:
            f.write(b"half of the new")
            raise KeyError("the caller failed mid-way")
    assert path.read_bytes() == b"good"
    assert _leftovers(tmp_path, ["model.bin"]) == []


def test_a_folder_as_the_target_is_refused_before_anything_is_written(tmp_path):
    folder = tmp_path / "cache.json"
    folder.mkdir()
    with pytest.raises(IsADirectoryError) as ei:
        files.write_text(folder, "{}")
    assert str(folder) in str(ei.value)
    assert _leftovers(tmp_path, ["cache.json"]) == [] and os.listdir(folder) == []


def test_a_missing_folder_names_the_target(tmp_path):
    path = tmp_path / "no" / "such" / "file.txt"
    with pytest.raises(FileNotFoundError) as ei:
        files.write_text(path, "x")
    assert str(path) in str(ei.value)


def test_permissions_and_symbolic_links(tmp_path):
    path = tmp_path / "kept.txt"
    path.write_text("old")
    os.chmod(path, 0o640)
    files.write_text(path, "new")
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o640
    link = tmp_path / "link.txt"
    os.symlink(path, link)
    files.write_text(link, "through the link")
    assert os.path.islink(link) and path.read_text() == "through the link"


def test_bad_mode():
    with pytest.raises(ValueError, match="atomic_open: mode must be 'w' or 'wb'"):
        with files.atomic_open("x", "a"):
            pass


CHILD = textwrap.dedent("""
    import resource, sys
    from dnnkit import files
    path, size = sys.argv[1], int(sys.argv[2])
    resource.setrlimit(resource.RLIMIT_FSIZE, (size, resource.RLIM_INFINITY))
    try:
        files.write_bytes(path, b"n" * (4 * size))
    except OSError as e:
        print("OSError", e.errno, e.filename == path)
    else:
        print("written")
""")


def test_a_full_disk_keeps_the_old_file_and_leaves_no_temporary(tmp_path):
    """RLIMIT_FSIZE in a child process: writes past the limit fail with EFBIG (Python ignores
    SIGXFSZ), as a full disk fails with ENOSPC."""
    path = tmp_path / "weights.npz"
    path.write_bytes(b"old contents")
    r = subprocess.run([sys.executable, "-c", CHILD, str(path), "4096"], capture_output=True,
                       text=True, timeout=120, cwd=REPO)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["OSError", "27", "True"]        # EFBIG, naming the target
    assert path.read_bytes() == b"old contents"
    assert _leftovers(tmp_path, ["weights.npz"]) == []


@pytest.mark.parametrize("data,words", [
    ("[dnn]\nenabled = auto\n".encode("utf-16"), ["UTF-16", "UTF-8"]),
    ("[dnn]\nenabled = auto\n".encode("utf-16-be"), ["line 1, column 1", "NUL byte"]),
    (bytes(range(256)), ["line 1, column 1", "NUL byte", "binary"]),
    (b"ok\nalso ok\nbad \xe9\xff\n", ["line 3, column 5", "0xe9", "not UTF-8"]),
])
def test_read_text_refuses_what_is_not_utf8(tmp_path, data, words):
    path = tmp_path / "file"
    path.write_bytes(data)
    with pytest.raises(ValueError) as ei:
        files.read_text(path, "thing")
    msg = str(ei.value)
    assert msg.startswith(f"thing {path}")
    for w in words:
        assert w in msg, msg


def test_read_text_reads_utf8_and_drops_a_bom(tmp_path):
    path = tmp_path / "file"
    path.write_bytes("\ufeffpath = /opt/100%/lib é\n".encode("utf-8"))
    assert files.read_text(path, "rc file") == "path = /opt/100%/lib é\n"
    with pytest.raises(FileNotFoundError):
        files.read_text(tmp_path / "absent", "rc file")
