#!/usr/bin/env bash
# A throwaway one-node slurm cluster on this machine, for tests/test_cluster.py and for trying
# the workflow's slurm profile (README, "Scaling out"). Needs root and Debian's packages.
#
#   tests/cluster/slurm.sh start   # install slurm-wlm and munge if missing, write
#                                  # /etc/slurm/slurm.conf for this host, start munged,
#                                  # slurmctld and slurmd, wait until the node is idle
#   tests/cluster/slurm.sh stop    # stop the daemons `start` started (by their pids), remove
#                                  # the slurm.conf it wrote
#
# The node is this host (`hostname -s`) with the CPUs and memory `slurmd -C` finds, in one
# partition `logra`; no accounting database: job states come from slurmctld, which keeps a
# finished job (for `squeue`, the executor's status checks, and `scontrol show job`, the tests'
# look at what each job was given) MinJobAge seconds; no cgroups.
set -euo pipefail

STATE=${LOGRA_SLURM_STATE:-/var/tmp/logra-slurm}  # spool, logs and pid files
CONF=/etc/slurm/slurm.conf
MARK="# written by logra-repro tests/cluster/slurm.sh"
MUNGE_PID=/run/munge/munged.pid

die() { echo "slurm.sh: $*" >&2; exit 1; }

start() {
    [[ $(id -u) == 0 ]] || die "start needs root (it installs packages and starts daemons)"
    if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null \
            || ! command -v munged >/dev/null; then
        apt-get update -q
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q slurm-wlm munge
    fi
    if [[ -e $CONF ]] && ! grep -qxF "$MARK" "$CONF"; then
        die "$CONF exists and was not written by this script: a slurm is configured here already"
    fi
    pgrep -x slurmctld >/dev/null && die "a slurmctld is running already"
    pgrep -x slurmd >/dev/null && die "a slurmd is running already"

    local host node
    host=$(hostname -s)
    node=$(slurmd -C | head -1)  # NodeName=<host> CPUs=... RealMemory=...
    [[ $node == "NodeName=$host "* ]] || die "slurmd -C did not describe this host ($host): $node"
    rm -rf "$STATE/ctld" "$STATE/slurmd"  # no jobs or node state from an earlier start
    mkdir -p "$STATE/ctld" "$STATE/slurmd"
    cat > "$CONF" <<EOF
$MARK
ClusterName=logra
SlurmctldHost=$host
SlurmUser=root
AuthType=auth/munge
StateSaveLocation=$STATE/ctld
SlurmdSpoolDir=$STATE/slurmd
SlurmctldPidFile=$STATE/slurmctld.pid
SlurmdPidFile=$STATE/slurmd.pid
SlurmctldLogFile=$STATE/slurmctld.log
SlurmdLogFile=$STATE/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/affinity
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU_Memory
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
MpiDefault=none
ReturnToService=2
MinJobAge=3600
$node State=UNKNOWN
PartitionName=logra Nodes=$host Default=YES MaxTime=INFINITE State=UP
EOF

    if ! pgrep -x munged >/dev/null; then  # a running munged (same key) serves as it is
        install -d -o munge -g munge -m 0755 /run/munge
        runuser -u munge -- munged --pid-file="$MUNGE_PID"
        echo "$MUNGE_PID" > "$STATE/pidfiles"
    else
        : > "$STATE/pidfiles"
    fi
    slurmctld && echo "$STATE/slurmctld.pid" >> "$STATE/pidfiles"
    slurmd && echo "$STATE/slurmd.pid" >> "$STATE/pidfiles"

    local state=""
    for _ in $(seq 60); do
        state=$(sinfo -h -n "$host" -o %T 2>/dev/null || true)
        [[ $state == idle ]] && { sinfo; return; }
        sleep 1
    done
    die "node $host is '${state:-not known}' after 60 s, not idle; see $STATE/*.log"
}

stop() {
    [[ -e $STATE/pidfiles ]] || { echo "slurm.sh: nothing to stop"; return; }
    local file pid
    for file in $(tac "$STATE/pidfiles"); do  # slurmd, slurmctld, then munged
        pid=$(cat "$file" 2>/dev/null) || continue
        kill "$pid" 2>/dev/null || continue
        for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
        kill -0 "$pid" 2>/dev/null && die "pid $pid ($file) did not stop"
    done
    rm -f "$STATE/pidfiles"
    grep -qxF "$MARK" "$CONF" 2>/dev/null && rm -f "$CONF"
    echo "slurm.sh: stopped"
}

case "${1:-}" in
    start) start ;;
    stop) stop ;;
    *) die "usage: $0 start|stop" ;;
esac
