#!/usr/bin/env bash
# Starts the compose cluster (deploy/compose) on this machine's Docker engine and checks it
# end to end with gpuctl: a leader is elected, a manifest applies, the agents register and
# a plan is committed; the leader's container is killed, a new leader is elected and
# gpuctl still reads and writes; the killed controller comes back and catches up.
# Everything it started is removed on exit (containers, volumes, network, image).
#
#   deploy/ci/compose-check.sh
#
# Needs: cargo, docker (engine + `docker compose` or docker-compose), jq, readelf. No
# registry: the image is FROM scratch with binaries built here (build-image.sh), or with
# those of GPUPLANE_PREBUILT=DIR as they are (build-image.sh says when; needs objcopy and ldd).
set -euo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
project=gpuplane-check-$$
image=gpuplane-check:$$
compose_file=$root/deploy/compose/compose.yaml
t0=$SECONDS

say() { printf 'compose-check [%4ds] %s\n' "$((SECONDS - t0))" "$*"; }
fail() {
  say "FAILED: $*" >&2
  exit 1
}

if docker compose version >/dev/null 2>&1; then
  compose=(docker compose)
elif command -v docker-compose >/dev/null; then
  compose=(docker-compose)
else
  fail "neither \`docker compose\` nor docker-compose is installed"
fi
for tool in docker jq readelf cargo; do
  command -v "$tool" >/dev/null || fail "$tool is not installed"
done
dc() { "${compose[@]}" -p "$project" -f "$compose_file" "$@"; }

export GPUPLANE_IMAGE=$image RUST_LOG=info,openraft=warn
# Ephemeral host ports, so a dev cluster on 7401-7403 (or a second check) cannot clash.
export GPUPLANE_PORT_1= GPUPLANE_PORT_2= GPUPLANE_PORT_3=
export GPUPLANE_METRICS_PORT_1= GPUPLANE_METRICS_PORT_2= GPUPLANE_METRICS_PORT_3=

started=0
cleanup() {
  local rc=$?
  if [ "$started" = 1 ]; then
    if [ "$rc" != 0 ]; then
      echo "---- container logs (last 80 lines each) ----" >&2
      dc logs --no-color --tail=80 >&2 || true
    fi
    dc down -v --remove-orphans >/dev/null 2>&1 || say "compose down failed"
  fi
  docker rmi -f "$image" >/dev/null 2>&1 || true
  [ -n "${tls:-}" ] && rm -rf "$tls"
  [ "$rc" = 0 ] && say "OK (all checks passed)" || say "exit $rc"
  exit "$rc"
}
trap cleanup EXIT

if [ -n "${GPUPLANE_PREBUILT:-}" ]; then
  say "building image $image of the binaries in $GPUPLANE_PREBUILT"
else
  say "building static binaries and image $image"
fi
"$root/deploy/ci/build-image.sh" "$image"
case ${GPUPLANE_PROFILE:-dev} in dev) profile_dir=debug ;; *) profile_dir=$GPUPLANE_PROFILE ;; esac
gpuctl_bin=${GPUPLANE_PREBUILT:-$root/target/static/x86_64-unknown-linux-gnu/$profile_dir}/gpuctl

# Every link is mutually authenticated: a development CA and certificates for this run,
# readable by the image's user.
tls=$(mktemp -d)
export GPUPLANE_TLS_DIR=$tls
"$gpuctl_bin" certs --out "$tls" --controllers 1,2,3 --nodes sim-1,sim-2,sim-3 --admin compose-check \
  --hosts controller-1,controller-2,controller-3,127.0.0.1,localhost >/dev/null || fail "gpuctl certs"
chown -R 65532:65532 "$tls"
say "ok: gpuctl certs (development CA and certificates in $tls)"

