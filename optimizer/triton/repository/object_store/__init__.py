"""Model repositories in object storage (`s3://`): the same publish rules as a folder, through boto3.

    location.py  s3://bucket/prefix and Triton's s3://host:port/bucket/prefix -> StoreLocation
    client.py    ObjectStore: boto3 with the AWS tools' endpoint, region and credential resolution; errors that name the fix
    upload.py    the publish order that never lets Triton load a half-written model (config.pbtxt gates it), the manifest

boto3 is imported only when a store is used.
"""

from optimizer.triton.repository.object_store.client import ObjectStore
from optimizer.triton.repository.object_store.location import StoreLocation, parse_location, store_url
from optimizer.triton.repository.object_store.upload import MANIFEST, check_store_target, publish_to_store, read_model

__all__ = ["MANIFEST", "ObjectStore", "StoreLocation", "check_store_target", "parse_location", "publish_to_store", "read_model", "store_url"]
