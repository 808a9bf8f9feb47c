#!/usr/bin/env bash
# Time to first batch over many remote shards behind a slow server: 20,000
# tiny shards served by a Python ThreadingHTTPServer (Range, HEAD,
# keep-alive) that sleeps DELAY_MS before every response, so each request
# costs at least one round trip of DELAY_MS whatever the machine.
#
# A benchmark program, not a test (docs/design.md). Each contender is a
# fresh process timed whole (open included), from its start to its exit:
#   reference   curl fetching the first shard once (one request: the round
#               trip's cost, process start included);
#   ringfeed    `ringfeed cat URL-PATTERN --limit BATCH`: opens the 20,000
#               shards, takes the first batch of BATCH samples, closes;
#   baseline    the same with the binary BASELINE names (another build, e.g.
#               the commit before remote shards were sized lazily), if set;
#   local       the same `ringfeed cat` over the shards' directory: the part
#               of open that is per-shard work on this machine (brace
#               expansion, stat, the plan), no network.
# It prints per contender the median and range over ROUNDS rounds, the
# ratio of medians to the reference, and the median in round trips
# (median / DELAY_MS), so "a few round trips" can be read off directly.
# `ringfeed cat` has no clock of its own to print: whole-process only.
#
# Usage: benches/many_shards.sh        (from anywhere; runs in the repo root)
# Knobs (environment):
#   SHARDS_DIR   dataset directory        [benches/out/many_shards]
#   SHARDS, SHARD_SIZE, SAMPLE_SIZE, SEED [20000, 4KiB, 512B, 0]
#   DELAY_MS     server delay per response [10]
#   ROUNDS       rounds (each contender once per round) [5]
#   BATCH        samples in the first batch [4]
#   WORKERS      loader workers            [4]
#   MEMORY_BUDGET the loader's budget (cat's default, 64 MiB, holds too few
#                8 MiB chunks for 4 workers) [128MiB]
#   BASELINE     another ringfeed binary to time the same way [unset]
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$PWD
BENCH=many_shards
. benches/lib.sh

SHARDS_DIR=${SHARDS_DIR:-benches/out/many_shards}
SHARDS=${SHARDS:-20000}
SHARD_SIZE=${SHARD_SIZE:-4KiB}
SAMPLE_SIZE=${SAMPLE_SIZE:-512B}
SEED=${SEED:-0}
DELAY_MS=${DELAY_MS:-10}
ROUNDS=${ROUNDS:-5}
BATCH=${BATCH:-4}
WORKERS=${WORKERS:-4}
MEMORY_BUDGET=${MEMORY_BUDGET:-128MiB}
BASELINE=${BASELINE:-}
command -v curl >/dev/null || die "curl is needed for the reference"
command -v python3 >/dev/null || die "python3 is needed for the server and the statistics"
[ -z "$BASELINE" ] || [ -x "$BASELINE" ] || die "BASELINE=$BASELINE is not an executable"

say build
build_ringfeed
say dataset
gen_shards "$SHARDS_DIR"
last=$(printf '%06d' $((SHARDS - 1)))

say server
SERVE_LOG=$(mktemp)
python3 - "$SHARDS_DIR" "$DELAY_MS" >"$SERVE_LOG" 2>&1 <<'EOF' &
# A static file server that sleeps before every response: GET with one
# byte range (206; 416 with the size past the end), HEAD, keep-alive.
import http.server, os, sys, time

root, delay = sys.argv[1], int(sys.argv[2]) / 1000


