#!/usr/bin/env bash
# The container checks, run by .ci/run after the test suite (about 5 minutes here, 2 more when
# the engine has no base image yet):
#
#   deploy/test.sh [BINARY]      # default target/debug/rudra-node, as the tests built it
#
# 1. the image builds offline (deploy/image/build.sh) from BINARY;
# 2. `docker run IMAGE local --set training.epochs=1` trains and exits 0;
# 3. a Compose cluster (1 scheduler, 2 shards, 4 learners, every node enrolled with a join
#    token) trains MNIST to >= 96% while nodes with an expired token, a token for another
#    role and no token are refused (exit 2, the scheduler logs why);
# 4. the engine's own faults, each against that clean run (same seed): docker kill of a
#    learner (accuracy within 1 point), docker network disconnect of a learner for 10 s (it
#    rejoins: the timeline says at which clock), docker restart of a shard (it resumes from its
#    checkpoint volume, updates_lost <= checkpoint.every_updates), docker restart of the
#    scheduler (it takes the run back from its run directory; accuracy within 1 point).
#
# Every docker step is bounded by `timeout`; a trap removes the containers, networks, volumes
# and the image whatever happens (the engine keeps the base image for the next time). What each run wrote is kept in target/container-checks/.
set -euo pipefail
cd "$(dirname "$0")/.."
binary=${1:-target/debug/rudra-node}
project=rudraci
image=rudra-node:ci
net=${project}_rudra
out=target/container-checks
work=$(mktemp -d)
every_updates=200
t0=$(date +%s)

dc() {
    RUDRA_RUN_CONFIG="$work/run.toml" RUDRA_CONNECT_TIMEOUT=20s timeout 120 \
        docker-compose -p "$project" --env-file "$work/env" -f deploy/compose/docker-compose.yml "$@"
}

cleanup() {
    set +e
    dc down -v --remove-orphans -t 1 >/dev/null 2>&1
    docker ps -aq --filter "name=^${project}" | xargs -r docker rm -f >/dev/null 2>&1
    docker network rm "$net" >/dev/null 2>&1
    docker volume rm -f "${project}_ca" "${project}_trust" >/dev/null 2>&1
    docker rmi -f "$image" >/dev/null 2>&1
    rm -rf "$work"
}
trap cleanup EXIT

