#!/usr/bin/env bash
# A single-node SLURM cluster on this machine, from Debian's packages, to try heads-lab's cluster
# path (hydra/launcher=slurm, preemption and requeue) without a cluster. Needs root.
#
#   sudo scripts/slurm_cluster.sh up        # install slurm-wlm + munge if missing, start, wait idle
#   heads-lab train -m hydra/launcher=slurm hydra.launcher.gpus_per_node=0 \
#       hydra.launcher.cpus_per_task=1 hydra.launcher.mem_gb=2 model=tiny model.heads=1,4
#   squeue; sacct                           # the jobs, running and finished
#   sudo scripts/slurm_cluster.sh down      # stop the daemons, remove the config and the state
#
# What it sets up: munged as the munge user; a MariaDB server of its own (datadir and socket in
# the state dir, 127.0.0.1:$HEADS_LAB_SLURM_DB_PORT) behind slurmdbd, so `sacct` works and
# submitit sees real job states (FAILED, REQUEUED); /etc/slurm/slurm.conf and slurmdbd.conf for
# one node (this host, all its CPUs, 90 % of its memory) with no cgroups (proctrack/linuxproc,
# task/none); slurmdbd, slurmctld and slurmd as root. State, database and logs live in
# $HEADS_LAB_SLURM_DIR (default /var/tmp/heads-lab-slurm). `down` refuses to touch a slurm.conf
# it did not write. `status` exits 0 when the node is up.
set -euo pipefail

STATE="${HEADS_LAB_SLURM_DIR:-/var/tmp/heads-lab-slurm}"
DB_PORT="${HEADS_LAB_SLURM_DB_PORT:-3307}"
CONF=/etc/slurm/slurm.conf
DBD_CONF=/etc/slurm/slurmdbd.conf
MARK="# written by heads-lab scripts/slurm_cluster.sh"
HOST="$(hostname -s)"
PACKAGES="slurm-wlm slurmdbd munge mariadb-server"

die() { echo "slurm_cluster: $*" >&2; exit 1; }

ours() { [ -f "$1" ] && head -1 "$1" | grep -qF "$MARK"; }

node_state() { sinfo -h -n "$HOST" -o %T 2>/dev/null | head -1 || true; }

running() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

wait_for() {  # wait_for SECONDS WHAT COMMAND...: poll COMMAND until it succeeds
  local tries=$(( $1 * 5 )) what="$2"; shift 2
  for _ in $(seq "$tries"); do "$@" >/dev/null 2>&1 && return 0; sleep 0.2; done
  die "$what did not come up (logs in $STATE)"
}

install_packages() {
  local missing=""
  for cmd in slurmctld slurmd slurmdbd sbatch munged mariadbd; do
    command -v "$cmd" >/dev/null || [ -x "/usr/sbin/$cmd" ] || missing=1
  done
  [ -z "$missing" ] && return
  command -v apt-get >/dev/null || die "$PACKAGES are not all installed and there is no apt-get"
  echo "slurm_cluster: installing $PACKAGES (Debian packages)"
  { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q $PACKAGES; } \
    > "$STATE/apt.log" 2>&1 || die "apt-get install $PACKAGES failed (see $STATE/apt.log)"
}

start_munge() {
  if munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then return; fi
  [ -s /etc/munge/munge.key ] || /usr/sbin/mungekey --create --keyfile=/etc/munge/munge.key
  chown munge:munge /etc/munge/munge.key && chmod 0400 /etc/munge/munge.key
  mkdir -p /run/munge /var/log/munge /var/lib/munge
  chown munge:munge /run/munge /var/log/munge /var/lib/munge
  chmod 0755 /run/munge
  runuser -u munge -- /usr/sbin/munged --force
  wait_for 10 munged sh -c "munge -n | unmunge"
}

sql() { mariadb --socket="$STATE/mysqld.sock" -u root -e "$1"; }

start_database() {  # a MariaDB of our own for slurmdbd (not the system's /var/lib/mysql)
  running "$STATE/mysqld.pid" && return
  if [ ! -d "$STATE/mysql/mysql" ]; then
    mariadb-install-db --user=root --datadir="$STATE/mysql" --auth-root-authentication-method=socket \
      > "$STATE/mariadb-install.log" 2>&1 || die "mariadb-install-db failed (see $STATE/mariadb-install.log)"
  fi
  /usr/sbin/mariadbd --user=root --datadir="$STATE/mysql" --socket="$STATE/mysqld.sock" \
    --pid-file="$STATE/mysqld.pid" --bind-address=127.0.0.1 --port="$DB_PORT" \
    --log-error="$STATE/mariadb.log" --innodb-buffer-pool-size=64M > /dev/null 2>&1 &
  wait_for 60 MariaDB sql "SELECT 1"
  sql "CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY 'heads-lab';
       GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1'; FLUSH PRIVILEGES;"
}

