#!/usr/bin/env bash
# End-to-end test of the Docker image: engine, base image, build, run, API, user,
# HEALTHCHECK, and a start with no network at all (the model is inside the image).
#
#   bash tests/docker/run.sh
#
# Starts dockerd (--iptables=false --bridge=none) when no engine answers and leaves it
# running; skips (exit 0, "docker: skipped: ...") only when no engine can be started.
# Needs root for debootstrap when the base image is missing (scripts/docker-base-image.sh).
#
# Env:
#   HEADSCOPE_DOCKER_IMAGE       tag to build           (default headscope:test)
#   HEADSCOPE_DOCKER_BASE_IMAGE  BASE_IMAGE build arg   (default local/python-base:bookworm,
#                                made by scripts/docker-base-image.sh when missing)
#   HEADSCOPE_DOCKER_CA          CA bundle given to the build as secret `ca`
#                                (default /etc/ssl/certs/ca-certificates.crt when present)
#   HEADSCOPE_DOCKER_LOGS        folder for build/engine/container logs
#                                (default test-artifacts/docker)
set -uo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$REPO"

IMAGE="${HEADSCOPE_DOCKER_IMAGE:-headscope:test}"
BASE_IMAGE="${HEADSCOPE_DOCKER_BASE_IMAGE:-local/python-base:bookworm}"
CA="${HEADSCOPE_DOCKER_CA:-/etc/ssl/certs/ca-certificates.crt}"
LOGS="${HEADSCOPE_DOCKER_LOGS:-$REPO/test-artifacts/docker}"
mkdir -p "$LOGS"
LOGS="$(cd "$LOGS" && pwd)"

PASSED=0
FAILED=0
T0=$(date +%s.%N)
NAME_HOST="headscope-test-host-$$"
NAME_NONET="headscope-test-nonet-$$"
DOCKER=""

say() { printf '[docker-test] %s\n' "$*"; }
now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }
pass() { PASSED=$((PASSED + 1)); say "PASS $*"; }
fail() { FAILED=$((FAILED + 1)); say "FAIL $*"; }
phase_start() { PHASE="$1"; PHASE_T=$(now); say "--- $PHASE"; }
phase_end() { local t; t=$(elapsed "$PHASE_T"); say "    $PHASE: ${t}s"; TIMINGS+=("$PHASE=${t}s"); }
TIMINGS=()

finish() {
    local rc=$?
    if [ -n "$DOCKER" ]; then
        for c in "$NAME_HOST" "$NAME_NONET"; do
            if "$DOCKER" container inspect "$c" >/dev/null 2>&1; then
                "$DOCKER" logs "$c" >"$LOGS/$c.log" 2>&1 || true
                "$DOCKER" rm -f "$c" >/dev/null 2>&1 || true
            fi
        done
    fi
    if [ "${SKIPPED:-0}" = 1 ]; then
        exit 0
    fi
    say "timings: ${TIMINGS[*]:-none}; total $(elapsed "$T0")s"
    echo "docker: $PASSED passed, $FAILED failed"
    if [ "$FAILED" -gt 0 ] || [ "$rc" -ne 0 ] || [ "$PASSED" -eq 0 ]; then
        exit 1
    fi
    exit 0
}
trap finish EXIT
trap 'exit 130' INT TERM

skip() {
    SKIPPED=1
    say "$*"
    echo "docker: skipped: $*"
    exit 0
}

# --- 1. engine -----------------------------------------------------------------------
phase_start "engine"
engine_up() { "${1:-docker}" info >/dev/null 2>&1; }

# A client whose `docker build` uses BuildKit: the classic client before 23.0 with
# DOCKER_BUILDKIT=1 (BuildKit inside the engine), or any client with the buildx plugin.
BUILD=()
pick_client() {
    local c major
    for c in /usr/bin/docker "$(command -v docker 2>/dev/null)" /usr/local/bin/docker; do
        [ -n "$c" ] && [ -x "$c" ] || continue
        if "$c" buildx version >/dev/null 2>&1; then
            DOCKER="$c"; BUILD=("$c" buildx build --load); return 0
        fi
        major="$("$c" version --format '{{.Client.Version}}' 2>/dev/null | cut -d. -f1)"
        if [ -n "$major" ] && [ "$major" -lt 23 ] 2>/dev/null; then
            DOCKER="$c"; BUILD=(env DOCKER_BUILDKIT=1 "$c" build); return 0
        fi
    done
    return 1
}
if ! pick_client; then
    DOCKER="$(command -v docker 2>/dev/null || true)"
    [ -n "$DOCKER" ] || skip "no docker client on this machine"
    BUILD=(env DOCKER_BUILDKIT=1 "$DOCKER" build)
    say "no buildx plugin and no pre-23 client found; trying $DOCKER with DOCKER_BUILDKIT=1"
fi
say "client: $DOCKER ($("$DOCKER" version --format '{{.Client.Version}}' 2>/dev/null)), build: ${BUILD[*]}"

