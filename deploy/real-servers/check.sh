#!/usr/bin/env bash
# Proves the real servers work: installs them if needed (install.sh, a no-op when up to date),
# then runs check.py with the real-servers virtualenv's python. check.py starts standalone Triton
# and MLServer on free loopback ports, checks exact outputs over gRPC and HTTP, measures, and
# stops both servers whatever happens. Arguments go to check.py (--triton-mode, --serial, --json).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="${GPUPLANE_REAL_SERVERS:-${XDG_CACHE_HOME:-$HOME/.cache}/gpuplane/real-servers}"
"$HERE/install.sh"
exec "$ROOT/venv/bin/python" "$HERE/check.py" --root "$ROOT" "$@"
