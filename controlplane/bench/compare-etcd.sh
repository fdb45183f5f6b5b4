#!/usr/bin/env bash
# Compares gpuplane's replicated writes and leader failover with etcd's, back to back on
# this machine, in the same shape:
#   - gpuplane: target/release/raft-bench (3 controller processes on loopback, each
#     write acknowledged once a majority flushed it), whose stdout is parsed as its interface;
#   - etcd: a 3-member cluster on loopback (separate processes, own data dirs, default
#     durability: fsync on), loaded through its v3 JSON gateway (POST /v3/kv/put, one
#     ~150-byte JSON document per request) on the leader by wrk with etcd-put.lua beside
#     this script, 1 connection then 64, and the same failover measurement: kill -9 the
#     leader, time until a put to a survivor succeeds, restart it, let it catch up.
# Both report the servers' CPU per acknowledged write (user and system time of the three
# processes over each load level, from /proc; etcd's includes its JSON gateway, gpuplane's
# its gRPC API; the load generator's is left out of both).
# It runs gpuplane then etcd, R times (alternating, so that drift in the machine's load hits
# both alike), prints each run's figures as they finish, then the median over runs of each
# figure for both systems and their ratios, and the host's steal of the CPU during each
# system's runs (from /proc/stat), with a warning over 5%: on a virtual machine whose host
# runs other work, one run's rates can differ from the next by several times.
#
#   controlplane/bench/compare-etcd.sh [--seconds S] [--kills K] [--runs R]
#       --seconds S   seconds of load per concurrency level (default 10)
#       --kills K     leader kills for the failover measurement (default 10)
#       --runs R      runs of each system (default 3)
#
# Needs target/release/raft-bench and target/release/controlplane (cargo build --release
# -p controlplane -p devcluster --bins). Installs etcd-server, wrk and curl with apt-get when missing (as
# root, or through sudo). All traffic stays on 127.0.0.1. Every process it starts and its
# temp dir are removed on exit, Ctrl-C included.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
raft_bench=$root/target/release/raft-bench
controlplane=$root/target/release/controlplane
wrk_script=$here/etcd-put.lua

seconds=10
kills=10
runs=3

# Set as things start, read by cleanup.
work=""
gpuplane_pid=""
wrk_pid=""
declare -a etcd_pid=()

usage() {
  sed -n '/^#   controlplane/,/^#       --runs/s/^# \{0,1\}//p' "${BASH_SOURCE[0]}"
}

die() {
  echo "compare-etcd: $*" >&2
  exit 1
}

say() { echo "== $*"; }

parse_args() {
  while (($#)); do
    case $1 in
      --seconds | --kills | --runs) (($# >= 2)) || die "$1 needs a value" ;;&
      --seconds) seconds=${2:-} && shift 2 ;;
      --kills) kills=${2:-} && shift 2 ;;
      --runs) runs=${2:-} && shift 2 ;;
      -h | --help) usage && exit 0 ;;
      *) usage >&2 && die "unknown argument: $1" ;;
    esac
  done
  [[ $seconds =~ ^[0-9]+$ && $seconds -ge 1 ]] || die "--seconds needs a whole number >= 1"
  [[ $kills =~ ^[0-9]+$ ]] || die "--kills needs a whole number >= 0"
  [[ $runs =~ ^[0-9]+$ && $runs -ge 1 ]] || die "--runs needs a whole number >= 1"
}

check_binaries() {
  local b
  for b in "$raft_bench" "$controlplane"; do
    [[ -x $b ]] || die "$b is missing; build it first: cargo build --release -p controlplane -p devcluster --bins"
  done
  [[ -f $wrk_script ]] || die "$wrk_script is missing (it belongs beside this script)"
}

