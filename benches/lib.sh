# Shared by the benchmark scripts (sourced, not run). Each script sets BENCH
# (its name, for messages) and, before calling these, the variables each
# function names.

say() { printf '\n== %s\n' "$*"; }
die() { printf '%s: %s\n' "${BENCH:-bench}" "$*" >&2; exit 1; }
# Prints a command the way it can be pasted back into a shell.
show() { printf '$'; printf ' %q' "$@"; printf '\n'; }
now_ns() { date +%s%N; }

# Builds the release binary; sets RF (its path) and SOURCE (the commit, and
# how many files under src/ or Cargo.* differ from it: figures from a dirty
# tree are not a commit's). Needs ROOT.
build_ringfeed() {
    # RF_BIN: a ringfeed binary built elsewhere (another commit, to measure
    # before and after a change), used as it is.
    if [ -n "${RF_BIN:-}" ]; then
        RF=$(realpath "$RF_BIN")
        SOURCE="the binary $RF (RF_BIN)"
        echo "ringfeed: $SOURCE"
        return
    fi
    show cargo build --release
    cargo build --release
    RF=$ROOT/target/release/ringfeed
    SOURCE="$(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
    local dirty
    dirty=$(git status --porcelain --untracked-files=no -- src cli Cargo.toml Cargo.lock 2>/dev/null | wc -l)
    [ "$dirty" -eq 0 ] || SOURCE="$SOURCE + $dirty modified files under src/, cli/ or Cargo.*"
    echo "ringfeed built from $SOURCE"
}

# Generates the shards in $1 with `ringfeed gen` unless a run with the same
# parameters (SHARDS, SHARD_SIZE, SAMPLE_SIZE, SEED) left them there. Sets
# GEN (the command), SHARDS_DIR (absolute) and FILES (the shards, sorted).
gen_shards() {
    local dir=$1 stamp want have=0
    GEN=("$RF" gen "$dir" --shards "$SHARDS" --shard-size "$SHARD_SIZE"
         --sample-size "$SAMPLE_SIZE" --seed "$SEED")
    stamp=$dir/.gen-params
    want="gen --shards $SHARDS --shard-size $SHARD_SIZE --sample-size $SAMPLE_SIZE --seed $SEED"
    if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
        have=$(find "$dir" -maxdepth 1 -name 'shard-*.tar' | wc -l)
    fi
    if [ "$have" -eq "$SHARDS" ]; then
        echo "reusing $dir ($want)"
    else
        mkdir -p "$dir"
        rm -f "$dir"/shard-*.tar "$stamp"
        show "${GEN[@]}"
        "${GEN[@]}"
        echo "$want" >"$stamp"
    fi
    SHARDS_DIR=$(cd "$dir" && pwd)
    mapfile -t FILES < <(find "$SHARDS_DIR" -maxdepth 1 -name 'shard-*.tar' | sort)
    [ "${#FILES[@]}" -eq "$SHARDS" ] || die "expected $SHARDS shards in $SHARDS_DIR, found ${#FILES[@]}"
}

# Prints the fraction of the FILES' bytes resident in the page cache.
resident() {
    fincore --bytes --noheadings --raw -o RES,SIZE "${FILES[@]}" |
        awk '{r = ($1 < $2) ? $1 : $2; res += r; size += $2} END {printf "%.4f\n", res / size}'
}

# Reads the FILES again when some fell out of the page cache, so a run
# times ringfeed (or the server) and not the disk: memory pressure is not
# the only cause, a VM may page out idle memory on its own (DAMON `pageout`
# schemes do, a few 100 MiB/s). Appends "LABEL RESIDENT_BEFORE REWARMED" to
# $OUT_DIR/residency.txt.
ensure_hot() {
    local res rewarmed=0
    res=$(resident)
    if python3 -c "import sys; sys.exit(0 if float('$res') < 0.9999 else 1)"; then
        cat "${FILES[@]}" >/dev/null
        rewarmed=1
    fi
    echo "$1 $res $rewarmed" >>"$OUT_DIR/residency.txt"
}

# The end of a run: drops empty stderr files, prints the commands (CMDS) and
# where the raw results are (OUT_DIR).
finish_run() {
    find "$OUT_DIR" -name '*.stderr' -empty -delete
    say "commands"
    cat "$CMDS"
    echo
    echo "raw JSON, commands and summary.json: $OUT_DIR"
}

# Installs, as root, the Debian packages of the commands missing; dies
# otherwise. Args: COMMAND:PACKAGE pairs (nginx is also looked for in
# /usr/sbin, off a normal user's PATH). Installs only: no service starts.
need_tools() {
    local missing=() pair cmd pkg
    for pair in "$@"; do
        cmd=${pair%%:*} pkg=${pair#*:}
        command -v "$cmd" >/dev/null || [ -x "/usr/sbin/$cmd" ] || missing+=("$pkg")
    done
    [ "${#missing[@]}" -eq 0 ] && return 0
    [ "$(id -u)" = 0 ] || die "${missing[*]} missing and we are not root to apt-get them"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}"
}

# Succeeds when TCP port $1 on 127.0.0.1 is free.
port_free() {
    python3 - "$1" <<'PY'
import socket, sys
s = socket.socket()
try:
    s.bind(("127.0.0.1", int(sys.argv[1])))
except OSError:
    sys.exit(1)
PY
}

# Stops the script's own nginx, whose pid file is in $NG: gracefully, then
# by TERM after 5 s.
stop_nginx() {
    if [ -f "$NG/nginx.pid" ]; then
        local pid
        pid=$(cat "$NG/nginx.pid")
        kill -QUIT "$pid" 2>/dev/null || true
        for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        if kill -0 "$pid" 2>/dev/null; then kill -TERM "$pid" 2>/dev/null || true; fi
        echo "nginx stopped"
    fi
}

# Waits for nginx at $BASE to answer, then checks one ranged GET of
# KEYS[0] byte for byte against FILES[0]: nginx must honour Range (206).
# Extra curl arguments (TLS) may be given.
check_ranged_get() {
    for _ in $(seq 50); do curl "$@" -sf -o /dev/null -I "$BASE/$BUCKET/${KEYS[0]}" && break; sleep 0.1; done
    curl "$@" -sf -r 1000-1999 -o "$NG/range-check" -w '%{http_code}\n' "$BASE/$BUCKET/${KEYS[0]}" |
        grep -qx 206 || die "nginx did not answer a ranged GET with 206"
    cmp -s "$NG/range-check" <(tail -c +1001 "${FILES[0]}" | head -c 1000) ||
        die "nginx's ranged GET returned other bytes than the file's"
    rm -f "$NG/range-check"
}
