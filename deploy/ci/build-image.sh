#!/usr/bin/env bash
# Builds gpuplane's static binaries on this host and the from-scratch image from them:
# no builder image, no registry, no BuildKit (deploy/docker/Dockerfile.prebuilt).
#
#   deploy/ci/build-image.sh [IMAGE]          default IMAGE: gpuplane:local
#
# GPUPLANE_PROFILE: cargo profile, `dev` (default: the faster build on a small machine;
# debug info off) or `release`. The binaries go to target/static (own target dir: other
# RUSTFLAGS than the normal build, so the two never invalidate each other).
#
# GPUPLANE_PREBUILT=DIR: no build; the image takes the binaries in DIR as they are,
# dynamically linked, with the shared libraries they load (as `ldd` finds them on this
# host) at the same paths. For the test suite (tests/tests/compose_cluster.rs), whose
# build has just made target/debug's binaries: the static build compiles every crate
# again (other RUSTFLAGS), 6-7 minutes of a 2-core CI run, for binaries that behave the
# same. What this mode does not check is that the binaries still link statically; the
# default mode and deploy/docker/Dockerfile do.
set -euo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
image=${1:-gpuplane:local}
profile=${GPUPLANE_PROFILE:-dev}
triple=x86_64-unknown-linux-gnu
target_dir=$root/target/static
case $profile in
  dev) out=$target_dir/$triple/debug ;;
  *) out=$target_dir/$triple/$profile ;;
esac
bins=(controlplane gpuctl node-agent sim-infer)

# A cargo test that runs this script must not hand its own settings down.
unset CARGO_TARGET_DIR CARGO_BUILD_TARGET_DIR CARGO_ENCODED_RUSTFLAGS CARGO_BUILD_RUSTFLAGS

prebuilt=${GPUPLANE_PREBUILT:-}
if [ -z "$prebuilt" ]; then
  start=$SECONDS
  # glibc linked statically: a from-scratch image has no libc. --target keeps the flag off
  # build scripts and proc macros, which must stay dynamic.
  (cd "$root" && RUSTFLAGS='-C target-feature=+crt-static' CARGO_PROFILE_DEV_DEBUG=0 \
    cargo build --locked -j "${GPUPLANE_BUILD_JOBS:-2}" --profile "$profile" --target "$triple" --target-dir "$target_dir" \
      -p controlplane -p gpuctl -p node-agent $(printf -- '--bin %s ' "${bins[@]}"))
  echo "build-image: static binaries ($profile) in $((SECONDS - start)) s"
fi

ctx=$(mktemp -d)
trap 'rm -rf "$ctx"' EXIT
mkdir -p "$ctx/root/bin" "$ctx/var/lib/gpuplane"
if [ -n "$prebuilt" ]; then
  for b in "${bins[@]}"; do
    [ -x "$prebuilt/$b" ] || { echo "build-image: $prebuilt/$b is missing (GPUPLANE_PREBUILT names a directory with ${bins[*]})" >&2; exit 1; }
    # Without debug info: a quarter of the size, the same program.
    objcopy --strip-debug "$prebuilt/$b" "$ctx/root/bin/$b"
    # The loader and libraries, where the binary looks for them (ldd prints `name => path`
    # for a library and the loader's path alone).
    ldd "$prebuilt/$b" | awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\// { print $1 }'
  done | sort -u | while read -r lib; do
    cp -L --parents "$lib" "$ctx/root/"
  done
else
  for b in "${bins[@]}"; do
    # A dynamic binary would build an image that cannot start; refuse it here.
    if LC_ALL=C readelf -l "$out/$b" | grep -q 'Requesting program interpreter'; then
      echo "build-image: $out/$b is dynamically linked" >&2
      exit 1
    fi
    cp "$out/$b" "$ctx/root/bin/"
  done
fi

start=$SECONDS
docker build -q -f "$root/deploy/docker/Dockerfile.prebuilt" -t "$image" "$ctx" >/dev/null
echo "build-image: $image built in $((SECONDS - start)) s ($(du -sh "$ctx/root/bin" | cut -f1) of binaries)"
