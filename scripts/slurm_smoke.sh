#!/bin/bash
# Smoke test of `distgrad launch` under Slurm on this one machine:
#   1. installs Slurm and MUNGE from Debian's packages (slurm-wlm, munge) if srun is missing,
#   2. configures a one-node cluster in a temp directory and starts munged, slurmctld, slurmd,
#   3. runs the quickstart through `srun -n 3` (coordinator + 2 workers, one task each),
#   4. tears everything down again (also when a step fails).
#
#   sudo scripts/slurm_smoke.sh            # from the repository root; needs root for apt
#   scripts/slurm_smoke.sh run.steps=100   # extra arguments go to distgrad launch
#   RUN_TESTS=1 scripts/slurm_smoke.sh     # also the tests marked slurm, on this cluster
#
# PYTHON (default: python3) must be an interpreter with distgrad importable.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
PYTHON="${PYTHON:-python3}"
WORK="$(mktemp -d /tmp/slurm-smoke-XXXXXX)"
chmod 755 "$WORK"  # munged runs as the munge user
HOST="$(hostname -s)"
PIDS=()

say() { printf '== %s\n' "$*"; }

teardown() {
    say "tearing down"
    for pid in "${PIDS[@]}"; do
        kill "$pid" 2>/dev/null || true
    done
    for pid in "${PIDS[@]}"; do
        wait "$pid" 2>/dev/null || true
    done
    rm -rf "$WORK"
}
trap teardown EXIT

if ! command -v srun >/dev/null; then
    say "installing slurm-wlm and munge"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq slurm-wlm munge >/dev/null
fi

say "starting munged"
mkdir -p "$WORK/munge" /run/munge
chown munge:munge "$WORK/munge" /run/munge 2>/dev/null || true
if [ ! -s /etc/munge/munge.key ]; then
    dd if=/dev/urandom bs=1 count=1024 of=/etc/munge/munge.key status=none
    chown munge:munge /etc/munge/munge.key
    chmod 400 /etc/munge/munge.key
fi
if ! pgrep -x munged >/dev/null; then
    runuser -u munge -- munged --force --socket="/run/munge/munge.socket.2" \
        --log-file="$WORK/munge/munged.log" --pid-file="$WORK/munge/munged.pid" \
        --seed-file="$WORK/munge/munged.seed"
    sleep 0.5
    PIDS+=("$(cat "$WORK/munge/munged.pid")")
fi

say "configuring a one-node cluster ($HOST, $(nproc) CPUs)"
mkdir -p "$WORK/spool" "$WORK/state" "$WORK/log"
cat > "$WORK/slurm.conf" <<CONF
ClusterName=smoke
SlurmctldHost=$HOST
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation=$WORK/state
SlurmdSpoolDir=$WORK/spool
SlurmctldPidFile=$WORK/slurmctld.pid
SlurmdPidFile=$WORK/slurmd.pid
SlurmctldLogFile=$WORK/log/slurmctld.log
SlurmdLogFile=$WORK/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
MpiDefault=none
ReturnToService=2
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
NodeName=$HOST CPUs=$(nproc) State=UNKNOWN
PartitionName=smoke Nodes=$HOST Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE
CONF
export SLURM_CONF="$WORK/slurm.conf"

say "starting slurmctld and slurmd"
slurmctld -D -i -f "$SLURM_CONF" >"$WORK/log/slurmctld.out" 2>&1 &
PIDS+=("$!")
slurmd -D -f "$SLURM_CONF" >"$WORK/log/slurmd.out" 2>&1 &
PIDS+=("$!")
up=0
for _ in $(seq 1 60); do
    if ! kill -0 "${PIDS[-1]}" 2>/dev/null; then break; fi   # slurmd gave up
    if sinfo -h -o '%t' 2>/dev/null | grep -qxE '(idle|mix|alloc)'; then up=1; break; fi
    sleep 0.5
done
if [ "$up" -ne 1 ]; then
    say "the node did not come up"
    tail -n 20 "$WORK/log/"*.log
    exit 1
fi
sinfo

say "srun -n 3: the quickstart, one task per process"
cd "$WORK"
cp -r "$ROOT/configs" "$WORK/configs"
status=0
PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" \
    timeout 600 srun --nodes=1 --ntasks=3 --overcommit --kill-on-bad-exit=1 --label --immediate=60 \
    "$PYTHON" -m distgrad launch configs/quickstart.toml --no-progress --no-plot "$@" \
    || status=$?
say "srun exited with status $status"
if [ "$status" -ne 0 ]; then
    tail -n 30 "$WORK/log/"*.log || true
elif [ "${RUN_TESTS:-0}" = 1 ]; then
    say "the tests marked slurm"
    (cd "$ROOT" && "$PYTHON" -m pytest -q -m slurm -p no:randomly tests/launch -rs) || status=$?
fi
exit "$status"
