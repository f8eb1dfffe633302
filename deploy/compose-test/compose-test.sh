#!/usr/bin/env bash
# `make compose-test`: deploy/compose/embedded.yml end to end on this machine, as root, with
# nothing from an image registry. Phases (each printed with its duration):
#   deps       apt-get install docker.io debootstrap docker-compose where missing
#   daemon     a private dockerd: its own data root ($ROOT/docker, kept: it is the image cache)
#              and socket, host networking only (no bridge, no iptables)
#   base       a Debian bookworm + python3 base image made with debootstrap (once; cached)
#   image      the dart image from the Dockerfile with BASE=that base; pip reaches the host's
#              sources (pip config: local indexes, the wheel directory with the CPU torch)
#              through a loopback HTTP server (cached layers: a code change rebuilds seconds)
#   up         the stack (configs: deploy/compose + deploy/compose-test/fast.yaml), an experience
#              pool (experience.py), until the archive volume holds $VERSIONS weight versions
#              published by the trainer
#   down       docker-compose down (volumes kept); `dart log verify` and `dart sql` on the volumes
#   up-again   up again: the broker is rebuilt from the archive, the log goes on where it stopped
#              (no offset gap, the next weight versions follow the last one) for $MORE versions
#   down-again down; verify and sql again
#   cleanup    (always, also on failure) containers, volumes, networks, the daemon it started
set -euo pipefail

REPO=$(cd "$(dirname "$0")/../.." && pwd)
ROOT=${DART_COMPOSE_TEST_ROOT:-/var/lib/dart-compose-test}
RUN=/run/dart-compose-test
SOCK=$RUN/docker.sock
PIP_PORT=${DART_COMPOSE_TEST_PIP_PORT:-39480}
BROKER_PORT=${DART_EMBEDDED_BROKER_PORT:-39092}
PROJECT=dartct
BASE_IMAGE=dart-base:bookworm
IMAGE=dart:local
VERSIONS=${DART_COMPOSE_TEST_VERSIONS:-10}    # weight versions the first `up` waits for
MORE=${DART_COMPOSE_TEST_MORE:-10}            # ... and the second one, beyond the first's
WAIT_S=${DART_COMPOSE_TEST_WAIT_S:-900}       # longest wait for either
COMPOSE_FILE=$REPO/deploy/compose/embedded.yml

export DOCKER_HOST=unix://$SOCK DOCKER_BUILDKIT=0 COMPOSE_DOCKER_CLI_BUILD=0
export DART_EMBEDDED_BROKER_PORT=$BROKER_PORT DART_IMAGE=$IMAGE COMPOSE_PROJECT_NAME=$PROJECT
unset DART_BOOTSTRAP DART_TOPIC_PREFIX

T0=$(date +%s)
PHASE=""
PHASE_T0=0
DOCKERD_PID=""
HTTP_PID=""
CONFIG_DIR=""

say() { echo "[compose-test $(date -u +%H:%M:%S)] $*"; }
phase() {
  [ -z "$PHASE" ] || say "-- $PHASE done in $(( $(date +%s) - PHASE_T0 )) s"
  PHASE=$1; PHASE_T0=$(date +%s)
  say "== $PHASE"
}
fail() { say "FAILED in phase ${PHASE:-start}: $*" >&2; exit 1; }
compose() { docker-compose -f "$COMPOSE_FILE" -p "$PROJECT" "$@"; }
# A one-off container of the image with the project's volumes ($1: volume:path[:ro] list), at
# most 5 minutes.
in_image() {
  local mounts=() v
  for v in $1; do mounts+=(-v "${PROJECT}_$v"); done
  shift
  timeout 300 docker run --rm --network host -e "DART_BOOTSTRAP=127.0.0.1:$BROKER_PORT" "${mounts[@]}" -v "$REPO/deploy/compose-test:/opt/compose-test:ro" "$IMAGE" "$@"
}

cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  set +e
  [ -z "$PHASE" ] || say "-- $PHASE ended after $(( $(date +%s) - PHASE_T0 )) s"
  say "== cleanup"
  if [ $rc -ne 0 ] && [ -S "$SOCK" ] && docker info > /dev/null 2>&1; then
    say "logs of the stack (last 30 lines per service):"
    compose logs --no-color --tail 30 2>&1 | tail -400
  fi
  if [ -S "$SOCK" ] && docker info > /dev/null 2>&1; then
    timeout 180 docker-compose -f "$COMPOSE_FILE" -p "$PROJECT" down -v --remove-orphans > /dev/null 2>&1 \
      || say "docker-compose down -v failed"
    docker container prune -f > /dev/null 2>&1
  fi
  [ -z "$HTTP_PID" ] || kill "$HTTP_PID" 2> /dev/null
  if [ -n "$DOCKERD_PID" ]; then
    kill "$DOCKERD_PID" 2> /dev/null
    for _ in $(seq 60); do kill -0 "$DOCKERD_PID" 2> /dev/null || break; sleep 0.5; done
    kill -0 "$DOCKERD_PID" 2> /dev/null && { say "dockerd did not stop: kill -9"; kill -9 "$DOCKERD_PID"; }
  fi
  [ -z "$CONFIG_DIR" ] || rm -rf "$CONFIG_DIR"
  say "cleanup done; total $(( $(date +%s) - T0 )) s; $([ $rc -eq 0 ] && echo PASSED || echo "FAILED (exit $rc)")"
  exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM

[ "$(id -u)" = 0 ] || { echo "compose-test: run as root (it starts a dockerd)" >&2; exit 1; }

phase deps
missing=""
command -v dockerd > /dev/null || missing="$missing docker.io"
command -v debootstrap > /dev/null || missing="$missing debootstrap"
command -v docker-compose > /dev/null || missing="$missing docker-compose"
if [ -n "$missing" ]; then
  say "installing$missing"
  timeout 600 bash -c "apt-get update -q > /dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
    --no-install-recommends $missing > /dev/null" || fail "apt-get install$missing failed"
fi
say "$(dockerd --version); $(docker-compose --version)"

phase daemon
mkdir -p "$ROOT/docker" "$RUN"
# A daemon left by an interrupted run (its pid file): its stack down, then the daemon stopped,
# so that this run owns the daemon it uses.
if [ -f "$RUN/docker.pid" ] && old=$(cat "$RUN/docker.pid") && kill -0 "$old" 2> /dev/null; then
  say "stopping the dockerd an earlier run left (pid $old)"
  timeout 180 docker-compose -f "$COMPOSE_FILE" -p "$PROJECT" down -v --remove-orphans > /dev/null 2>&1 || true
  kill "$old"
  for _ in $(seq 120); do kill -0 "$old" 2> /dev/null || break; sleep 0.5; done
  kill -0 "$old" 2> /dev/null && { say "it did not stop in 60 s: kill -9"; kill -9 "$old"; sleep 1; }
fi
rm -f "$RUN/docker.pid"
rm -f "$SOCK"
dockerd --data-root "$ROOT/docker" --exec-root "$RUN/exec" --pidfile "$RUN/docker.pid" \
  --host "unix://$SOCK" --bridge=none --iptables=false --ip-masq=false --ip-forward=false \
  > "$ROOT/dockerd.log" 2>&1 &
DOCKERD_PID=$!
for _ in $(seq 120); do docker info > /dev/null 2>&1 && break; sleep 0.5
  kill -0 "$DOCKERD_PID" 2> /dev/null || { tail -c 3000 "$ROOT/dockerd.log"; fail "dockerd exited (log above)"; }; done
docker info > /dev/null 2>&1 || { tail -c 3000 "$ROOT/dockerd.log"; fail "dockerd did not answer on $SOCK in 60 s"; }
say "dockerd pid $DOCKERD_PID on $SOCK, data root $ROOT/docker ($(docker info -f '{{.Driver}}'))"
# Leftovers of an interrupted run: its containers and volumes (the images stay: the cache).
timeout 180 docker-compose -f "$COMPOSE_FILE" -p "$PROJECT" down -v --remove-orphans > /dev/null 2>&1 || true

phase base
if docker image inspect "$BASE_IMAGE" > /dev/null 2>&1; then
  say "$BASE_IMAGE cached"
else
  timeout 900 bash "$REPO/deploy/compose-test/base-image.sh" "$BASE_IMAGE" || fail "could not make $BASE_IMAGE"
fi

