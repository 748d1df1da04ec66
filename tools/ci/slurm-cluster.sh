#!/usr/bin/env bash
# A real two-node Slurm cluster on this machine, for the tests of `torchrig cluster slurm --submit`.
#
#   tools/ci/slurm-cluster.sh up      install Slurm + munge (Debian packages), start the cluster
#   tools/ci/slurm-cluster.sh down    stop it and remove everything `up` made
#   tools/ci/slurm-cluster.sh status  sinfo, as the login node sees it
#   tools/ci/slurm-cluster.sh start-node NODE   start NODE's slurmd again (after a test killed it)
#
# Layout: three network namespaces made here, on a bridge of a private /24 (10.232.7.0/24) that lives
# inside the controller's namespace, so no traffic leaves them and the host's firewall rules (Docker's
# FORWARD policy) do not apply:
#   trslurm-ctl    slurmctld, hostname "ctl", 10.232.7.1; also the login node (sbatch, squeue, scancel)
#   trslurm-node0  slurmd -N node0, hostname "node0", 10.232.7.10
#   trslurm-node1  slurmd -N node1, hostname "node1", 10.232.7.11
# Each daemon runs in its own UTS namespace (its hostname) and mount namespace, where /etc/netns/<ns>/hosts
# is bind-mounted on /etc/hosts. The filesystem is shared, as a cluster's shared filesystem is. munged runs once: its
# socket is a path, which every network namespace reaches.
#
# Processes are tracked with proctrack/linuxproc (the process tree; no cgroup delegation is needed), and
# nodes' hardware is taken from this file (SlurmdParameters=config_overrides: both "nodes" share this
# machine's cores). Everything the cluster writes is under $BASE; `down` removes it.
set -euo pipefail

PREFIX=trslurm
NET=10.232.7
BASE=/run/torchrig-slurm
CONF=/etc/slurm/slurm.conf
NODES=(node0 node1)
ADDRS=("$NET.10" "$NET.11")

log() { echo "slurm-cluster: $*" >&2; }

in_ns() {  # in_ns NS HOSTNAME CMD...: run CMD in the namespace, with its hostname and /etc/hosts
    # nsenter + unshare rather than `ip netns exec`: that one remounts /sys, which hides the cgroup
    # hierarchies slurmd's cgroup plugin must find at start-up even when it does not use them.
    local ns=$1 host=$2
    shift 2
    nsenter --net="/run/netns/$ns" unshare --mount --uts sh -c \
        'mount --bind "/etc/netns/$0/hosts" /etc/hosts && hostname "$1" && shift && exec "$@"' \
        "$ns" "$host" "$@"
}

install_packages() {
    if command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v sbatch >/dev/null \
        && command -v munged >/dev/null; then
        return
    fi
    log "installing slurmctld, slurmd, slurm-client, munge (Debian packages)"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends slurmctld slurmd slurm-client munge >/dev/null
}

start_munge() {
    if [ ! -s /etc/munge/munge.key ]; then
        mungekey --create --force
        chown munge:munge /etc/munge/munge.key
        chmod 0400 /etc/munge/munge.key
    fi
    if munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1; then
        return  # already running (ours from an earlier `up`, or the system's)
    fi
    mkdir -p /run/munge /var/log/munge /var/lib/munge
    chown munge:munge /run/munge /var/log/munge /var/lib/munge
    chmod 0755 /run/munge
    runuser -u munge -- /usr/sbin/munged --pid-file=/run/munge/torchrig-munged.pid
    touch "$BASE/munged.ours"
    for _ in $(seq 50); do
        munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1 && return
        sleep 0.1
    done
    log "munged did not start"; exit 1
}

hosts_file() {
    printf '127.0.0.1 localhost\n%s.1 ctl\n' "$NET"
    for i in "${!NODES[@]}"; do printf '%s %s\n' "${ADDRS[$i]}" "${NODES[$i]}"; done
}

make_network() {
    local ctl=$PREFIX-ctl
    ip netns add "$ctl"
    ip -n "$ctl" link set lo up
    ip -n "$ctl" link add trsbr0 type bridge
    ip -n "$ctl" addr add "$NET.1/24" dev trsbr0
    ip -n "$ctl" link set trsbr0 up
    for i in "${!NODES[@]}"; do
        local ns=$PREFIX-${NODES[$i]}
        ip netns add "$ns"
        ip -n "$ns" link set lo up
        ip link add "trs-n$i" type veth peer name "trs-n$i-in"
        ip link set "trs-n$i" netns "$ctl"
        ip link set "trs-n$i-in" netns "$ns"
        ip -n "$ctl" link set "trs-n$i" master trsbr0 up
        ip -n "$ns" link set "trs-n$i-in" name eth0
        ip -n "$ns" addr add "${ADDRS[$i]}/24" dev eth0
        ip -n "$ns" link set eth0 up
    done
    for ns in "$ctl" "${NODES[@]/#/$PREFIX-}"; do
        mkdir -p "/etc/netns/$ns"
        hosts_file >"/etc/netns/$ns/hosts"
    done
}