write_confs() {
  for f in "$CONF" "$DBD_CONF"; do
    if [ -f "$f" ] && ! ours "$f"; then
      die "$f exists and was not written by this script; a cluster is configured here already"
    fi
  done
  local cpus mem
  cpus="$(nproc)"
  mem=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 * 9 / 10 ))  # MB, 10 % kept back
  mkdir -p /etc/slurm "$STATE/ctld" "$STATE/d"
  cat > "$DBD_CONF" <<EOF
$MARK (removed by its \`down\`)
AuthType=auth/munge
DbdHost=localhost
DbdAddr=127.0.0.1
SlurmUser=root
PidFile=$STATE/slurmdbd.pid
LogFile=$STATE/slurmdbd.log
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$DB_PORT
StorageUser=slurm
StoragePass=heads-lab
StorageLoc=slurm_acct_db
EOF
  chmod 0600 "$DBD_CONF"
  cat > "$CONF" <<EOF
$MARK (removed by its \`down\`)
ClusterName=heads-lab
SlurmctldHost=$HOST(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation=$STATE/ctld
SlurmdSpoolDir=$STATE/d
SlurmctldPidFile=$STATE/slurmctld.pid
SlurmdPidFile=$STATE/slurmd.pid
SlurmctldLogFile=$STATE/slurmctld.log
SlurmdLogFile=$STATE/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
MpiDefault=none
MailProg=/bin/true
ReturnToService=2
SlurmctldTimeout=30
SlurmdTimeout=30
InactiveLimit=0
KillWait=10
NodeName=$HOST NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$mem State=UNKNOWN
PartitionName=debug Nodes=$HOST Default=YES MaxTime=INFINITE State=UP
EOF
}

up() {
  [ "$(id -u)" = 0 ] || die "needs root (daemons, /etc/slurm, apt-get): run it with sudo"
  mkdir -p "$STATE"
  install_packages
  case "$(node_state)" in idle|mixed|allocated)
    echo "slurm_cluster: already up (node $HOST $(node_state))"; return ;; esac
  start_munge
  write_confs
  start_database
  running "$STATE/slurmdbd.pid" || /usr/sbin/slurmdbd
  wait_for 30 slurmdbd sacctmgr -n list cluster
  running "$STATE/slurmctld.pid" || /usr/sbin/slurmctld -i
  running "$STATE/slurmd.pid" || /usr/sbin/slurmd
  local state=""
  for _ in $(seq 120); do
    state="$(node_state)"
    case "$state" in
      idle) echo "slurm_cluster: up: node $HOST idle ($(nproc) CPUs); $CONF; state and logs in $STATE"
            return ;;
      down*|drain*) scontrol update nodename="$HOST" state=resume >/dev/null 2>&1 || true ;;
    esac
    sleep 0.5
  done
  die "node $HOST not idle after 60 s (state: ${state:-no answer}); see $STATE/slurmctld.log"
}

stop_pid() {  # stop the daemon whose pid file is $1, waiting for it to exit
  [ -f "$1" ] || return 0
  local pid; pid="$(cat "$1")"
  kill "$pid" 2>/dev/null || return 0
  for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.2; done
  kill -9 "$pid" 2>/dev/null || true
}

down() {
  [ "$(id -u)" = 0 ] || die "needs root: run it with sudo"
  for f in "$CONF" "$DBD_CONF"; do
    if [ -f "$f" ] && ! ours "$f"; then die "$f was not written by this script; not touching it"; fi
  done
  if ours "$CONF"; then scancel --full --quiet --user=root 2>/dev/null || true; fi
  for daemon in slurmd slurmctld slurmdbd mysqld; do stop_pid "$STATE/$daemon.pid"; done
  stop_pid /run/munge/munged.pid
  rm -f "$CONF" "$DBD_CONF"
  rm -rf "$STATE"
  echo "slurm_cluster: down (daemons stopped; $CONF, $DBD_CONF and $STATE removed)"
}

status() {
  local state; state="$(node_state)"
  if [ -n "$state" ]; then echo "slurm_cluster: node $HOST $state"; else
    echo "slurm_cluster: not running"; exit 1; fi
}

case "${1:-}" in
  up) up ;;
  down) down ;;
  status) status ;;
  *) echo "usage: $0 up|down|status" >&2; exit 2 ;;
esac
