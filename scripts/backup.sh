#!/usr/bin/env bash
# A consistent backup of a running `ahc serve`'s experience database, without stopping it:
#
#   scripts/backup.sh DATA_DIR [PID]
#
# Sends SIGUSR1 to the server (PID, else the one `pgrep` finds serving DATA_DIR, else the only
# `ahc serve`), waits until DATA_DIR/backups/<UTC time>/ is complete, and prints its path. The server
# copies both DuckDB files itself, from one snapshot each, while it goes on generating and recording;
# the copy is a data directory `ahc serve --data-dir` takes as it is, and `ahc xdb verify-audit
# --data-dir COPY` checks it. In Docker: `docker compose -f deploy/compose.yml kill -s SIGUSR1 ahc`
# and look in the ahc-data volume's backups/.
set -euo pipefail

data_dir=${1:?usage: scripts/backup.sh DATA_DIR [PID]}
pid=${2:-}
if [[ ! -d $data_dir ]]; then
    echo "error: $data_dir is not a directory" >&2
    exit 1
fi
if [[ -z $pid ]]; then
    pid=$(pgrep -f "ahc serve.*--data-dir[ =]$data_dir" || pgrep -f "ahc serve" || true)
fi
if [[ -z $pid || $(wc -w <<<"$pid") -ne 1 ]]; then
    echo "error: found ${pid:-no} ahc serve process(es) for $data_dir; give the PID" >&2
    exit 1
fi

backups() {  # the complete backups (a partial one has a dot name), oldest first
    [[ -d $data_dir/backups ]] || return 0
    find "$data_dir/backups" -mindepth 1 -maxdepth 1 -type d ! -name '.*' -printf '%f\n' | sort
}

before=$(backups)
kill -USR1 "$pid"
for _ in $(seq 600); do
    after=$(backups)
    new=$(comm -13 <(echo "$before") <(echo "$after") | tail -n 1)
    if [[ -n $new ]]; then
        echo "$data_dir/backups/$new"
        exit 0
    fi
    if ! kill -0 "$pid" 2>/dev/null; then
        echo "error: ahc serve (pid $pid) exited before the backup was written" >&2
        exit 1
    fi
    sleep 0.5
done
echo "error: no backup after 300 s; see the server's log (ahc.backup)" >&2
exit 1
