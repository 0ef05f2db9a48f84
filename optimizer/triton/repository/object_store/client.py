"""ObjectStore: a boto3 S3 client bound to one repository, whose failures are one line a user can act on.

Endpoint, region and credentials are resolved as the AWS tools resolve them (boto3's own chain:
AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL, AWS_REGION / AWS_DEFAULT_REGION, AWS_ACCESS_KEY_ID / ..., AWS_PROFILE
and ~/.aws); only Triton's `s3://host:port/...` form names the endpoint itself. boto3 is imported here, on
first use, never when the CLI starts.
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Iterator

from optimizer.errors import OptimizerError, PublishError
from optimizer.triton.repository.object_store.location import StoreLocation

log = logging.getLogger(__name__)

CONNECT_TIMEOUT_S = 5
READ_TIMEOUT_S = 120
ATTEMPTS = 3
"""An unreachable endpoint fails in seconds, not after botocore's default minute-long retries."""

_DENIED = {"AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "InvalidToken", "ExpiredToken", "403", "AllAccessDisabled"}
_NO_BUCKET = {"NoSuchBucket", "404"}


@dataclass(frozen=True)
class StoredObject:
    """One object under the repository: its key relative to the listed folder, size and modification time."""

    path: str  # relative to the listed prefix ("1/model.onnx")
    size: int
    last_modified: datetime


class ObjectStore:
    """The bucket of one StoreLocation through boto3; every call raises `error` (an OptimizerError) naming the fix.

    Args:
        location: the repository.
        error: the error type for failures (PublishError when publishing: bad input, exit 2; validate passes RepositoryError).
    """

    def __init__(self, location: StoreLocation, error: type[OptimizerError] = PublishError) -> None:
        self.location = location
        self.error = error
        self._client: Any = None
        self._session: Any = None

    # -- the client ----------------------------------------------------------------------------------
    @property
    def client(self) -> Any:
        """The boto3 S3 client (created on first use: path-style addressing for any endpoint that is not AWS's)."""
        if self._client is None:
            try:
                import boto3
                from botocore.config import Config
            except ImportError as err:
                raise self.error(f"{self.location.url}: an s3:// repository needs boto3, which cannot be imported ({err}); "
                                 "pip install 'aitune-export[s3]'.") from err
            self._session = boto3.session.Session()
            retries = {"max_attempts": ATTEMPTS, "mode": "standard"}
            base = dict(connect_timeout=CONNECT_TIMEOUT_S, read_timeout=READ_TIMEOUT_S, retries=retries)
            with self._errors("open"):
                client = self._session.client("s3", endpoint_url=self.location.endpoint, config=Config(**base))
                if not self._is_aws(client.meta.endpoint_url):
                    client = self._session.client("s3", endpoint_url=self.location.endpoint,
                                                  config=Config(**base, s3={"addressing_style": "path"}))
            self._client = client
        return self._client

    @property
    def endpoint_url(self) -> str:
        """The endpoint boto3 talks to (the URL's host:port, AWS_ENDPOINT_URL, the profile's, or AWS's)."""
        return self.client.meta.endpoint_url

    @staticmethod
    def _is_aws(endpoint_url: str) -> bool:
        host = (endpoint_url or "").split("://", 1)[-1].split("/", 1)[0].split(":", 1)[0]
        return host.endswith(".amazonaws.com") or host == "amazonaws.com"

    @contextmanager
    def _errors(self, doing: str) -> Iterator[None]:
        """botocore's exceptions -> one line: what failed, and which setting fixes it."""
        from botocore import exceptions as bx

        url = self.location.url
        try:
            yield
        except (bx.NoCredentialsError, bx.PartialCredentialsError, bx.ProfileNotFound) as err:
            raise self.error(f"{url}: no usable AWS credentials ({err}); set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE "
                             "naming a profile in ~/.aws/credentials, as for the aws CLI.") from err
        except (bx.EndpointConnectionError, bx.ConnectTimeoutError, bx.ReadTimeoutError, bx.ConnectionClosedError) as err:
            where = self._client.meta.endpoint_url if self._client is not None else (self.location.endpoint or "the AWS endpoint")
            raise self.error(f"{url}: cannot reach the S3 endpoint {where} while trying to {doing} ({type(err).__name__}); check that the "
                             "storage is running and the host:port in the URL (or AWS_ENDPOINT_URL) is right.") from err
        except bx.ClientError as err:
            code = str(err.response.get("Error", {}).get("Code", ""))
            message = err.response.get("Error", {}).get("Message", "") or str(err)
            where = self._client.meta.endpoint_url if self._client is not None else "the endpoint"
            if code in _NO_BUCKET and doing.startswith("reach"):
                raise self.error(f"{url}: bucket {self.location.bucket!r} does not exist at {where}; create it first "
                                 f"(aws s3 mb s3://{self.location.bucket}) or fix the bucket in the URL.") from err
            if code in _DENIED:
                raise self.error(f"{url}: {where} refused the credentials while trying to {doing} ({code}: {message}); check "
                                 "AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY or AWS_PROFILE, and the bucket's policy.") from err
            raise self.error(f"{url}: S3 could not {doing} ({code}: {message}) at {where}.") from err
        except bx.BotoCoreError as err:  # invalid endpoint URL, bad region, ...: the message names the setting
            raise self.error(f"{url}: boto3 could not {doing}: {err}.") from err

    # -- reads ---------------------------------------------------------------------------------------
    def check(self) -> None:
        """Reach the bucket with the resolved credentials (a HEAD): unreachable, missing or refused fail here, before any write."""
        with self._errors(f"reach bucket {self.location.bucket!r}"):
            self.client.head_bucket(Bucket=self.location.bucket)

    def list(self, folder: str) -> dict[str, StoredObject]:
        """Every object under the repository folder `folder` ("" for the repository), by path relative to it."""
        prefix = self.location.key(folder)
        prefix = prefix + "/" if prefix else ""
        out: dict[str, StoredObject] = {}
        with self._errors(f"list {prefix or 'the bucket'}"):
            for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=self.location.bucket, Prefix=prefix):
                for item in page.get("Contents", []):
                    rel = item["Key"][len(prefix):]
                    if rel and not rel.endswith("/"):
                        out[rel] = StoredObject(rel, int(item["Size"]), item["LastModified"])
        return out

    def folders(self, folder: str = "") -> list[str]:
        """The sub-folders of `folder` (what Triton sees as models in the repository, or versions in a model)."""
        prefix = self.location.key(folder)
        prefix = prefix + "/" if prefix else ""
        names: set[str] = set()
        with self._errors(f"list {prefix or 'the bucket'}"):
            for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=self.location.bucket, Prefix=prefix, Delimiter="/"):
                names.update(p["Prefix"][len(prefix):].strip("/") for p in page.get("CommonPrefixes", []))
        return sorted(n for n in names if n)

    def read(self, path: str) -> bytes | None:
        """The content of the object at repository path `path`, or None when there is none."""
        from botocore.exceptions import ClientError

        key = self.location.key(path)
        with self._errors(f"read {key}"):
            try:
                return self.client.get_object(Bucket=self.location.bucket, Key=key)["Body"].read()
            except ClientError as err:
                if str(err.response.get("Error", {}).get("Code")) in ("NoSuchKey", "404"):
                    return None
                raise

    def sha256(self, path: str) -> str:
        """sha256 of a stored object, streamed (for objects a publish did not write itself)."""
        digest = hashlib.sha256()
        key = self.location.key(path)
        with self._errors(f"read {key}"):
            body = self.client.get_object(Bucket=self.location.bucket, Key=key)["Body"]
            for chunk in iter(lambda: body.read(1 << 20), b""):
                digest.update(chunk)
        return digest.hexdigest()

    def download(self, folder: str, dest: Path) -> Path:
        """Every object under repository folder `folder` into `dest` (for what needs the model's files on this machine)."""
        for rel in self.list(folder):
            target = dest / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            with self._errors(f"download {self.location.key(folder, rel)}"):
                self.client.download_file(self.location.bucket, self.location.key(folder, rel), str(target))
        return dest

    # -- writes --------------------------------------------------------------------------------------
    def put_file(self, path: str, source: Path) -> None:
        """Upload one file (multipart when large: the object appears only when complete, never half-written)."""
        key = self.location.key(path)
        with self._errors(f"upload {key}"):
            self.client.upload_file(str(source), self.location.bucket, key)

    def put_bytes(self, path: str, data: bytes) -> None:
        """Write one small object in one PUT."""
        key = self.location.key(path)
        with self._errors(f"write {key}"):
            self.client.put_object(Bucket=self.location.bucket, Key=key, Body=data)

    def put_newest(self, path: str, data: bytes, newer_than: datetime | None, attempts: int = 5) -> datetime:
        """PUT `data` so that its Last-Modified is later than `newer_than` (S3 keeps whole seconds).

        Triton's repository poller reloads a model only when the newest Last-Modified under its folder grew; a
        config written in the same second as a file it saw before would go unnoticed. Rewritten a second later until
        it is newer (no clock of ours is trusted: the store's own Last-Modified decides).
        """
        for _ in range(attempts):
            self.put_bytes(path, data)
            stamp = self.last_modified(path)
            if newer_than is None or stamp > newer_than:
                return stamp
            time.sleep(max(0.05, 1.05 - (time.time() % 1.0)))
        raise self.error(f"{self.location.url}: the store kept giving {path} the Last-Modified {stamp}, not later than {newer_than}; "
                         "Triton's poller would not notice the change. Check the store's clock.")

    def last_modified(self, path: str) -> datetime:
        """The stored object's Last-Modified."""
        key = self.location.key(path)
        with self._errors(f"read the metadata of {key}"):
            return self.client.head_object(Bucket=self.location.bucket, Key=key)["LastModified"]

    def delete(self, paths: list[str]) -> None:
        """Delete objects, in the order given (one request each: the order is part of the publish protocol)."""
        for path in paths:
            key = self.location.key(path)
            with self._errors(f"delete {key}"):
                self.client.delete_object(Bucket=self.location.bucket, Key=key)

    # -- for tritonserver ----------------------------------------------------------------------------
    def triton_url(self) -> str:
        """The URL Triton's core reads for this repository: with the endpoint boto3 resolved, unless that is AWS's own."""
        endpoint = self.location.endpoint or (None if self._is_aws(self.endpoint_url) else self.endpoint_url)
        return self.location.url_for(endpoint)

    def triton_environment(self) -> dict[str, str]:
        """AWS_* variables for tritonserver: the credentials and region boto3 resolved (profiles, SSO, files included).

        Triton's core reads only AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN, AWS_DEFAULT_REGION and AWS_PROFILE.
        """
        _ = self.client
        env = {"AWS_DEFAULT_REGION": self._session.region_name or os.environ.get("AWS_REGION") or "us-east-1"}
        with self._errors("resolve credentials"):
            creds = self._session.get_credentials()
        if creds is not None:
            frozen = creds.get_frozen_credentials()
            env["AWS_ACCESS_KEY_ID"], env["AWS_SECRET_ACCESS_KEY"] = frozen.access_key, frozen.secret_key
            if frozen.token:
                env["AWS_SESSION_TOKEN"] = frozen.token
        return env
