#!/usr/bin/env bash
# Download the SGLang release wheels kvparity drives as real worlds into DIR (default: wheels/ in
# the repository), for a machine without a network: there, set KVPARITY_SGLANG_WHEELS=DIR and
# kvparity installs them from that folder (pip --no-index --find-links DIR).
#   bash scripts/fetch_sglang_wheels.sh [DIR] [VERSION ...]   (default versions: 0.5.3 0.5.3.post1)
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
dir=${1:-$root/wheels}
shift || true
versions=("$@")
[ ${#versions[@]} -gt 0 ] || versions=(0.5.3 0.5.3.post1)
mkdir -p "$dir"
for v in "${versions[@]}"; do
  python3 -m pip download -q --no-deps --disable-pip-version-check -d "$dir" "sglang==$v"
done
ls "$dir"
