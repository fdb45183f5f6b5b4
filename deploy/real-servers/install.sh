#!/usr/bin/env bash
# Installs real NVIDIA Triton (the tritonserver that PyPI's nvidia-pytriton bundles) and real
# MLServer into one virtualenv made from Debian's /usr/bin/python3.11, for gpuplane's tests.
#
#   deploy/real-servers/install.sh        # idempotent; a second run with nothing changed is a no-op
#
# Where: ${GPUPLANE_REAL_SERVERS:-${XDG_CACHE_HOME:-$HOME/.cache}/gpuplane/real-servers} ($ROOT),
# outside the work tree, so every clone on the machine shares one install. Layout:
#   $ROOT/current -> envs/<stamp>-<time>-<pid>   the complete install in use (switched atomically)
#   $ROOT/venv    -> current/venv     the virtualenv ($ROOT/venv/bin/python, .../mlserver)
#   $ROOT/bin     -> current/bin      $ROOT/bin/tritonserver: the wrapper that runs Triton standalone
#   $ROOT/triton-backends -> current/triton-backends   backends/ with the python 3.11 stub in python/
#
# Crash safety: an install is built in a new envs/<stamp>-<time>-<pid>/ (its final path: a virtualenv cannot be
# moved), its stamp file is written last, and only then does `current` move to it (a rename). A
# build that dies leaves `current` as it was; the next run deletes the half-built directory and
# starts that one again. Concurrent runs serialise on $ROOT/.lock.
set -euo pipefail

# Bump when the layout below (directories, the wrapper) changes, so installs are rebuilt.
LAYOUT_VERSION=2
PY=/usr/bin/python3.11
PYVER=3.11

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REQ="$HERE/requirements.txt"
ROOT="${GPUPLANE_REAL_SERVERS:-${XDG_CACHE_HOME:-$HOME/.cache}/gpuplane/real-servers}"

STEP="start"
LOG=""
on_exit() {
    local rc=$?
    if [ "$rc" -ne 0 ]; then
        echo "install.sh: FAILED at step: $STEP (exit $rc)" >&2
        if [ -n "$LOG" ] && [ -s "$LOG" ]; then
            echo "install.sh: last lines of $LOG:" >&2
            tail -n 25 "$LOG" >&2 || true
        fi
    fi
}
trap on_exit EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
trap 'exit 129' HUP

step() { STEP="$1"; echo "install.sh: $1" >&2; }

STEP="hashing $REQ"
[ -r "$REQ" ] || { echo "install.sh: missing $REQ" >&2; exit 1; }
pyid="$( [ -x "$PY" ] && "$PY" -c 'import sys; print(sys.version)' 2>/dev/null || echo none)"
STAMP="$( { cat "$REQ"; echo "layout=$LAYOUT_VERSION"; echo "python=$pyid"; } | sha256sum | cut -c1-16)"

installed() {
    [ "$(cat "$ROOT/current/stamp" 2>/dev/null || true)" = "$STAMP" ] \
        && [ -x "$ROOT/bin/tritonserver" ] && [ -x "$ROOT/venv/bin/python" ]
}

# Fast path: nothing changed.
if installed; then
    echo "gpuplane real servers: ready in $ROOT (stamp $STAMP, up to date)"
    exit 0
fi

STEP="creating $ROOT"
mkdir -p "$ROOT/envs"
exec 9>"$ROOT/.lock"
STEP="waiting for the lock $ROOT/.lock"
flock 9
# Another run may have finished while we waited.
if installed; then
    echo "gpuplane real servers: ready in $ROOT (stamp $STAMP, up to date)"
    exit 0
fi

# --- Debian's python3.11 with venv/ensurepip, and libpython3.11 for Triton's python stub ---
step "checking $PY, its venv module and libpython$PYVER"
need_apt=()
[ -x "$PY" ] || need_apt+=(python3.11)
if [ ! -x "$PY" ] || ! "$PY" -c 'import venv, ensurepip' >/dev/null 2>&1; then
    need_apt+=(python3.11-venv)
