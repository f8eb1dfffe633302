"""Files that tasks fetch from URLs (``download`` steps, ``cloud_file`` / ``cache_file``
getters), kept in the content-addressed blob store so an environment never needs the network.

The bytes live in the blob store under their sha256; a small index maps each URL to the digest
(``ROOT/urls/<sha256 of the url>``, one line: the digest). ``dart tasks fetch`` fills the cache
where the network allows; elsewhere a missing file is a :class:`MissingDownload` naming the
URL, the path to put the file at, and the command that fetches it.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import tempfile
import urllib.request
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dart.blobs import LocalBlobStore, sha256_hex
from dart.errors import BlobError, EnvError

log = logging.getLogger(__name__)

DEFAULT_ROOT = ".dart/blobs"
"""Where the cache lives unless a config or ``DART_DOWNLOADS`` says otherwise (the env
workers' blob store, so fetched files and screenshots share one folder)."""
FETCH_TIMEOUT_S = 120.0
"""Time limit of one URL's download in ``dart tasks fetch``."""


class MissingDownload(EnvError, FileNotFoundError):
    """A task needs a file from a URL that is not in the download cache (and the backend may
    not fetch it): an infra error, with the fix in the message."""


def default_root() -> Path:
    return Path(os.environ.get("DART_DOWNLOADS") or DEFAULT_ROOT)


@dataclass(frozen=True, slots=True)
class FetchResult:
    url: str
    digest: str | None
    """sha256 of the stored bytes, None if the fetch failed."""
    error: str = ""


class DownloadCache:
    """URL -> bytes, backed by a :class:`~dart.blobs.LocalBlobStore` (``root``)."""

    def __init__(self, root: str | Path | None = None) -> None:
        self.root = Path(root) if root else default_root()
        self.blobs = LocalBlobStore(self.root)

    def _index(self, url: str) -> Path:
        return self.root / "urls" / sha256_hex(url.encode())

    def digest(self, url: str) -> str | None:
        """The digest stored for ``url``, None if it was never fetched."""
        try:
            text = self._index(url).read_text(encoding="ascii").strip()
        except FileNotFoundError:
            return None
        return text or None

    def has(self, url: str) -> bool:
        d = self.digest(url)
        return d is not None and self.blobs.exists(d)

    def put(self, url: str, data: bytes) -> str:
        """Store ``data`` as the content of ``url``; returns its digest."""
        return self._record(url, self.blobs.put(data))

    def put_file(self, url: str, path: Path) -> str:
        """Store a local file as the content of ``url`` (``dart tasks fetch --from DIR``)."""
        return self._record(url, self.blobs.put_file(path))

    def _record(self, url: str, digest: str) -> str:
        index = self._index(url)
        index.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=index.parent, prefix=".tmp-")
        with os.fdopen(fd, "w", encoding="ascii") as fh:
            fh.write(digest + "\n")
        os.replace(tmp, index)  # a reader sees the old digest or the new one, never half a line
        return digest

    def path(self, url: str) -> Path:
        """A local path holding the bytes of ``url`` (verified); MissingDownload if absent."""
        d = self.digest(url)
        if d is None:
            raise MissingDownload(
                f"missing file {url}: run `dart tasks fetch TASKS --downloads {self.root}` where the network "
                f"allows, or put the file at {self.root}/inbox/{url_name(url)} and run "
                f"`dart tasks fetch TASKS --from {self.root}/inbox`"
            )
        try:
            return self.blobs.local_path(d)
        except BlobError as exc:
            raise MissingDownload(f"the cached file of {url} is unusable ({exc}); fetch it again") from exc

    def read(self, url: str) -> bytes:
        return self.path(url).read_bytes()

    def copy_to(self, url: str, target: Path) -> None:
        """Put the bytes of ``url`` at ``target`` (parents made)."""
        source = self.path(url)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, target)

    def fetch(self, url: str, *, timeout_s: float = FETCH_TIMEOUT_S) -> FetchResult:
        """Download ``url`` into the cache unless it is there (blocking)."""
        if self.has(url):
            return FetchResult(url, self.digest(url))
        try:
            with urllib.request.urlopen(url, timeout=timeout_s) as resp:
                data = resp.read()
        except (OSError, ValueError) as exc:
            return FetchResult(url, None, f"{type(exc).__name__}: {exc}")
        return FetchResult(url, self.put(url, data))


def url_name(url: str) -> str:
    """The file name a URL's file goes by in an inbox folder: a short hash of the URL (many
    task files share a last path part, e.g. ``setup.sh``) and the URL's last path part."""
    tail = url.split("?", 1)[0].rstrip("/").rsplit("/", 1)[-1]
    safe = "".join(c if c.isalnum() or c in "._-" else "_" for c in tail)[:80]
    return f"{hashlib.sha256(url.encode()).hexdigest()[:12]}-{safe or 'file'}"


def is_remote(url: str) -> bool:
    return url.startswith(("http://", "https://"))


def _getter_urls(getter: Any) -> Iterator[str]:
    if getter is None or getter.type not in ("cloud_file", "cache_file"):
        return
    path = getter.params.get("path")
    for p in path if isinstance(path, list) else [path]:
        if isinstance(p, str) and is_remote(p):
            yield p


def _step_urls(steps: Iterable[Any]) -> Iterator[str]:
    for s in steps:
        if s.type == "download":
            for f in s.parameters.get("files", []):
                url = f.get("url") if isinstance(f, dict) else None
                if isinstance(url, str) and is_remote(url):
                    yield url


def task_urls(task: Any) -> list[str]:
    """Every remote URL a task's setup, postconfig and getters read (pure; in order, once)."""
    ev = task.evaluator
    urls = [*_step_urls(task.config), *_step_urls(ev.postconfig)]
    for g in (*ev.results, *ev.expected):
        urls += _getter_urls(g)
    return list(dict.fromkeys(urls))
