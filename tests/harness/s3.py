"""An S3 endpoint as the tests and benchmarks reach one (moto's: tests/s3_fixtures.py in the
test process, tests/harness/stack.py `moto_process` in a process of its own)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

MOTO_ACCESS_KEY = "testing-access-key"
MOTO_SECRET_KEY = "testing-secret-key"
MOTO_REGION = "us-east-1"


@dataclass(frozen=True)
class S3Endpoint:
    url: str
    access_key_id: str = MOTO_ACCESS_KEY
    secret_access_key: str = MOTO_SECRET_KEY
    region: str = MOTO_REGION

    def client(self) -> Any:
        import boto3
        from botocore.config import Config

        return boto3.client(
            "s3",
            endpoint_url=self.url,
            region_name=self.region,
            aws_access_key_id=self.access_key_id,
            aws_secret_access_key=self.secret_access_key,
            config=Config(signature_version="s3v4", s3={"addressing_style": "path"}),
        )