cleanup() {
  local i
  # raft-bench runs in its own process group (see run_gpuplane): kill the group, so that
  # its controller processes go too; a SIGKILLed raft-bench cannot stop them itself.
  if [[ -n $gpuplane_pid ]]; then
    kill -9 -- "-$gpuplane_pid" 2>/dev/null || kill -9 "$gpuplane_pid" 2>/dev/null || true
    wait "$gpuplane_pid" 2>/dev/null || true
    gpuplane_pid=""
  fi
  if [[ -n $wrk_pid ]]; then
    kill -9 "$wrk_pid" 2>/dev/null || true
    wait "$wrk_pid" 2>/dev/null || true
    wrk_pid=""
  fi
  # SIGKILL rather than SIGTERM: a stopping etcd leader first tries to hand leadership
  # over, which takes seconds when its peers are gone, and the data is thrown away anyway.
  for i in "${!etcd_pid[@]}"; do
    if [[ -n ${etcd_pid[i]} ]]; then
      kill -9 "${etcd_pid[i]}" 2>/dev/null || true
      wait "${etcd_pid[i]}" 2>/dev/null || true
    fi
  done
  etcd_pid=()
  if [[ -n $work && -d $work ]]; then
    rm -rf "$work"
  fi
  work=""
}

print_machine() {
  local cpu load
  cpu=$(awk -F': *' '/^model name/ { print $2; exit }' /proc/cpuinfo 2>/dev/null || true)
  load=$(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || true)
  echo "machine: $(nproc) cores, ${cpu:-unknown CPU}, Linux $(uname -r), load average at start ${load:-?}"
  echo "settings: $seconds s per load level, $kills kills, $runs run(s) of each, alternating gpuplane, etcd, gpuplane, ..."
}