if ! engine_up "$DOCKER"; then
    DOCKERD="$(command -v dockerd 2>/dev/null || true)"
    [ -n "$DOCKERD" ] || skip "no Docker engine answers and dockerd is not installed"
    [ "$(id -u)" = 0 ] || skip "no Docker engine answers and starting dockerd needs root"
    say "starting $DOCKERD (log: $LOGS/dockerd.log)"
    # Own session and no inherited stdout, so the engine outlives this script
    # without holding the caller's pipes open.
    setsid nohup "$DOCKERD" --iptables=false --bridge=none \
        >"$LOGS/dockerd.log" 2>&1 </dev/null &
    for _ in $(seq 1 60); do
        engine_up "$DOCKER" && break
        sleep 1
    done
    if ! engine_up "$DOCKER"; then
        tail -20 "$LOGS/dockerd.log" 2>/dev/null | sed 's/^/    dockerd: /'
        skip "the Docker engine could not be started (see $LOGS/dockerd.log)"
    fi
fi
say "engine: $("$DOCKER" version --format '{{.Server.Version}}' 2>/dev/null)"
phase_end

# --- 2. base image ---------------------------------------------------------------------
phase_start "base-image"
if "$DOCKER" image inspect "$BASE_IMAGE" >/dev/null 2>&1; then
    say "$BASE_IMAGE present"
elif [ "$BASE_IMAGE" = "local/python-base:bookworm" ]; then
    if ! DOCKER="$DOCKER" bash "$REPO/scripts/docker-base-image.sh" "$BASE_IMAGE"; then
        fail "base image $BASE_IMAGE could not be made"
        exit 1
    fi
else
    say "$BASE_IMAGE not present locally; the build will try to pull it"
fi
phase_end

# --- 3. build --------------------------------------------------------------------------
phase_start "build"
SECRET=()
if [ -s "$CA" ]; then SECRET=(--secret "id=ca,src=$CA"); fi
say "${BUILD[*]} --network host --build-arg BASE_IMAGE=$BASE_IMAGE ${SECRET[*]} -t $IMAGE ."
if "${BUILD[@]}" --progress=plain --network host --build-arg "BASE_IMAGE=$BASE_IMAGE" \
        "${SECRET[@]}" -t "$IMAGE" . >"$LOGS/build.log" 2>&1; then
    SIZE_MB=$("$DOCKER" image inspect --format '{{.Size}}' "$IMAGE" | awk '{printf "%.0f", $1/1e6}')
    pass "build ($IMAGE, ${SIZE_MB} MB; log $LOGS/build.log)"
else
    tail -40 "$LOGS/build.log" | sed 's/^/    build: /'
    fail "build (log $LOGS/build.log)"
    phase_end
    exit 1
fi
phase_end

# The proxy CA given as a build secret must not be in the image.
if "$DOCKER" run --rm --network none --entrypoint sh "$IMAGE" -c \
        '[ -z "$(ls -A /run/secrets 2>/dev/null)" ] && ! env | grep -q /run/secrets' >/dev/null 2>&1 \
   && ! "$DOCKER" image inspect --format '{{json .Config.Env}}' "$IMAGE" | grep -q 'PIP_CERT\|/run/secrets'; then
    pass "no build secret left in the image"
else
    fail "build secret or PIP_CERT found in the image"
fi

# --- helpers ---------------------------------------------------------------------------
free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
http_status() {  # URL -> HTTP status code, or 000
    python3 - "$1" <<'PY'
import sys, urllib.request, urllib.error
try:
    print(urllib.request.urlopen(sys.argv[1], timeout=5).status)
except urllib.error.HTTPError as e:
    print(e.code)
except Exception:
    print("000")
PY
}
post_image() {  # URL FILE -> prints a one-line summary, exit 0 when the JSON has "attention"
    python3 - "$1" "$2" <<'PY'
import json, os, sys, uuid, urllib.request
url, path = sys.argv[1], sys.argv[2]
boundary = uuid.uuid4().hex
ctype = "image/png" if path.lower().endswith(".png") else "image/jpeg"
body = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"image\"; "
        f"filename=\"{os.path.basename(path)}\"\r\nContent-Type: {ctype}\r\n\r\n").encode()
body += open(path, "rb").read() + f"\r\n--{boundary}--\r\n".encode()
req = urllib.request.Request(url, data=body, method="POST",
                             headers={"Content-Type": f"multipart/form-data; boundary={boundary}"})
try:
    with urllib.request.urlopen(req, timeout=120) as r:
        data = json.load(r)
except Exception as e:
    print(f"request failed: {e}")
    sys.exit(1)
if "attention" not in data:
    print(f"no 'attention' key; keys: {sorted(data)}")
    sys.exit(1)
