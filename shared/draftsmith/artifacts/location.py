"""Where a run lives: a local folder (the default) or an object-store URL reached through fsspec.

``runs_dir`` may be a path (``runs``, ``/data/runs``) or a URL whose scheme fsspec knows (``s3://bucket/runs``;
``gs://``, ``az://`` with gcsfs / adlfs installed). A local path stays a :class:`pathlib.Path` and keeps the
local layer's guarantees (atomic rename, ``flock``, the append-only journal); a URL becomes a
:class:`upath.UPath` (universal-pathlib: pathlib's API over fsspec) and the stages switch to what an object store
offers: objects written once under unique names, put-if-absent where the store honours it, done work derived from
listings.

Credentials never live in settings or URLs: s3fs reads the standard AWS variables from the environment
(``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_ENDPOINT_URL`` for an S3-compatible store such as
SeaweedFS or MinIO), as the AWS CLI does.
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, TypeAlias

from draftsmith.errors import StorageError

if TYPE_CHECKING:
    from upath import UPath

# where a run or one of its files lives: a local path, or an object-store URL as an UPath (what run_location returns)
Location: TypeAlias = "Path | UPath"

_LOCAL_SCHEMES = ("", "file", "local")
_SCHEME = re.compile(r"^([a-zA-Z][a-zA-Z0-9+.-]*)://")


def scheme_of(location: Location | str | os.PathLike) -> str:
    """The URL scheme of ``location`` (``"s3"``), or ``""`` for a local path (``file://`` counts as local)."""
    if isinstance(location, Path):
        return ""
    proto = getattr(location, "protocol", None)
    if proto is not None:  # an UPath
        proto = proto[0] if isinstance(proto, (tuple, list)) else proto
        return "" if proto in _LOCAL_SCHEMES else str(proto)
    m = _SCHEME.match(os.fspath(location) if isinstance(location, os.PathLike) else str(location))
    scheme = m.group(1).lower() if m else ""
    return "" if scheme in _LOCAL_SCHEMES else scheme


def is_remote(location: Location | str | os.PathLike) -> bool:
    """Whether ``location`` (a path, a URL string or an UPath) is on an object store rather than a local disk."""
    return bool(scheme_of(location))


def run_location(value: Location | str | os.PathLike) -> Location:
    """``value`` as the object the stages use: a :class:`pathlib.Path` for a local path (``file://`` stripped), an
    :class:`upath.UPath` for an object-store URL.

    Raises:
        StorageError: the URL's scheme has no fsspec implementation installed (the message names the package).
    """
    if isinstance(value, Path):
        return value
    if not is_remote(value):
        text = os.fspath(value) if isinstance(value, os.PathLike) else str(value)
        return Path(text[len("file://") :] if text.startswith("file://") else text)
    if getattr(value, "protocol", None) is not None:
        return value
    from upath import UPath

    url = str(value).rstrip("/")
    try:
        # no listings cache: other hosts write the run meanwhile, and a cached listing (with its ETags) would hide
        # their objects, or fail a read of an object replaced since ("FileExpired")
        return UPath(url, use_listings_cache=False)
    except (ImportError, ValueError) as e:
        raise StorageError(
            f"no fsspec file system for {mask_url(url)} ({e})",
            "install the scheme's package (s3fs for s3://, gcsfs for gs://, adlfs for az://)",
        ) from e


def run_key(root: Location | str) -> str:
    """One spelling of a run root for Redis keys, job ids and comparisons: the absolute path of a local folder,
    the URL of a remote one (the same run reached from every host has the same key when it is a URL)."""
    if is_remote(root):
        return str(root).rstrip("/")
    return str(Path(root).resolve())


def local_root(stage_dir: Path, run_root: Location | str) -> Path:
    """This host's working copy of the run at URL ``run_root``: ``<stage_dir>/<12 hex of the URL>/<run>`` (a hash,
    so two stores or buckets with the same run name never share a copy)."""
    h = hashlib.sha1(run_key(run_root).encode()).hexdigest()[:12]
    return Path(stage_dir).expanduser() / h / run_location(run_root).name


_USERINFO = re.compile(r"(://)([^/@]*)@")


def mask_url(url: object) -> str:
    """``url`` with any ``user:secret@`` part replaced by ``***@`` (a URL is printed, a secret never)."""
    return _USERINFO.sub(r"\1***@", str(url))


def describe_store_error(location: Location | str, e: BaseException) -> StorageError:
    """One clear line for a failure to reach ``location`` on an object store: the URL (secrets masked), what the
    store answered and the fix.

    Args:
        location: the run root or object the operation was on.
        e: what fsspec / the store's client raised.
    """
    url = mask_url(location)
    text = f"{type(e).__name__}: {e}"
    low = text.lower()
    if "nosuchbucket" in low or "bucket does not exist" in low or "specified bucket" in low:
        return StorageError(
            f"the bucket of {url} does not exist ({e})",
            "create it (e.g. `aws s3 mb`, or your store's console) or fix runs_dir",
        )
    if isinstance(e, PermissionError) or any(
        k in low
        for k in (
            "accessdenied",
            "access denied",
            "invalidaccesskeyid",
            "signaturedoesnotmatch",
            "signature we calculated",
            "forbidden",
            "403",
            "credentials",
        )
    ):
        return StorageError(
            f"the object store refused access to {url} ({type(e).__name__})",
            "check AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY (or your store's credentials) in "
            "this process's environment",
        )
    if any(k in low for k in ("connect", "endpoint", "timed out", "timeout", "name or service", "refused")):
        endpoint = os.environ.get("AWS_ENDPOINT_URL") or "the store's default endpoint"
        return StorageError(
            f"the object store of {url} cannot be reached at {mask_url(endpoint)} ({type(e).__name__})",
            "start the store or fix AWS_ENDPOINT_URL; finished work on it is kept, and the stage "
            "resumes when it is back",
        )
    return StorageError(
        f"object store error on {url} ({text[:300]})",
        "check runs_dir, the store and its credentials (AWS_* variables)",
    )


def probe(root: Location) -> None:
    """Check that the object store of ``root`` answers and its bucket exists: one listing call. A local path is not
    probed (the local stages check their disk themselves).

    Raises:
        StorageError: the bucket is missing, access is refused or the store is unreachable (one line, URL masked).
    """
    if not is_remote(root):
        return
    fs, bucket = root.fs, str(root.path).split("/", 1)[0]
    try:
        # a listing, not `exists`: s3fs answers a refused `exists` with False, which would read as "no bucket"
        fs.ls(bucket, detail=False, refresh=True)
    except FileNotFoundError as e:
        raise describe_store_error(root, FileNotFoundError(f"NoSuchBucket: {bucket}")) from e
    except Exception as e:  # the client's own error types differ per store and version
        raise describe_store_error(root, e) from e


def put_if_absent(path: UPath, data: bytes) -> bool:
    """Create the object ``path`` with ``data`` unless it exists; returns False when it existed.

    On S3 (and compatibles that honour it) this is one conditional PUT (``If-None-Match: *``, HTTP 412 when the key
    exists), so two hosts can never both create the same object; elsewhere fsspec's ``mode="create"``.

    Raises:
        StorageError: the store failed for another reason (message as :func:`describe_store_error`).
    """
    fs = path.fs
    target = path.path
    try:
        fs.pipe_file(target, data, mode="create")
        return True
    except FileExistsError:
        return False
    except OSError as e:
        if "pre-condition" in str(e).lower() or "precondition" in str(e).lower():
            return False
        raise describe_store_error(path, e) from e
    except Exception as e:
        raise describe_store_error(path, e) from e


def list_names(folder: UPath, suffix: str) -> list[str]:
    """Names (not paths) of the objects directly in ``folder`` that end with ``suffix``, sorted; hidden names
    (``.``) left out; a missing folder lists as empty.

    Raises:
        StorageError: the store failed (unreachable, access refused).
    """
    fs = folder.fs
    try:
        entries = fs.ls(folder.path, detail=False, refresh=True)
    except FileNotFoundError:
        return []
    except Exception as e:
        raise describe_store_error(folder, e) from e
    names = (str(p).rstrip("/").rsplit("/", 1)[-1] for p in entries)
    return sorted(n for n in names if n.endswith(suffix) and not n.startswith("."))


def read_bytes(path: Location) -> bytes:
    """The content of file or object ``path``.

    Raises:
        FileNotFoundError: no such file or object.
        StorageError: the object store failed otherwise.
    """
    if not is_remote(path):
        return Path(path).read_bytes()
    try:
        return path.fs.cat_file(path.path)
    except FileNotFoundError:
        raise
    except Exception as e:
        raise describe_store_error(path, e) from e


def write_bytes(path: UPath, data: bytes) -> None:
    """Replace object ``path`` with ``data`` (one PUT: readers see the old or the new object, never half).

    Raises:
        StorageError: the store failed.
    """
    try:
        path.fs.pipe_file(path.path, data)
    except Exception as e:
        raise describe_store_error(path, e) from e
