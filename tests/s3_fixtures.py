"""moto S3 server fixtures (owned by the object-store work)."""
