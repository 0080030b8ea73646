"""The one path layer: every path the project takes (workdir, data_dir, vocab_path,
init_from, export output) goes through `path`, so gs://, other cloud URLs, local paths and
`file://` URLs behave the same.

etils.epath handles gs:// and local paths but has no `file://` scheme, and TFDS/TensorFlow
read local paths directly; so a `file://` URL is turned into its local path here, once.
"""

import os
import urllib.parse

from etils import epath

FILE_SCHEME = "file://"


def resolve(p: str | os.PathLike) -> str:
    """`p` as a string every reader takes: `file:///a/b` -> `/a/b`; anything else unchanged."""
    s = os.fspath(p)
    if s.startswith(FILE_SCHEME):
        parsed = urllib.parse.urlparse(s)
        if parsed.netloc not in ("", "localhost"):
            raise ValueError(f"{s!r}: a file:// URL must name a local path (file:///path)")
        return urllib.parse.unquote(parsed.path)
    return s


def path(p: str | os.PathLike) -> epath.Path:
    """`p` as an epath.Path (local, gs://, or a `file://` URL's local path)."""
    return epath.Path(resolve(p))


def is_remote(p: str | os.PathLike) -> bool:
    """True for a cloud URL such as gs://: no memory maps, no local file locks."""
    return "://" in resolve(p)