fi
ldconfig -p 2>/dev/null | grep -q "libpython$PYVER.so.1.0" || need_apt+=(libpython3.11)
if [ "${#need_apt[@]}" -gt 0 ]; then
    step "apt-get install ${need_apt[*]}"
    export DEBIAN_FRONTEND=noninteractive
    if ! apt-get install -y --no-install-recommends "${need_apt[@]}"; then
        step "apt-get update, then apt-get install ${need_apt[*]}"
        apt-get update
        apt-get install -y --no-install-recommends "${need_apt[@]}"
    fi
    # The stamp names the interpreter's version: recompute in case it was just installed.
    pyid="$("$PY" -c 'import sys; print(sys.version)')"
    STAMP="$( { cat "$REQ"; echo "layout=$LAYOUT_VERSION"; echo "python=$pyid"; } | sha256sum | cut -c1-16)"
fi

# --- build envs/<stamp>-<time>-<pid> (a fresh name: never the directory `current` points at) ---
ENV="$ROOT/envs/$STAMP-$(date +%s)-$$"
step "clearing half-built installs in $ROOT/envs"
cur="$(readlink "$ROOT/current" 2>/dev/null || true)"
for d in "$ROOT"/envs/*; do
    [ -d "$d" ] || continue
    [ "envs/$(basename "$d")" = "$cur" ] && continue
    rm -rf "$d"
done
mkdir -p "$ENV"
LOG="$ENV/install.log"
: >"$LOG"

step "creating the virtualenv $ENV/venv from $PY"
"$PY" -m venv "$ENV/venv" >>"$LOG" 2>&1
VPY="$ENV/venv/bin/python"

step "pip install -r $REQ (about 700 MB; a few minutes the first time)"
"$VPY" -m pip install --no-input -r "$REQ" >>"$LOG" 2>&1
step "pip check"
"$VPY" -m pip check >>"$LOG" 2>&1

step "locating the bundled tritonserver"
SP="$("$VPY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
TS="$SP/pytriton/tritonserver"
LIBS="$SP/nvidia_pytriton.libs"
STUB="$TS/python_backend_stubs/$PYVER/triton_python_backend_stub"
for f in "$TS/bin/tritonserver" "$TS/backends/python/libtriton_python.so" "$STUB" "$LIBS"; do
    [ -e "$f" ] || { echo "install.sh: nvidia-pytriton lacks $f" >&2; exit 1; }
done

step "laying out $ENV/triton-backends (backends/ plus the python $PYVER stub)"
cp -a "$TS/backends" "$ENV/triton-backends"
cp "$STUB" "$ENV/triton-backends/python/triton_python_backend_stub"
chmod 0755 "$ENV/triton-backends/python/triton_python_backend_stub"
cp -a "$TS/caches" "$ENV/triton-caches"

step "writing the wrapper $ENV/bin/tritonserver"
mkdir -p "$ENV/bin"
cat >"$ENV/bin/tritonserver.tmp" <<EOF
#!/bin/sh
# Runs the tritonserver that nvidia-pytriton bundles, standalone, with python-backend models.
# Written by deploy/real-servers/install.sh (layout $LAYOUT_VERSION). Extra arguments go to
# tritonserver; later flags override the defaults here.
export LD_LIBRARY_PATH="$LIBS\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
export PATH="$ENV/venv/bin:\$PATH"
exec "$TS/bin/tritonserver" \\
    --backend-directory="$ENV/triton-backends" \\
    --cache-directory="$ENV/triton-caches" \\
    "\$@"
EOF
chmod 0755 "$ENV/bin/tritonserver.tmp"
mv "$ENV/bin/tritonserver.tmp" "$ENV/bin/tritonserver"

step "checking the wrapper runs (tritonserver --help)"
"$ENV/bin/tritonserver" --help >>"$LOG" 2>&1 || {
    # tritonserver --help exits non-zero on some builds; what matters is that it loaded.
    grep -q -- '--model-repository' "$LOG"
}

step "writing the stamp and switching $ROOT/current"
echo "$STAMP" >"$ENV/stamp.tmp"
sync -f "$ENV/stamp.tmp" 2>/dev/null || true
mv "$ENV/stamp.tmp" "$ENV/stamp"
ln -sfn "envs/$(basename "$ENV")" "$ROOT/current.tmp"
mv -T "$ROOT/current.tmp" "$ROOT/current"
for l in venv bin triton-backends; do
    if [ "$(readlink "$ROOT/$l" 2>/dev/null || true)" != "current/$l" ]; then
        rm -rf "$ROOT/$l"
        ln -s "current/$l" "$ROOT/$l"
    fi
done

step "removing superseded installs"
for d in "$ROOT"/envs/*; do
    [ "$d" = "$ENV" ] || rm -rf "$d"
done

STEP="done"
echo "gpuplane real servers: ready in $ROOT (stamp $STAMP, installed now)"