write_conf() {
    mkdir -p /etc/slurm "$BASE/ctld"
    for n in "${NODES[@]}"; do mkdir -p "$BASE/$n/spool"; done
    local cpus
    cpus=$(nproc)
    cat >"$CONF" <<CONF
# Written by torchrig's tools/ci/slurm-cluster.sh: a two-node test cluster in network namespaces.
ClusterName=torchrig-ci
SlurmctldHost=ctl($NET.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
StateSaveLocation=$BASE/ctld
SlurmctldPidFile=$BASE/slurmctld.pid
SlurmctldLogFile=$BASE/slurmctld.log
SlurmdSpoolDir=$BASE/%n/spool
SlurmdPidFile=$BASE/%n/slurmd.pid
SlurmdLogFile=$BASE/%n/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/linear
MpiDefault=none
SlurmdParameters=config_overrides
# A node whose slurmd stops answering is DOWN after SlurmdTimeout; it rejoins when slurmd is back.
ReturnToService=2
SlurmdTimeout=20
MessageTimeout=10
InactiveLimit=0
# scancel / time limit: SIGTERM, then SIGKILL after KillWait seconds.
KillWait=10
# A requeued job is held for cred_expire + 1 s before it may start again (Reason=BeginTime). The hold is what
# keeps the previous run's messages to a lost node (the terminate request in flight, and a step signal that
# slurmctld retries every 60 s, RPC_RETRY_INTERVAL) from reaching the next run, which has the same job id and
# step ids: delivered to it, they take the node out of the new allocation ("Requested nodes are busy") or
# SIGTERM its step. Slurm's default is 120 s; 75 s keeps the hold above the retry interval, for CI time.
AuthInfo=cred_expire=75
MinJobAge=600
NodeName=node0 NodeAddr=${ADDRS[0]} NodeHostname=node0 CPUs=$cpus RealMemory=1000 State=UNKNOWN
NodeName=node1 NodeAddr=${ADDRS[1]} NodeHostname=node1 CPUs=$cpus RealMemory=1000 State=UNKNOWN
PartitionName=debug Nodes=node[0-1] Default=YES MaxTime=INFINITE State=UP
CONF
}

start_node() {
    in_ns "$PREFIX-$1" "$1" slurmd -N "$1" -f "$CONF"
}

wait_idle() {
    local state
    for _ in $(seq 120); do
        state=$(ip netns exec "$PREFIX-ctl" sinfo -h -N -o '%N %T' 2>/dev/null || true)
        if [ "$(grep -c ' idle$' <<<"$state")" = "${#NODES[@]}" ]; then
            log "up: $(tr '\n' ' ' <<<"$state")"
            return
        fi
        sleep 0.5
    done
    log "nodes not idle after 60 s: ${state:-no answer from slurmctld}"
    tail -n 20 "$BASE"/slurmctld.log "$BASE"/node*/slurmd.log >&2 || true
    exit 1
}

up() {
    [ "$(id -u)" = 0 ] || { log "needs root (network namespaces, daemons)"; exit 2; }
    install_packages
    down quiet
    mkdir -p "$BASE"
    start_munge
    make_network
    write_conf
    in_ns "$PREFIX-ctl" ctl slurmctld -c -f "$CONF"
    for n in "${NODES[@]}"; do start_node "$n"; done
    wait_idle
    # What the tests read: where the login node is, and the nodes' namespaces.
    printf 'LOGIN_NS=%s\nNODE_NS=%s\nNODES=%s\nCONF=%s\n' "$PREFIX-ctl" \
        "$PREFIX-node0,$PREFIX-node1" "node0,node1" "$CONF" >"$BASE/cluster.env"
}

kill_pidfile() {
    local f=$1 pid
    [ -s "$f" ] || return 0
    pid=$(cat "$f")
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
}

down() {
    if ip netns list | grep -q "^$PREFIX-ctl"; then
        ip netns exec "$PREFIX-ctl" scancel --full --quiet -u root 2>/dev/null || true
    fi
    for n in "${NODES[@]}"; do kill_pidfile "$BASE/$n/slurmd.pid"; done
    kill_pidfile "$BASE/slurmctld.pid"
    for ns in "$PREFIX-ctl" "${NODES[@]/#/$PREFIX-}"; do
        if ip netns list | grep -q "^$ns\b"; then
            for pid in $(ip netns pids "$ns"); do kill -9 "$pid" 2>/dev/null || true; done
            ip netns del "$ns"
        fi
        rm -rf "/etc/netns/$ns"
    done
    if [ -e "$BASE/munged.ours" ]; then kill_pidfile /run/munge/torchrig-munged.pid; fi
    rm -rf "$BASE"
    [ "${1:-}" = quiet ] || log "down"
}

case "${1:-}" in
    up) up ;;
    down) down ;;
    status) ip netns exec "$PREFIX-ctl" sinfo -N ;;
    start-node)
        case "${2:-}" in node0 | node1) start_node "$2" ;; *) echo "usage: $0 start-node node0|node1" >&2; exit 2 ;; esac ;;
    *) echo "usage: $0 up|down|status|start-node NODE" >&2; exit 2 ;;
esac