print(f"model={data.get('model')} shape={data.get('shape')} keys={len(data)}")
PY
}
wait_for() {  # SECONDS COMMAND... : retry every second until the command succeeds
    local limit=$1; shift
    local start=$SECONDS
    while [ $((SECONDS - start)) -lt "$limit" ]; do
        "$@" && return 0
        sleep 1
    done
    return 1
}
container_running() { [ "$("$DOCKER" inspect --format '{{.State.Running}}' "$1" 2>/dev/null)" = true ]; }
show_logs() { "$DOCKER" logs "$1" 2>&1 | tail -30 | sed "s/^/    $1: /"; }

# --- 4. run on the host network ----------------------------------------------------------
phase_start "run-host"
PORT=$(free_port)
# The image's own CMD, the address from the environment alone (as docs/docker.md's -e): the
# server and the HEALTHCHECK below both follow it.
if ! "$DOCKER" run -d --name "$NAME_HOST" --network host -e "HEADSCOPE_HOST=127.0.0.1" -e "HEADSCOPE_PORT=$PORT" \
        "$IMAGE" >/dev/null; then
    fail "container start (host network)"
    exit 1
fi
ready_host() {
    container_running "$NAME_HOST" || return 2
    [ "$(http_status "http://127.0.0.1:$PORT/readyz")" = 200 ]
}
READY_T=$(now)
if wait_for 300 ready_host; then
    pass "/readyz 200 on 127.0.0.1:$PORT after $(elapsed "$READY_T")s"
    HOST_READY=1
else
    show_logs "$NAME_HOST"
    fail "/readyz never answered 200 on port $PORT"
    HOST_READY=0
fi

SAMPLE=""
for f in "$REPO/static/samples/cat.png" "$REPO/../shared/samples/cat.png"; do
    [ -f "$f" ] && { SAMPLE="$f"; break; }
done
if [ "$HOST_READY" = 1 ] && [ -n "$SAMPLE" ]; then
    if out=$(post_image "http://127.0.0.1:$PORT/api/v1/attention" "$SAMPLE"); then
        pass "POST /api/v1/attention ($(basename "$SAMPLE")): $out"
    else
        show_logs "$NAME_HOST"
        fail "POST /api/v1/attention: $out"
    fi
else
    fail "POST /api/v1/attention not tried (ready=$HOST_READY, sample=${SAMPLE:-none found})"
fi

uid=$("$DOCKER" exec "$NAME_HOST" id -u 2>/dev/null || echo "?")
if [ -n "$uid" ] && [ "$uid" != "?" ] && [ "$uid" != 0 ]; then
    pass "runs as non-root (uid $uid)"
else
    fail "container user is root or unknown (uid '$uid')"
fi

healthy() {
    local s
    s=$("$DOCKER" inspect --format '{{if .State.Health}}{{.State.Health.Status}}{{else}}none{{end}}' "$NAME_HOST" 2>/dev/null)
    [ "$s" = healthy ]
}
HEALTH_T=$(now)
if wait_for 120 healthy; then
    pass "HEALTHCHECK healthy ($(elapsed "$HEALTH_T")s after ready)"
else
    "$DOCKER" inspect --format '{{json .State.Health}}' "$NAME_HOST" 2>/dev/null | head -c 1500
    echo
    fail "HEALTHCHECK status: $("$DOCKER" inspect --format '{{if .State.Health}}{{.State.Health.Status}}{{else}}none{{end}}' "$NAME_HOST" 2>/dev/null)"
fi
"$DOCKER" logs "$NAME_HOST" >"$LOGS/$NAME_HOST.log" 2>&1 || true
"$DOCKER" rm -f "$NAME_HOST" >/dev/null 2>&1 || true
phase_end

# --- 5. run with no network on a read-only root with a tmpfs /tmp (docs/docker.md), default
# CMD (0.0.0.0:8000 inside the container) ---------------------------------------------------
phase_start "run-offline"
if "$DOCKER" run -d --name "$NAME_NONET" --network none --read-only --tmpfs /tmp "$IMAGE" >/dev/null; then
    ready_nonet() {
        container_running "$NAME_NONET" || return 2
        "$DOCKER" exec "$NAME_NONET" python3 -c \
            "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/readyz', timeout=5)" \
            >/dev/null 2>&1
    }
    READY_T=$(now)
    if wait_for 300 ready_nonet; then
        pass "--network none --read-only --tmpfs /tmp: /readyz 200 after $(elapsed "$READY_T")s (model inside the image, no fetch)"
    else
        show_logs "$NAME_NONET"
        fail "--network none: /readyz never answered 200"
    fi
else
    fail "container start (--network none)"
fi
# Read-only without a writable /tmp: one line and exit code 2, not torch's traceback.
ro_err=$("$DOCKER" run --rm --network none --read-only "$IMAGE" 2>&1 >/dev/null)
ro_rc=$?
if [ "$ro_rc" = 2 ] && grep -q "no writable temporary folder" <<<"$ro_err" && ! grep -q Traceback <<<"$ro_err"; then
    pass "--read-only without --tmpfs: exit 2, one line ($(head -c 80 <<<"$ro_err")...)"
else
    fail "--read-only without --tmpfs: exit $ro_rc: $(tail -5 <<<"$ro_err")"
fi
phase_end
