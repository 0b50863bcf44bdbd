#!/usr/bin/env bash
# Boots the NFS test guest and runs one script in it; see tests/nfs/guest.py (the harness) for
# what the guest sets up and what comes back. Builds the image first if the cache lacks it.
#   scripts/nfs-guest/run.sh SCRIPT --out DIR [--file NAME=HOSTPATH]... [--timeout S]
# Exits with the script's status (125: the guest did not boot or gave nothing back).
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
py=python3
[ -x "$repo/.venv/bin/python" ] && py="$repo/.venv/bin/python"
exec "$py" "$repo/tests/nfs/guest.py" "$@"