stamp() { echo "== [$(($(date +%s) - t0)) s] $*"; }
fail() { echo "FAILED: $*" >&2; exit 1; }
json() { python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(eval(sys.argv[2]))" "$@"; }

stamp "image from $binary"
timeout 600 deploy/image/build.sh --binary "$binary" --tag "$image"
echo "image size: $(docker image inspect --format '{{.Size}}' "$image" | awk '{printf "%.0f MB", $1 / 1e6}')"

stamp "docker run $image local --set training.epochs=1"
timeout 180 docker run --rm --name "${project}-local" -e RUST_LOG=warn "$image" local --set training.epochs=1 \
    | tee "$work/local.out"
grep -q "test accuracy" "$work/local.out" || fail "the local run printed no summary"

stamp "Compose: CA and join tokens"
rm -rf "$out" && mkdir -p "$out"
cleanup_volumes() { docker volume rm -f "${project}_ca" "${project}_trust" >/dev/null 2>&1 || true; }
cleanup_volumes
timeout 60 deploy/compose/init.sh --project "$project" --image "$image" --env-file "$work/env"
cat >"$work/run.toml" <<EOF
[cluster]
learners = 4
shards = 2
[protocol]
lr_modulation = "none"
[training]
epochs = 4
[checkpoint]
every_updates = $every_updates
EOF

# The run's progress as the scheduler logs it, in percent (0 before the first line).
progress() {
    docker logs "${project}_scheduler_1" 2>&1 | sed -n 's/.*INFO rudra_runtime::local: *\([0-9]*\)% epoch.*/\1/p' \
        | tail -1 | grep . || echo 0
}
# Wait until the run is $1 percent done.
at() {
    local deadline=$(($(date +%s) + 120))
    while [ "$(progress)" -lt "$1" ]; do
        [ "$(date +%s)" -lt "$deadline" ] || fail "the run did not reach $1% within 120 s"
        sleep 0.2
    done
}
# A learner container's node name.
learner_name() { docker exec "$1" cat /var/lib/rudra/certs/learner.name; }

# One run of the cluster from fresh volumes, with a fault ($@, run once the cluster is up);
# the run directory lands in $out/NAME. A fault that ends the run itself says so by returning 1.
run_cluster() {
    local name=$1
    shift
    stamp "cluster run: $name"
    dc down -v -t 1 >/dev/null 2>&1 || true
    dc up -d --scale learner=4 >/dev/null 2>&1 || { dc logs --no-color | tail -30; fail "$name: compose up"; }
    local ended=0
    "$@" || ended=$?
    if [ "$ended" -eq 0 ]; then
        local code
        code=$(timeout 240 docker wait "${project}_scheduler_1") || fail "$name: the scheduler did not finish"
        dc logs --no-color >"$out/$name.log" 2>&1 || true
        [ "$code" = 0 ] || { tail -40 "$out/$name.log"; fail "$name: the scheduler exited $code"; }
        docker cp "${project}_scheduler_1:/var/lib/rudra/runs/run" "$out/$name" >/dev/null
        echo "$name: test accuracy $(json "$out/$name/summary.json" "d['final_test_accuracy']")," \
            "updates_lost $(json "$out/$name/summary.json" "d['updates_lost']")," \
            "$(json "$out/$name/summary.json" "round(d['wall_seconds'], 1)") s"
    else
        dc logs --no-color >"$out/$name.log" 2>&1 || true
    fi
    dc down -v -t 1 >/dev/null 2>&1 || true
}

# Nodes the scheduler must refuse while the run goes on: exit code 2 and the reason.
refusals() {
    at 5
    local expired
    expired=$(timeout 30 docker run --rm --network none -v "${project}_ca:/var/lib/rudra/ca" "$image" \
        cert token --dir /var/lib/rudra/ca --role learner --ttl 0s) || fail "no expired token"
    sleep 1.1
    local shard_token
    shard_token=$(sed -n 's/^SHARD_TOKEN=//p' "$work/env")
    for case in "expired:$expired:expired" "wrong-role:$shard_token:admits a shard" "no-token::--token"; do
        IFS=: read -r what token why <<<"$case"
        local code=0
        timeout 60 docker run --rm --name "${project}-refused-$what" --network "$net" \
            -v "${project}_trust:/var/lib/rudra/trust:ro" -e RUDRA_ROLE=learner -e RUDRA_SCHEDULER=scheduler:7070 \
            -e RUDRA_CA=/var/lib/rudra/trust/ca.pem -e RUDRA_TOKEN="$token" "$image" >"$work/$what.out" 2>&1 \
            || code=$?
        [ "$code" = 2 ] || { cat "$work/$what.out"; fail "refused ($what): exit code $code, not 2"; }
        grep -q -- "$why" "$work/$what.out" || { cat "$work/$what.out"; fail "refused ($what): no '$why'"; }
        echo "refused ($what): $(tail -1 "$work/$what.out")"
    done
}

kill_learner() {
    at 30
    docker kill "${project}_learner_2" >/dev/null || fail "docker kill"
    echo "killed ${project}_learner_2 at $(progress)%"
}

disconnect_learner() {
    at 15
    learner_name "${project}_learner_3" >"$work/disconnected" || fail "no name for ${project}_learner_3"
    docker network disconnect "$net" "${project}_learner_3" || fail "docker network disconnect"
    echo "disconnected $(cat "$work/disconnected") (${project}_learner_3) at $(progress)% for 10 s"
    sleep 10
    docker network connect "$net" "${project}_learner_3" || fail "docker network connect"
}

restart_shard() {
    at 40
    timeout 30 docker restart -t 1 "${project}_shard-1_1" >/dev/null || fail "docker restart of a shard"
    echo "restarted ${project}_shard-1_1 at $(progress)%"
}

# The scheduler restarted mid-run (its run directory on the `runs` volume): it takes the job
# back, the other nodes join it again, and the run finishes with one summary.
restart_scheduler() {
    at 40
    timeout 30 docker restart -t 1 "${project}_scheduler_1" >/dev/null || fail "docker restart of the scheduler"
    echo "restarted ${project}_scheduler_1 at $(progress)%" | tee "$out/scheduler-restarted.txt"
}

run_cluster clean refusals
clean_acc=$(json "$out/clean/summary.json" "d['final_test_accuracy']")
python3 -c "import sys; a=float(sys.argv[1]); sys.exit(0 if a >= 0.96 else 1)" "$clean_acc" \
    || fail "the clean Compose run reached $clean_acc, below 0.96"
for why in expired "admits a shard"; do
    grep -q "refused enrolment: .*$why" "$out/clean.log" || fail "the scheduler logged no refusal ($why)"
done

run_cluster learner-killed kill_learner
python3 - "$out" <<'EOF'
import json, sys
out = sys.argv[1]
clean = json.load(open(f"{out}/clean/summary.json"))["final_test_accuracy"]
killed = json.load(open(f"{out}/learner-killed/summary.json"))["final_test_accuracy"]
assert abs(clean - killed) <= 0.01, f"a killed learner cost {clean - killed:.4f}, more than 1 point"
EOF

run_cluster learner-disconnected disconnect_learner
python3 - "$out" "$(cat "$work/disconnected")" <<'EOF'
import json, re, sys
out, name = sys.argv[1], sys.argv[2]
timeline = json.load(open(f"{out}/learner-disconnected/timeline.json"))
for t in timeline:
    print(f"  {t['seconds']:7.2f} s  {t['kind']:9} {t['what']}")
lost = [t for t in timeline if t["what"] == f"{name} lost"]
back = [t for t in timeline if re.fullmatch(rf"{name} rejoined at clock \d+", t["what"])]
assert lost and back and back[0]["seconds"] > lost[0]["seconds"], f"{name} was not lost and then rejoined"
EOF

run_cluster shard-restarted restart_shard
python3 - "$out" "$every_updates" <<'EOF'
import json, sys
out, every = sys.argv[1], int(sys.argv[2])
s = json.load(open(f"{out}/shard-restarted/summary.json"))
timeline = json.load(open(f"{out}/shard-restarted/timeline.json"))
assert any(t["kind"] == "recovered" for t in timeline), f"no shard recovered: {timeline}"
assert 0 <= s["updates_lost"] <= every, f"updates_lost {s['updates_lost']} over {every}"
EOF

run_cluster scheduler-restarted restart_scheduler
python3 - "$out" <<'EOF'
import json, sys
out = sys.argv[1]
clean = json.load(open(f"{out}/clean/summary.json"))["final_test_accuracy"]
s = json.load(open(f"{out}/scheduler-restarted/summary.json"))
timeline = json.load(open(f"{out}/scheduler-restarted/timeline.json"))
assert any("resumed the run" in t["what"] for t in timeline), f"the scheduler did not take the run back: {timeline}"
assert abs(clean - s["final_test_accuracy"]) <= 0.01, f"the scheduler's restart cost {clean - s['final_test_accuracy']:.4f}"
EOF

timeout 120 "$binary" report "$out"/clean "$out"/learner-killed "$out"/learner-disconnected \
    "$out"/shard-restarted "$out"/scheduler-restarted --out "$out/report" >/dev/null
python3 deploy/report.py "$out" | tee "$out/report.md"
stamp "container checks passed"
