-- wrk script for controlplane/bench/compare-etcd.sh: puts small JSON documents into etcd
-- through its v3 JSON gateway (POST /v3/kv/put, key and value base64-encoded), the same
-- shape of write as raft-bench's (one ~150-byte resource per request).
--
--   wrk -t2 -c64 -d10s --latency -s etcd-put.lua http://127.0.0.1:2379/v3/kv/put -- 1600
--
-- The argument after `--` is the number of distinct keys per wrk thread: the shell script
-- passes 50 per connection the thread drives, as raft-bench's clients each cycle through
-- 50 names, so both systems overwrite the same number of distinct keys.
-- done() prints one machine-readable `ETCD-PUT` line that the shell script parses.

local function base64(s)
  local alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
  return ((s:gsub(".", function(c)
    local bits, byte = "", c:byte()
    for i = 8, 1, -1 do
      bits = bits .. (byte % 2 ^ i - byte % 2 ^ (i - 1) > 0 and "1" or "0")
    end
    return bits
  end) .. "0000"):gsub("%d%d%d?%d?%d?%d?", function(bits)
    if #bits < 6 then
      return ""
    end
    local n = 0
    for i = 1, 6 do
      n = n + (bits:sub(i, i) == "1" and 2 ^ (6 - i) or 0)
    end
    return alphabet:sub(n + 1, n + 1)
  end) .. ({ "", "==", "=" })[#s % 3 + 1])
end

-- Runs in the main thread, once per wrk thread: hand each thread its number.
local next_id = 0
function setup(thread)
  thread:set("id", next_id)
  next_id = next_id + 1
end

-- Runs in each thread: build every request body up front, so that the client spends its
-- CPU on sending rather than on encoding (client and servers share this machine's cores).
local bodies = {}
local counter = 0
function init(args)
  local keys = tonumber(args[1]) or 50
  for k = 0, keys - 1 do
    local name = string.format("t%d-c%d-%d", id, math.floor(k / 50), k % 50)
    local doc = string.format(
      '{"kind":"Service","name":"%s","tenant":"bench","spec":{"model":"resnet50","slo":{"latency_ms":50,"request_rate":%d.0}},"generation":1}',
      name, k + 1)
    local body = string.format('{"key":"%s","value":"%s"}',
      base64("/bench/Service/" .. name), base64(doc))
    bodies[k + 1] = wrk.format("POST", nil, { ["Content-Type"] = "application/json" }, body)
  end
end

function request()
  counter = counter + 1
  return bodies[(counter % #bodies) + 1]
end

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    "ETCD-PUT requests=%d duration_us=%d status_errors=%d socket_errors=%d p50_us=%d p99_us=%d\n",
    summary.requests, summary.duration, e.status, e.connect + e.read + e.write + e.timeout,
    latency:percentile(50), latency:percentile(99)))
end
