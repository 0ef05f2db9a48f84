"""Where an object-store repository is: `s3://bucket/prefix` (the AWS tools' form) or `s3://host:port/bucket/prefix` (Triton's).

Triton's core reads both: the first with the AWS SDK's default endpoint, the second with an explicit
endpoint (http unless written `s3://https://host:port/...`). Ours accept the same text so one URL works for
`--repository`, `validate` and `tritonserver --model-repository`. The names are held to what Triton's
parser matches (its bucket pattern is S3's naming rule; path components are letters, digits, `.`, `-`, `_`):
a prefix outside it would make Triton read `host:port` as the bucket.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import PurePath
from types import MappingProxyType
from urllib.parse import urlsplit

from optimizer.errors import SettingsError

SCHEME = "s3://"
_ANY_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.\-]*)://")
NOT_YET = MappingProxyType({"gs": "Google Cloud Storage", "as": "Azure Storage"})
"""Schemes Triton's core reads that this tool does not publish to yet (it reads local paths and s3:// too)."""
_ENDPOINT = re.compile(r"^(?:(https?)://)?([0-9A-Za-z.\-]+):([0-9]{1,5})$")
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9]$")
_COMPONENT = re.compile(r"^[0-9A-Za-z._\-]+$")


def store_url(value: str | PurePath | None) -> str | None:
    """The s3:// URL `value` names, or None for a local path.

    A URL that went through `Path()` lost a slash (`s3:/bucket/prefix`, `s3:/https:/host:9000/...`); it is
    recognized and restored, so callers that hold a repository as a Path still reach the store.
    """
    if value is None:
        return None
    text = str(value)
    if text.startswith(SCHEME):
        return text
    if isinstance(value, PurePath) and text.startswith("s3:/"):
        rest = text[len("s3:/"):]
        for scheme in ("https:/", "http:/"):
            if rest.startswith(scheme) and not rest.startswith(scheme + "/"):
                rest = scheme + "/" + rest[len(scheme):]
        return SCHEME + rest
    return None


def check_scheme(value: str | PurePath, what: str = "--repository") -> None:
    """Refuse a repository URL of a scheme we cannot publish to, before `Path()` turns `ftp://host/repo` into a local folder `ftp:`.

    A local path or an s3:// URL passes; gs:// and as:// (which Triton reads) and every other scheme are a SettingsError
    that names what is supported.
    """
    m = _ANY_SCHEME.match(str(value))
    if m is None or str(value).startswith(SCHEME):
        return
    scheme = m.group(1)
    forms = "use a local folder (e.g. model_repository) or s3://BUCKET/PREFIX (s3://HOST:PORT/BUCKET/PREFIX for an S3-compatible endpoint)"
    if scheme in NOT_YET:
        raise SettingsError(f"{what} {str(value)!r}: {scheme}:// ({NOT_YET[scheme]}) repositories are not supported yet, although Triton reads "
                            f"them; {forms}, then copy the repository there yourself.")
    raise SettingsError(f"{what} {str(value)!r}: {scheme}:// is not a model repository Triton can read; {forms}.")


@dataclass(frozen=True)
class StoreLocation:
    """A repository in an S3 bucket: the bucket, the key prefix ("" for the bucket's root) and the endpoint the URL names."""

    bucket: str
    prefix: str
    endpoint: str | None = None  # "http://127.0.0.1:9000" from Triton's form; None: boto3 resolves it (AWS_ENDPOINT_URL, profile, AWS)

    @property
    def url(self) -> str:
        """The canonical URL (Triton's form when it names an endpoint): what reports record and messages show."""
        return self.url_for(self.endpoint)

    def url_for(self, endpoint: str | None) -> str:
        """This repository's URL as Triton's core reads it with `endpoint` (None: the AWS SDK's default endpoint)."""
        path = "/".join(p for p in (self.bucket, self.prefix) if p)
        if endpoint is None:
            return SCHEME + path
        parts = urlsplit(endpoint)
        port = parts.port or (443 if parts.scheme == "https" else 80)
        scheme = "https://" if parts.scheme == "https" else ""
        return f"{SCHEME}{scheme}{parts.hostname}:{port}/{path}"

    def key(self, *parts: str) -> str:
        """The object key of a path inside the repository ("model/1/model.onnx")."""
        return "/".join(p.strip("/") for p in (self.prefix, *parts) if p.strip("/"))

    def model_url(self, name: str) -> str:
        """The URL of one model folder (what report.json records as the published model_dir)."""
        return f"{self.url}/{name}"


def parse_location(value: str | PurePath, what: str = "--repository") -> StoreLocation:
    """`s3://bucket[/prefix]` or `s3://[http[s]://]host:port/bucket[/prefix]` -> StoreLocation; a bad URL is a SettingsError naming `what`."""
    url = store_url(value)
    if url is None:
        raise SettingsError(f"{what} {str(value)!r} is not an s3:// URL.")
    rest = url[len(SCHEME):]
    scheme = ""
    for prefix in ("https://", "http://"):
        if rest.startswith(prefix):
            scheme, rest = prefix[:-3], rest[len(prefix):]
    parts = [p for p in rest.split("/") if p]
    forms = "use s3://BUCKET/PREFIX (endpoint from AWS_ENDPOINT_URL or your AWS profile) or s3://HOST:PORT/BUCKET/PREFIX"
    endpoint = None
    if parts and ":" in parts[0]:
        m = _ENDPOINT.match(parts[0])
        if not m or not 0 < int(m.group(3)) < 65536:
            raise SettingsError(f"{what} {url!r}: {parts[0]!r} is not HOST:PORT (a port from 1 to 65535); {forms}.")
        endpoint = f"{scheme or 'http'}://{m.group(2)}:{m.group(3)}"
        parts = parts[1:]
    elif scheme:
        raise SettingsError(f"{what} {url!r} names {scheme}:// without HOST:PORT; {forms}.")
    if not parts:
        raise SettingsError(f"{what} {url!r} names no bucket; {forms}.")
    bucket, components = parts[0], parts[1:]
    if not _BUCKET.match(bucket) or ".." in bucket:
        raise SettingsError(f"{what} {url!r}: {bucket!r} is not an S3 bucket name (3-63 lowercase letters, digits, '.' or '-', "
                            f"starting and ending with a letter or digit); {forms}.")
    for c in components:
        if not _COMPONENT.match(c) or c in (".", ".."):
            raise SettingsError(f"{what} {url!r}: the path component {c!r} has characters Triton's s3 path parser does not accept; "
                                "use letters, digits, '.', '-' or '_' in each folder name.")
    return StoreLocation(bucket, "/".join(components), endpoint)