# A fresh machine may lack etcd, wrk or curl: install them from Debian's packages.
ensure_packages() {
  local -a missing=()
  command -v etcd >/dev/null || missing+=(etcd-server)
  command -v wrk >/dev/null || missing+=(wrk)
  command -v curl >/dev/null || missing+=(curl)
  ((${#missing[@]})) || return 0
  command -v apt-get >/dev/null || die "missing ${missing[*]} and no apt-get to install them: install etcd (3.4+), wrk and curl"
  local -a sudo=()
  if [[ $(id -u) -ne 0 ]]; then
    command -v sudo >/dev/null || die "missing ${missing[*]}: run as root or install them"
    sudo=(sudo)
  fi
  say "installing ${missing[*]} (apt-get)"
  local log=$work/apt.log
  # On a machine with systemd, etcd-server's package also starts a system etcd on ports
  # 2379/2380; the clusters here use other ports (free_port), so it is left alone.
  if ! "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -qq >"$log" 2>&1 ||
    ! "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
      "${missing[@]}" >>"$log" 2>&1; then
    tail -20 "$log" >&2
    die "apt-get could not install ${missing[*]}"
  fi
  command -v etcd >/dev/null && command -v wrk >/dev/null && command -v curl >/dev/null ||
    die "etcd, wrk or curl still missing after installing ${missing[*]}"
}

# etcd's JSON gateway moved: /v3alpha (3.2), /v3beta (3.3), /v3 (3.4 on).
etcd_version=""
gateway=""
detect_etcd() {
  etcd_version=$(etcd --version 2>/dev/null | awk '/^etcd Version:/ { print $3; exit }')
  [[ -n $etcd_version ]] || die "could not read the version from 'etcd --version'"
  local major minor
  IFS=. read -r major minor _ <<<"$etcd_version"
  if ((major < 3 || (major == 3 && minor < 2))); then
    die "etcd $etcd_version has no v3 JSON gateway; need 3.2 or later (3.4+ preferred)"
  elif ((major == 3 && minor == 2)); then
    gateway=/v3alpha
  elif ((major == 3 && minor == 3)); then
    gateway=/v3beta
  else
    gateway=/v3
  fi
  # etcd 3.4 refuses to start on arm64 unless told that the platform is unsupported.
  if [[ $(uname -m) == aarch64 ]]; then
    export ETCD_UNSUPPORTED_ARCH=arm64
  fi
}

# gpuplane's Raft timings, read from its source so the output says what failover depends on.
gpuplane_raft_settings() {
  local f=$root/controlplane/src/raft/mod.rs
  awk -F'[:,]' '
    /^ *heartbeat_interval_ms: *[0-9]/ { h = $2 + 0 }
    /^ *election_timeout_min_ms: *[0-9]/ { lo = $2 + 0 }
    /^ *election_timeout_max_ms: *[0-9]/ { hi = $2 + 0 }
    END {
      if (h && lo && hi) printf "heartbeat %dms, election timeout %d-%dms (its defaults)\n", h, lo, hi
      else print "see controlplane/src/raft/mod.rs"
    }' "$f" 2>/dev/null || echo "see controlplane/src/raft/mod.rs"
}

# ---------------------------------------------------------------------------------------
# Results: one "system metric value" line per figure per run; medians are taken over them.

results=""

# Reads raft-bench's stdout format (the etcd side prints the same format, so one parser
# serves both): the table rows "clients writes/s p50 p99 errors CPU/write", the acknowledged-writes
# line and the failover line.
parse_bench_output() {
  local system=$1 file=$2
  awk -v sys="$system" '
    $1 ~ /^[0-9]+$/ && NF >= 5 && $3 ~ /ms$/ {
      sub(/ms$/, "", $3); sub(/ms$/, "", $4)
      print sys, "writes" $1, $2; print sys, "p50_" $1, $3; print sys, "p99_" $1, $4
      print sys, "errors" $1, $5
      if (NF >= 6) { sub(/ms$/, "", $6); print sys, "cpu_" $1, $6 }
    }
    /acknowledged writes lost/ {
      for (i = 2; i + 2 <= NF; i++)
        if ($i == "acknowledged" && $(i + 1) == "writes" && $(i + 2) == "lost") print sys, "lost", $(i - 1)
    }
    /^leader failover/ {
      for (i = 1; i < NF; i++) {
        v = $(i + 1); gsub(/[^0-9.]/, "", v)
        if ($i == "median") print sys, "failover_median", v
        if ($i == "max") print sys, "failover_max", v
      }
    }' "$file" >>"$results"
  local m
  for m in writes1 p50_1 p99_1 writes64 p50_64 p99_64; do
    grep -q "^$system $m " "$results" ||
      die "could not read '$m' from $system's output (has its format changed?):$(printf '\n%s' "$(cat "$file")")"
  done
}

# Median over the runs of one figure ("-" when no run produced it).
median_of() {
  awk -v sys="$1" -v m="$2" '$1 == sys && $2 == m { print $3 }' "$results" | sort -g |
    awk '{ v[NR] = $1 } END {
      if (NR == 0) print "-"
      else if (NR % 2) print v[(NR + 1) / 2]
      else print (v[NR / 2] + v[NR / 2 + 1]) / 2
    }'
}

# The machine's CPU ticks so far: "STEAL TOTAL" from /proc/stat's cpu line (steal is the
# time a virtual machine's host ran something else; "0 0" where there is no such line).
cpu_ticks() {
  awk '/^cpu / { t = 0; for (i = 2; i <= NF; i++) t += $i; print $9 + 0, t; exit }' /proc/stat 2>/dev/null || echo "0 0"
}

# record_steal SYSTEM BEFORE: records the host's steal since BEFORE (cpu_ticks) as a share
# of all CPU time, in percent: a figure taken while the host stole CPU is not comparable.
record_steal() {
  local now
  now=$(cpu_ticks)
  echo "$2 $now" | awk -v sys="$1" '{ d = $4 - $2; if (d > 0) printf "%s steal %.1f\n", sys, 100 * ($3 - $1) / d }' >>"$results"
}

sum_of() {
  awk -v sys="$1" -v m="$2" '$1 == sys && $2 == m { s += $3; n++ } END { print n ? s : "-" }' "$results"
}

# fmt FORMAT VALUE: printf that passes "-" through.
fmt() {
  if [[ $2 == - ]]; then echo -; else awk -v f="$1" -v v="$2" 'BEGIN { printf f, v }'; fi
}

# ratio A B: A/B as "0.42x", or "-" when either is missing or B is 0.
ratio() {
  awk -v a="$1" -v b="$2" 'BEGIN { if (a == "-" || b == "-" || b + 0 == 0) print "-"; else printf "%.2fx", a / b }'
}

# ---------------------------------------------------------------------------------------
# gpuplane

run_gpuplane() {
  local run=$1 out=$work/gpuplane-$run.out err=$work/gpuplane-$run.err rc=0
  say "run $run/$runs: gpuplane (raft-bench --seconds $seconds --kills $kills)"
  # Its own process group, so cleanup can kill it with its controllers; TMPDIR inside the
  # work dir, so the data dirs of a killed raft-bench go with it.
  if command -v setsid >/dev/null; then
    TMPDIR=$work setsid "$raft_bench" --seconds "$seconds" --kills "$kills" >"$out" 2>"$err" &
  else
    TMPDIR=$work "$raft_bench" --seconds "$seconds" --kills "$kills" >"$out" 2>"$err" &
  fi
  gpuplane_pid=$!
  wait "$gpuplane_pid" || rc=$?
  gpuplane_pid=""
  if ((rc != 0)); then
    cat "$out"
    tail -20 "$err" >&2
    die "raft-bench failed (exit $rc)"
  fi
  sed 's/^/   /' "$out"
  parse_bench_output gpuplane "$out"
}

# ---------------------------------------------------------------------------------------
# etcd

etcd_dir=""
etcd_initial_cluster=""
etcd_token=""
declare -a etcd_client_port=() etcd_peer_port=()
declare -a picked_ports=()

# A port nobody listens on, below Linux's ephemeral range (32768+) so that no client's
# outgoing connection takes it meanwhile, and not in picked_ports (runs in a subshell: the
# caller records what it picked).
free_port() {
  local port tries
  for ((tries = 0; tries < 1000; tries++)); do
    port=$((20000 + RANDOM % 12000))
    [[ " ${picked_ports[*]} " == *" $port "* ]] && continue
    # Connecting fails at once on loopback when the port is free.
    if ! (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
      echo "$port"
      return 0
    fi
  done
  die "found no free port"
}

client_url() { echo "http://127.0.0.1:${etcd_client_port[$1]}"; }

# Started with the same flags on a restart: with its data dir present etcd ignores the
# --initial-* flags and rejoins as the member it was.
etcd_start_member() {
  local i=$1 url peer
  url=$(client_url "$i")
  peer=http://127.0.0.1:${etcd_peer_port[i]}
  local -a log_flags=()
  [[ $gateway == /v3 ]] && log_flags=(--logger zap --log-outputs stderr)
  etcd --name "m$i" --data-dir "$etcd_dir/m$i" \
    --listen-client-urls "$url" --advertise-client-urls "$url" \
    --listen-peer-urls "$peer" --initial-advertise-peer-urls "$peer" \
    --initial-cluster "$etcd_initial_cluster" --initial-cluster-state new \
    --initial-cluster-token "$etcd_token" \
    --heartbeat-interval 100 --election-timeout 1000 \
    "${log_flags[@]}" >>"$etcd_dir/m$i.log" 2>&1 &
  etcd_pid[i]=$!
}

etcd_status() {
  curl -s --noproxy '*' --max-time 1 -X POST -d '{}' "$(client_url "$1")$gateway/maintenance/status" || true
}

# json_field NAME JSON: the value of "NAME":"..." (the gateway writes 64-bit numbers as strings).
json_field() {
  sed -n "s/.*\"$1\":\"\\([^\"]*\\)\".*/\\1/p" <<<"$2"
}

# put MEMBER KEY VALUE: one put, 0.3 s at most (as raft-bench's failover client's timeout).
etcd_put() {
  local key value
  key=$(printf '%s' "$2" | base64 | tr -d '\n')
  value=$(printf '%s' "$3" | base64 | tr -d '\n')
  curl -sf --noproxy '*' --max-time 0.3 -o /dev/null -X POST -H 'Content-Type: application/json' \
    -d "{\"key\":\"$key\",\"value\":\"$value\"}" "$(client_url "$1")$gateway/kv/put"
}

# The member (1-3) that is leader by its own account; waits up to 30 s for one.
etcd_leader() {
  local deadline=$((SECONDS + 30)) i st
  while ((SECONDS < deadline)); do
    for i in 1 2 3; do
      [[ -n ${etcd_pid[i]:-} ]] || continue
      st=$(etcd_status "$i")
      local leader member
      leader=$(json_field leader "$st")
      member=$(json_field member_id "$st")
      if [[ -n $leader && $leader != 0 && $leader == "$member" ]]; then
        echo "$i"
        return 0
      fi
    done
    sleep 0.05
  done
  die "etcd elected no leader within 30 s (logs: $etcd_dir/m*.log)"
}

etcd_start_cluster() {
  local run=$1 i
  etcd_dir=$work/etcd-$run
  etcd_token=compare-etcd-$$-$run
  mkdir -p "$etcd_dir"
  picked_ports=()
  etcd_initial_cluster=""
  for i in 1 2 3; do
    etcd_client_port[i]=$(free_port)
    picked_ports+=("${etcd_client_port[i]}")
    etcd_peer_port[i]=$(free_port)
    picked_ports+=("${etcd_peer_port[i]}")
    etcd_initial_cluster+="${etcd_initial_cluster:+,}m$i=http://127.0.0.1:${etcd_peer_port[i]}"
  done
  for i in 1 2 3; do
    etcd_start_member "$i"
  done
  local leader deadline=$((SECONDS + 30))
  leader=$(etcd_leader)
  until etcd_put "$leader" /bench/ready '{}'; do
    ((SECONDS < deadline)) || die "etcd took no write within 30 s (logs: $etcd_dir/m*.log)"
    sleep 0.1
    leader=$(etcd_leader)
  done
}

etcd_stop_cluster() {
  local i
  for i in 1 2 3; do
    if [[ -n ${etcd_pid[i]:-} ]]; then
      kill -9 "${etcd_pid[i]}" 2>/dev/null || true
      wait "${etcd_pid[i]}" 2>/dev/null || true
    fi
  done
  etcd_pid=()
  rm -rf "$etcd_dir"
}

# User and system CPU ticks the running etcd members have used so far (fields 14 and 15
# of /proc/PID/stat; the command name in field 2 has no spaces for etcd).
etcd_cpu_ticks() {
  local i total=0 t
  for i in "${!etcd_pid[@]}"; do
    [[ -n ${etcd_pid[i]} ]] || continue
    t=$(awk '{ print $14 + $15 }' "/proc/${etcd_pid[i]}/stat" 2>/dev/null) || t=0
    total=$((total + ${t:-0}))
  done
  echo "$total"
}

# etcd_load CONNECTIONS THREADS: prints a row in raft-bench's format, with the members' CPU
# per acknowledged write as raft-bench counts the controllers'.
etcd_load() {
  local connections=$1 threads=$2 leader out cpu_before cpu_ticks
  leader=$(etcd_leader)
  cpu_before=$(etcd_cpu_ticks)
  out=$work/wrk-$connections.out
  # 50 distinct keys per connection, as raft-bench's clients each cycle through 50 names.
  # In the background and waited for, so that Ctrl-C or TERM is handled at once, not
  # after the load ends.
  wrk "-t$threads" "-c$connections" "-d${seconds}s" --latency -s "$wrk_script" \
    "$(client_url "$leader")$gateway/kv/put" -- $((50 * connections / threads)) >"$out" 2>&1 &
  wrk_pid=$!
  local rc=0
  wait "$wrk_pid" || rc=$?
  wrk_pid=""
  cpu_ticks=$(($(etcd_cpu_ticks) - cpu_before))
  ((rc == 0)) || die "wrk failed (exit $rc): $(cat "$out")"
  grep -q '^ETCD-PUT ' "$out" || die "wrk printed no ETCD-PUT line: $(cat "$out")"
  awk -v c="$connections" -v ticks="$cpu_ticks" -v hz="$(getconf CLK_TCK)" '/^ETCD-PUT / {
      for (i = 2; i <= NF; i++) { split($i, kv, "="); f[kv[1]] = kv[2] }
      ok = f["requests"] - f["status_errors"]
      printf "%-10s %14.0f %10.2fms %10.2fms %8d %10.3fms\n", c, ok / (f["duration_us"] / 1e6),
        f["p50_us"] / 1000, f["p99_us"] / 1000, f["status_errors"] + f["socket_errors"],
        ticks * 1000 / hz / (ok > 0 ? ok : 1)
    }' "$out"
}

now_ms() { echo $(($(date +%s%N) / 1000000)); }

# One leader kill: the time from kill -9 to the first put a survivor acknowledges; then the
# member is restarted and has to catch up before the next kill (as raft-bench does).
etcd_failover_once() {
  local k=$1 leader
  leader=$(etcd_leader)
  local -a survivors=()
  local i
  for i in 1 2 3; do
    ((i == leader)) || survivors+=("$i")
  done
  etcd_put "$leader" /bench/Service/failover "{\"request_rate\":1.0}" ||
    die "etcd leader m$leader took no write before kill $k"
  local t0 attempt=0 deadline=$((SECONDS + 60))
  t0=$(now_ms)
  kill -9 "${etcd_pid[leader]}"
  wait "${etcd_pid[leader]}" 2>/dev/null || true
  etcd_pid[leader]=""
  # Alternate between the survivors: either may become leader, and a follower forwards a
  # put to the new leader once it knows it.
  until etcd_put "${survivors[attempt % 2]}" /bench/Service/failover "{\"request_rate\":$((k + 2)).0}"; do
    ((SECONDS < deadline)) || die "no put succeeded within 60 s of killing etcd leader m$leader"
    attempt=$((attempt + 1))
    sleep 0.005
  done
  echo $(($(now_ms) - t0)) >>"$etcd_dir/failover.ms"

  etcd_start_member "$leader"
  deadline=$((SECONDS + 60))
  while :; do
    ((SECONDS < deadline)) || die "restarted etcd member m$leader did not catch up within 60 s"
    local st lead lst applied commit
    st=$(etcd_status "$leader")
    applied=$(json_field raftAppliedIndex "$st")
    if [[ -n $applied && $(json_field leader "$st") != 0 ]]; then
      lead=$(etcd_leader)
      lst=$(etcd_status "$lead")
      commit=$(json_field raftIndex "$lst")
      if [[ -n $commit ]] && ((applied >= commit)); then
        break
      fi
    fi
    sleep 0.05
  done
}

run_etcd() {
  local run=$1 out=$work/etcd-$run.out k
  say "run $run/$runs: etcd $etcd_version"
  etcd_start_cluster "$run"
  {
    echo "3 etcd $etcd_version members on loopback (separate processes, fsync on, heartbeat 100ms, election timeout 1000ms: etcd's defaults)"
    printf '%-10s %14s %12s %12s %8s %12s\n' clients writes/s p50 p99 errors CPU/write
    etcd_load 1 1
    etcd_load 64 2
  } >"$out"
  for ((k = 0; k < kills; k++)); do
    etcd_failover_once "$k"
  done
  if ((kills > 0)); then
    sort -n "$etcd_dir/failover.ms" | awk -v k="$kills" '{ v[NR] = $1 } END {
        printf "leader failover (SIGKILL to first successful put), %d kills: median %dms, min %dms, max %dms\n",
          k, v[int((NR - 1) * 0.5 + 0.5) + 1], v[1], v[NR]
      }' >>"$out"
  fi
  etcd_stop_cluster
  sed 's/^/   /' "$out"
  parse_bench_output etcd "$out"
}

# ---------------------------------------------------------------------------------------

# row LABEL GPUPLANE ETCD [RATIO]: one line of the summary table.
row() {
  printf '%-24s %16s %16s' "$1" "$2" "$3"
  if [[ -n ${4:-} ]]; then printf '   %s' "$4"; fi
  echo
}

print_summary() {
  local g e
  echo
  say "median over $runs run(s); ratios above 1 favour gpuplane"
  row "" gpuplane "etcd $etcd_version" ratio
  local c label
  for c in 1 64; do
    if ((c == 1)); then label="1 client "; else label="64 clients"; fi
    g=$(median_of gpuplane "writes$c")
    e=$(median_of etcd "writes$c")
    row "$label writes/s" "$(fmt %.0f "$g")" "$(fmt %.0f "$e")" "$(ratio "$g" "$e") gpuplane/etcd"
    local gp50 gp99 ep50 ep99
    gp50=$(median_of gpuplane "p50_$c")
    gp99=$(median_of gpuplane "p99_$c")
    ep50=$(median_of etcd "p50_$c")
    ep99=$(median_of etcd "p99_$c")
    row "$label p50/p99" "$(fmt %.2f "$gp50")/$(fmt %.2f "$gp99") ms" \
      "$(fmt %.2f "$ep50")/$(fmt %.2f "$ep99") ms" "$(ratio "$ep99" "$gp99") etcd p99/gpuplane p99"
    local gcpu ecpu
    gcpu=$(median_of gpuplane "cpu_$c")
    ecpu=$(median_of etcd "cpu_$c")
    row "$label CPU/write" "$(fmt %.3f "$gcpu") ms" "$(fmt %.3f "$ecpu") ms" "$(ratio "$ecpu" "$gcpu") etcd/gpuplane"
  done
  local gm gx em ex
  gm=$(median_of gpuplane failover_median)
  gx=$(median_of gpuplane failover_max)
  em=$(median_of etcd failover_median)
  ex=$(median_of etcd failover_max)
  row "failover median/max" "$(fmt %.0f "$gm")/$(fmt %.0f "$gx") ms" \
    "$(fmt %.0f "$em")/$(fmt %.0f "$ex") ms" "$(ratio "$em" "$gm") etcd median/gpuplane median"
  row "write errors 1/64 (sum)" "$(sum_of gpuplane errors1)/$(sum_of gpuplane errors64)" \
    "$(sum_of etcd errors1)/$(sum_of etcd errors64)"
  row "acked writes lost (sum)" "$(sum_of gpuplane lost)" "-"
  local gs es
  gs=$(median_of gpuplane steal)
  es=$(median_of etcd steal)
  row "host steal of CPU time" "$(fmt %.1f "$gs")%" "$(fmt %.1f "$es")%"
  if awk -v g="$gs" -v e="$es" 'BEGIN { exit !((g != "-" && g > 5) || (e != "-" && e > 5)) }'; then
    echo "warning: the host took over 5% of this machine's CPU time (steal) during the runs;"
    echo "  the figures are disturbed and the ratios not comparable: run again on a quiet machine"
  fi
}

main() {
  parse_args "$@"
  check_binaries
  trap cleanup EXIT
  trap 'exit 130' INT
  trap 'exit 143' TERM
  work=$(mktemp -d "${TMPDIR:-/tmp}/compare-etcd.XXXXXX")
  results=$work/results
  : >"$results"
  print_machine
  ensure_packages
  detect_etcd
  echo "gpuplane: 3 controllers, $(gpuplane_raft_settings)"
  echo "etcd $etcd_version: 3 members, heartbeat 100ms, election timeout 1000ms (etcd's defaults;" \
    "randomized 1000-2000ms), fsync on, puts via $gateway/kv/put to the leader, wrk $(wrk -v 2>&1 | awk 'NR == 1 { print $2 }')"
  local run
  local before
  for ((run = 1; run <= runs; run++)); do
    before=$(cpu_ticks)
    run_gpuplane "$run"
    record_steal gpuplane "$before"
    before=$(cpu_ticks)
    run_etcd "$run"
    record_steal etcd "$before"
  done
  print_summary
}

main "$@"