phase image
# The host's pip sources (pip config list) on loopback: local indexes and the wheel directory.
# A fixed port and the same URLs every run: they are build args, part of the layer cache key.
mkdir -p "$RUN/pip"
for d in /opt/wheels /opt/pypi /opt/pypi-more; do [ -e "$d" ] && ln -sfn "$d" "$RUN/pip/$(basename "$d")"; done
python3 -m http.server "$PIP_PORT" --bind 127.0.0.1 --directory "$RUN/pip" > "$ROOT/pip-http.log" 2>&1 &
HTTP_PID=$!
for _ in $(seq 40); do curl -fs "http://127.0.0.1:$PIP_PORT/" > /dev/null && break; sleep 0.25; done
curl -fs "http://127.0.0.1:$PIP_PORT/" > /dev/null || fail "port $PIP_PORT: the loopback pip server did not start (taken?)"
P=http://127.0.0.1:$PIP_PORT
args=(--build-arg "BASE=$BASE_IMAGE" --build-arg TORCH_INDEX_URL= --build-arg PIP_TRUSTED_HOST=127.0.0.1
      --build-arg PIP_CERT=/etc/ssl/certs/ca-certificates.crt)
extra=""
[ -e "$RUN/pip/pypi" ] && extra="$P/pypi/simple"
[ -e "$RUN/pip/pypi-more" ] && extra="$extra $P/pypi-more/simple"
[ -z "$extra" ] || args+=(--build-arg "PIP_EXTRA_INDEX_URL=${extra# }")
[ -e "$RUN/pip/wheels" ] && args+=(--build-arg "PIP_FIND_LINKS=$P/wheels/")
timeout 1500 docker build --network host -t "$IMAGE" "${args[@]}" "$REPO" > "$ROOT/build.log" 2>&1 \
  || { tail -40 "$ROOT/build.log"; fail "docker build failed (log above; all of it in $ROOT/build.log)"; }
say "$IMAGE: $(grep -c -- '---> Using cache' "$ROOT/build.log") cached steps, $(grep -c -- '---> Running in' "$ROOT/build.log") run; $(docker image inspect -f '{{.Size}}' "$IMAGE" | awk '{printf "%.1f GB", $1/1e9}')"
kill "$HTTP_PID"; HTTP_PID=""
docker image prune -f > /dev/null 2>&1 || true

# The service configs: deploy/compose with the tiny policy's settings laid over them.
CONFIG_DIR=$(mktemp -d /tmp/dart-compose-test.XXXXXX)
chmod 755 "$CONFIG_DIR"
docker run --rm --network none --user 0 -v "$REPO/deploy:/src:ro" -v "$CONFIG_DIR:/out" "$IMAGE" \
  python /src/compose-test/overlay.py /src/compose /src/compose-test/fast.yaml /out || fail "config overlay"