say "starting project $project (${compose[*]})"
started=1
dc up -d --no-build 2>&1 | grep -v '^Creating' || true
[ "$(dc ps -q | wc -l)" = 6 ] || fail "compose up: $(dc ps -q | wc -l) of 6 containers created"
# The controllers' published host ports (ephemeral: a restarted container gets new ones).
refresh_servers() {
  local n addrs=()
  for n in 1 2 3; do
    addrs+=("$(dc port controller-$n 7400 2>/dev/null | tail -1)")
  done
  servers_csv=$(IFS=,; echo "${addrs[*]}")
}
refresh_servers
say "controllers published on $servers_csv"
gpuctl() { "$gpuctl_bin" --ca "$tls/ca.pem" --cert "$tls/admin-compose-check.pem" --key "$tls/admin-compose-check.key" -s "$servers_csv" "$@"; }

# Polls "$@" every second until it succeeds or $timeout seconds pass.
wait_for() {
  local what=$1 timeout=$2
  shift 2
  local deadline=$((SECONDS + timeout))
  until "$@" >/dev/null 2>&1; do
    [ "$SECONDS" -lt "$deadline" ] || fail "$what: not within ${timeout} s"
    sleep 1
  done
  say "ok: $what"
}

# The id of the leader that the reachable controllers agree on, not equal to $1 (0 = any).
leader_other_than() {
  gpuctl -o json cluster status 2>/dev/null |
    jq -e --argjson not "$1" '[.[] | select(.state == "Leader" and .node_id != $not) | .node_id] | if length == 1 then .[0] else empty end'
}
has_leader() { leader_other_than 0; }
nodes_registered() { [ "$(gpuctl -o json get nodes | jq '[.[] | select(.name | startswith("sim-"))] | length')" = 3 ]; }
plan_committed() { gpuctl -o json get plan current | jq -e '.spec.gpus | length > 0'; }
# An agent ran its part of the plan: its workloads are up behind routers it reports.
plan_running() { gpuctl -o json get nodes | jq -e '[.[] | .status.endpoints // {} | length] | add > 0'; }

wait_for "a leader is elected" 60 has_leader
leader=$(leader_other_than 0)
say "leader: controller-$leader"

gpuctl apply -f "$root/deploy/examples/sample-cluster.yaml" >/dev/null || fail "gpuctl apply"
say "ok: gpuctl apply -f deploy/examples/sample-cluster.yaml"
wait_for "the 3 agents registered their nodes" 60 nodes_registered
wait_for "a plan is committed" 90 plan_committed
wait_for "an agent runs its part of the plan (router endpoints in its node status)" 60 plan_running

container=$(dc ps -q controller-"$leader")
docker kill "$container" >/dev/null
killed_at=$SECONDS
say "killed the leader's container (controller-$leader)"
wait_for "a new leader is elected among the other two" 30 leader_other_than "$leader"
new_leader=$(leader_other_than "$leader")
say "new leader: controller-$new_leader, $((SECONDS - killed_at)) s after the kill"

tenant_manifest='kind: Tenant
name: compose-check
spec: {display_name: compose check}'
apply_tenant() { printf '%s\n' "$tenant_manifest" | gpuctl apply -f -; }
wait_for "gpuctl writes with a controller down (apply a Tenant)" 30 apply_tenant
wait_for "gpuctl reads it back (linearizable get)" 10 gpuctl get tenant compose-check
wait_for "gpuctl lists services" 10 gpuctl get services

dc start controller-"$leader" >/dev/null 2>&1 || fail "restarting controller-$leader"
say "restarted controller-$leader"
caught_up() {
  refresh_servers || return 1
  gpuctl -o json cluster status | jq -e --argjson id "$leader" '
    ([.[] | select(.state == "Leader") | .commit_index]) as $commit
    | (.[] | select(.node_id == $id)) as $me
    | ($commit | length) == 1 and $me.leader_id > 0 and $me.applied_index >= $commit[0]'
}
wait_for "controller-$leader rejoined and caught up" 60 caught_up
say "checked in $((SECONDS - t0)) s"