class Slow(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # The head and the body go out in two writes: without TCP_NODELAY the
    # body waits for the client's delayed ACK of the head (40 ms) on every
    # request of a kept-alive connection, which would swamp DELAY_MS.
    disable_nagle_algorithm = True

    def log_message(self, *args):
        pass

    def answer(self, body):
        time.sleep(delay)
        path = os.path.join(root, os.path.basename(self.path))
        try:
            size = os.path.getsize(path)
        except OSError:
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        start, end, status = 0, size - 1, 200
        rng = self.headers.get("Range", "")
        if rng.startswith("bytes=") and "," not in rng:
            a, _, b = rng[6:].partition("-")
            if a:
                start = int(a)
                end = min(int(b), size - 1) if b else size - 1
                if start >= size:
                    self.send_response(416)
                    self.send_header("Content-Range", f"bytes */{size}")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                status = 206
        n = max(0, end - start + 1)
        self.send_response(status)
        if status == 206:
            self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
        self.send_header("Content-Length", str(n))
        self.send_header("Accept-Ranges", "bytes")
        self.end_headers()
        if body and n:
            with open(path, "rb") as f:
                f.seek(start)
                self.wfile.write(f.read(n))

    def do_GET(self):
        self.answer(True)

    def do_HEAD(self):
        self.answer(False)


class Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    # 32 HEADs connect at once: the default backlog of 5 drops SYNs, and
    # each drop costs a 1 s retransmission.
    request_queue_size = 256


s = Server(("127.0.0.1", 0), Slow)
print(f"http://127.0.0.1:{s.server_address[1]}", flush=True)
s.serve_forever()
EOF
SERVER=$!
trap 'kill $SERVER 2>/dev/null || true; rm -f "$SERVE_LOG" "${RESULTS:-}"' EXIT
for _ in $(seq 100); do
    BASE=$(grep -oE 'http://[0-9.:]+' "$SERVE_LOG" | head -1 || true)
    [ -n "$BASE" ] && break
    sleep 0.05
done
[ -n "$BASE" ] || die "the server printed no URL: $(cat "$SERVE_LOG")"
URL="$BASE/shard-{000000..$last}.tar"
FIRST_URL="$BASE/shard-000000.tar"
echo "serving $SHARDS_DIR at $BASE, $DELAY_MS ms before every response"

OPTS=(--limit "$BATCH" --batch-size "$BATCH" --workers "$WORKERS" --memory-budget "$MEMORY_BUDGET")
CAT=(cat "$URL" "${OPTS[@]}")
LOCAL=(cat "$SHARDS_DIR/shard-{000000..$last}.tar" "${OPTS[@]}")
say commands
show curl -s -o /dev/null "$FIRST_URL"
show "$RF" "${CAT[@]}"
show "$RF" "${LOCAL[@]}"
[ -z "$BASELINE" ] || show "$BASELINE" "${CAT[@]}"

# Appends "WHO MS" to RESULTS: the whole-process wall time of the command,
# whose output is checked (BATCH sample lines from ringfeed).
timed() {
    local who=$1 t0 t1 out
    shift
    t0=$(now_ns)
    out=$("$@" 2>&1) || die "failed: $* -> $out"
    t1=$(now_ns)
    if [ "$who" != reference ]; then
        [ "$(printf '%s\n' "$out" | grep -c .)" -ge "$BATCH" ] || die "no batch from $*: $out"
    fi
    echo "$who $(((t1 - t0) / 1000))" | awk '{printf "%s %.3f\n", $1, $2 / 1000}' | tee -a "$RESULTS"
}

RESULTS=$(mktemp)
for ((r = 1; r <= ROUNDS; r++)); do
    say "round $r of $ROUNDS"
    timed reference curl -s -o /dev/null "$FIRST_URL"
    timed ringfeed "$RF" "${CAT[@]}"
    timed local "$RF" "${LOCAL[@]}"
    [ -z "$BASELINE" ] || timed baseline "$BASELINE" "${CAT[@]}"
done

say summary
python3 - "$RESULTS" "$DELAY_MS" "$SHARDS" "$SOURCE" "${BASELINE:-}" <<'EOF'
import statistics, sys
path, delay, shards, source, baseline = sys.argv[1], float(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
runs = {}
for line in open(path):
    who, ms = line.split()
    runs.setdefault(who, []).append(float(ms))
ref = statistics.median(runs["reference"])
print(f"{shards} remote shards, server delay {delay:g} ms per response; "
      f"ringfeed built from {source}" + (f"; baseline {baseline}" if baseline else ""))
print(f"{'who':<10} {'median ms':>10} {'range ms':>20} {'/reference':>11} {'round trips':>12}")
for who in ["reference", "local", "ringfeed", "baseline"]:
    if who not in runs:
        continue
    xs = runs[who]
    m = statistics.median(xs)
    print(f"{who:<10} {m:10.1f} {min(xs):9.1f}-{max(xs):<10.1f} {m / ref:11.2f} {m / delay:12.1f}")
print("each: one fresh process, start to exit (open included); round trips = median / delay; "
      "reference = curl, one GET of the first shard")
EOF
rm -f "$RESULTS"