chmod 644 "$CONFIG_DIR"/*.yaml
export DART_CONFIG_DIR=$CONFIG_DIR

progress() { in_image "event-archive:/data/log:ro" python /opt/compose-test/progress.py /data/log 2> /dev/null; }
field() { python3 -c "import json, sys; d = json.loads(sys.argv[1]); print(eval(sys.argv[2], {}, d))" "$1" "$2"; }

# Wait until the archive holds weight versions up to $1 (published by the trainer, filed by the archiver).
wait_for_version() {
  local want=$1 deadline=$(( $(date +%s) + WAIT_S )) last="" now
  while :; do
    now=$(progress || true)
    if [ -n "$now" ]; then
      [ "$now" = "$last" ] || say "archive: $(field "$now" 'f"{records} records, {len(weights)} weight versions published, the last {weights[-1] if weights else None}"')"
      last=$now
      [ "$(field "$now" "max(weights or [-1]) >= $want")" = True ] && { PROGRESS=$now; return 0; }
    fi
    if [ -n "$(compose ps -q | xargs -r docker inspect -f '{{.Name}} {{.State.Status}} {{.State.ExitCode}}' \
               | awk '$2 == "exited" && $3 != 0')" ]; then
      compose ps; fail "a service exited with an error"
    fi
    [ "$(date +%s)" -lt "$deadline" ] || { compose ps; fail "no weight version $want in the archive after $WAIT_S s"; }
    sleep 10
  done
}

# `dart log verify` and `dart sql` on the volumes of a stopped stack; prints the counts.
check_volumes() {
  in_image "event-archive:/data/log:ro" dart log verify /data/log > "$ROOT/verify.log" 2>&1 \
    || { tail -20 "$ROOT/verify.log"; fail "dart log verify failed"; }
  say "dart log verify: $(tail -1 "$ROOT/verify.log")"
  SQL=$(in_image "projection:/data/chdb" dart sql --dsn chdb:///data/chdb/store --format TSV \
    "SELECT (SELECT count() FROM trajectories FINAL), (SELECT max(version) FROM weights), (SELECT count() FROM steps)" 2>&1) \
    || { echo "$SQL"; fail "dart sql failed"; }
  SQL=$(echo "$SQL" | tail -1 | tr '\t' ' ')
  say "dart sql: trajectories, last weight version, steps = $SQL"
}

# Bring the stack up (one-shots run to completion first); its output only when it fails.
stack_up() {
  timeout 900 docker-compose -f "$COMPOSE_FILE" -p "$PROJECT" up -d --no-build > "$ROOT/up.log" 2>&1 \
    || { tail -30 "$ROOT/up.log"; compose ps; fail "docker-compose up failed (output above)"; }
}

phase up
for port in "$BROKER_PORT"; do
  (exec 3<> "/dev/tcp/127.0.0.1/$port") 2> /dev/null && fail "127.0.0.1:$port is taken: the embedded broker needs it (DART_EMBEDDED_BROKER_PORT)"
done
stack_up
[ "$(compose ps -q | wc -l)" -ge 11 ] || { compose ps; fail "docker-compose up did not create the 11 containers"; }
# The tiny random policy never succeeds: a pool success per task lets the batcher make batches.
in_image "blobs:/data/blobs models:/data/models:ro" python /opt/compose-test/experience.py \
  /data/models/policy /data/blobs compose || fail "experience import"
wait_for_version "$VERSIONS"

phase down
timeout 300 docker-compose -f "$COMPOSE_FILE" -p "$PROJECT" down > /dev/null 2>&1 || fail "docker-compose down"
FIRST=$(progress) || fail "the archive volume is unreadable after down"
say "archive after down: $(field "$FIRST" 'f"{records} records; weight versions {weights}"')"
check_volumes
FIRST_SQL=$SQL
last_version=$(field "$FIRST" "max(weights)")
# The projection (chdb volume) saw the same last version as the archive: the archiver, stopped
# after the trainer, archived all it published.
[ "$(echo "$SQL" | cut -d' ' -f2)" = "$last_version" ] || fail "dart sql's last version is not the archive's ($last_version)"
first_records=$(field "$FIRST" "records")

phase up-again
stack_up
restored=$(compose logs --no-color log-restore 2>&1 | grep -o 'imported [0-9]* records' | tail -1)
say "log-restore: ${restored:-nothing logged}"
[ "$restored" = "imported $first_records records" ] \
  || fail "log-restore: '$restored', expected 'imported $first_records records' (the whole archive)"
wait_for_version $(( last_version + MORE ))
# The log went on where it stopped: the trainer resumed from its checkpoint, re-announced that
# version (the last archived one) and went on from it; nothing restarted at version 0; the
# versions archived before the restart are untouched. `verify` below finds no offset gap.
n_first=$(field "$FIRST" "len(weights)")
[ "$(field "$PROGRESS" "weights[:$n_first] == $(field "$FIRST" "weights")")" = True ] \
  || fail "the weight versions archived before the restart changed: $(field "$PROGRESS" weights)"
after=$(field "$PROGRESS" "weights[$n_first:]")
[ "$(field "$PROGRESS" "all(v >= $last_version for v in weights[$n_first:]) and weights[$n_first] <= $(( last_version + 1 ))")" = True ] \
  || fail "after the restart the trainer published $after, not versions from $last_version on"
say "after the restart: versions $after (the first re-announced from the trainer's checkpoint)"

phase down-again
timeout 300 docker-compose -f "$COMPOSE_FILE" -p "$PROJECT" down > /dev/null 2>&1 || fail "docker-compose down"
SECOND=$(progress) || fail "the archive volume is unreadable after down"
say "archive after down: $(field "$SECOND" 'f"{records} records; weight versions {weights}"')"
[ "$(field "$SECOND" "records")" -gt "$first_records" ] || fail "the archive did not grow after the restart"
check_volumes
[ "$(echo "$SQL" | cut -d' ' -f2)" = "$(field "$SECOND" "max(weights)")" ] || fail "dart sql's last version is not the archive's"
[ "$(echo "$SQL" | cut -d' ' -f1)" -gt "$(echo "$FIRST_SQL" | cut -d' ' -f1)" ] || fail "no trajectory was added after the restart"
say "first up: $(field "$FIRST" 'f"{records} archived records, weight versions 0..{max(weights)}"'); sql (trajectories, last version, steps) $FIRST_SQL"
say "after the restart: $(field "$SECOND" 'f"{records} archived records, weight versions 0..{max(weights)}"'); sql $SQL"
phase done
PHASE=""
