"""Files written whole or not at all, and text files read with errors that name them.

``atomic_open(path, mode)`` is the one way dnnkit replaces a file (the algorithm cache, saved
modules): the new contents go to a temporary file in the same folder, which is flushed,
fsynced and renamed over ``path`` (``os.replace``: atomic on POSIX and Windows within one file
system, hence the same folder). A reader, or a crash at any moment, sees the old file or the
new one, never a part of one. When writing fails -- a full disk (``ENOSPC``), a file-size limit
(``EFBIG``), an exception of the caller's -- the temporary file is removed and ``path`` keeps
its old contents. The folder is fsynced after the rename where the system allows it, so the
rename itself survives a power loss.

``read_text(path, what)`` reads a UTF-8 text file (a leading byte-order mark is dropped) and
refuses anything else -- binary data, UTF-16 -- with a ValueError naming ``what``, the file and
the line, instead of Python's UnicodeDecodeError, which names neither.

``elf_sections(f)`` lists an ELF file's section headers (a shared library's dynamic section,
a cubin's code sections), read from the file, never loaded.
"""

import contextlib
import os
import stat
import struct

_UTF16_BOMS = (b"\xff\xfe", b"\xfe\xff")


def _refuse_folder(path):
    if os.path.isdir(path):
        raise IsADirectoryError(21, "Is a directory (give the path of a file)", path)


def _temporary(path, binary, shown):
    """(file object, name) of a new file beside ``path``, created exclusively (``O_EXCL``:
    never another process's temporary) with the permissions of a plain ``open`` (0o666
    less the umask) or, when ``path`` exists, its permissions. Errors name ``shown``."""
    folder, base = os.path.split(path)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0)
    for attempt in range(100):
        tmp = os.path.join(folder, f".{base}.{os.getpid()}.{os.urandom(4).hex()}.tmp")
        try:
            fd = os.open(tmp, flags, 0o666)
            break
        except FileExistsError:
            continue
        except OSError as e:
            raise OSError(e.errno, f"{e.strerror} (cannot create a file beside it)",
                          shown) from None
    else:
        raise FileExistsError(17, "no free temporary name beside it", shown)
    try:
        mode = stat.S_IMODE(os.stat(path).st_mode)
    except OSError:
        mode = None
    if mode is not None:
        with contextlib.suppress(OSError):
            os.chmod(tmp, mode)
    return os.fdopen(fd, "wb" if binary else "w", **({} if binary else
                                                     {"encoding": "utf-8", "newline": ""})), tmp


def _sync_folder(folder):
    """Make the rename durable (POSIX); not every system can open a folder: best effort."""
    try:
        fd = os.open(folder or ".", os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_open(path, mode="w"):
    """``with atomic_open(path, "wb") as f: f.write(...)``: ``f`` is a new file beside
    ``path`` (mode ``"w"``: text, UTF-8, newlines as written; ``"wb"``: bytes); when the block
    ends without an exception it replaces ``path`` whole, flushed and fsynced. When the block
    raises, or the write, flush, fsync or rename fails, the temporary file is removed, ``path``
    is unchanged and the exception propagates (an OSError naming ``path``).

    A symbolic link at ``path`` is followed: its target is replaced. ``path`` naming a folder
    raises IsADirectoryError before anything is written."""
    if mode not in ("w", "wb"):
        raise ValueError(f"atomic_open: mode must be 'w' or 'wb'; got {mode!r}")
    shown = os.fspath(path)              # errors name the path as given
    path = os.path.realpath(shown)
    _refuse_folder(shown)
    f, tmp = _temporary(path, mode == "wb", shown)
    try:
        with f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(e, OSError) and e.errno is not None and e.filename in (None, tmp):
            # the error names the target, not the temporary file that is gone
            raise OSError(e.errno, e.strerror, shown) from e
        raise
    _sync_folder(os.path.dirname(path))


def write_bytes(path, data):
    """Replace ``path`` with ``data`` (bytes) atomically (``atomic_open``)."""
    with atomic_open(path, "wb") as f:
        f.write(data)


def write_text(path, text):
    """Replace ``path`` with ``text`` in UTF-8 atomically (``atomic_open``)."""
    with atomic_open(path, "w") as f:
        f.write(text)


def _line_col(data, offset):
    line = data.count(b"\n", 0, offset) + 1
    return line, offset - (data.rfind(b"\n", 0, offset) + 1) + 1


def read_text(path, what):
    """The contents of the UTF-8 text file ``path`` as a str (a UTF-8 byte-order mark
    dropped). ValueError "``what`` ``path``[, line L, column C]: ..." when it is not UTF-8
    text: UTF-16 (a UTF-16 byte-order mark), binary (a NUL byte), or bytes that are not UTF-8.
    OSError (naming ``path``) when it cannot be read."""
    path = os.fspath(path)
    with open(path, "rb") as f:
        data = f.read()
    if data.startswith(_UTF16_BOMS):
        raise ValueError(f"{what} {path}: is UTF-16 text; dnnkit reads UTF-8 (save it as "
                         "UTF-8)")
    if data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]
    nul = data.find(b"\x00")
    if nul >= 0:
        line, col = _line_col(data, nul)
        raise ValueError(f"{what} {path}, line {line}, column {col}: a NUL byte: a binary "
                         "file, not UTF-8 text")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line, col = _line_col(data, e.start)
        raise ValueError(f"{what} {path}, line {line}, column {col}: byte "
                         f"0x{data[e.start]:02x} is not UTF-8 text (a binary file, or "
                         "another encoding)") from None


def elf_sections(f):
    """(byte order "<" or ">", 64-bit or not, [(name, type, offset, size, link)] of every
    section) of the ELF file open in binary mode as ``f``; None when it is not ELF. Raises
    struct.error or IndexError on a truncated file."""
    f.seek(0)
    head = f.read(64)
    if head[:4] != b"\x7fELF":
        return None
    bits64, end = head[4] == 2, "<" if head[5] == 1 else ">"
    # e_shoff, then e_shentsize, e_shnum, e_shstrndx (32- or 64-bit header layout)
    shoff, = struct.unpack_from(end + ("Q" if bits64 else "I"), head, 0x28 if bits64 else 0x20)
    shentsize, shnum, shstrndx = struct.unpack_from(end + "HHH", head,
                                                    0x3A if bits64 else 0x2E)
    f.seek(shoff)
    table = f.read(shentsize * shnum)
    # section header: sh_name, sh_type; sh_offset, sh_size, sh_link at fields 4, 5, 6
    fmt = end + ("IIQQQQII" if bits64 else "IIIIIIII")
    raw = [struct.unpack_from(fmt, table, i * shentsize) for i in range(shnum)]
    names = b""
    if 0 < shstrndx < shnum:
        f.seek(raw[shstrndx][4])
        names = f.read(raw[shstrndx][5])
    return end, bits64, [(names[r[0]:names.index(b"\0", r[0])].decode(errors="replace")
                          if r[0] < len(names) else "", r[1], r[4], r[5], r[6]) for r in raw]
