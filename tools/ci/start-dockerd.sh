#!/usr/bin/env bash
# Start dockerd in the background if no engine answers; wait until it does.
set -euo pipefail
if docker info >/dev/null 2>&1; then echo "dockerd already running"; exit 0; fi
mkdir -p /var/log
nohup dockerd >/var/log/dockerd.log 2>&1 &
for _ in $(seq 1 60); do
    if docker info >/dev/null 2>&1; then echo "dockerd up"; exit 0; fi
    sleep 1
done
echo "dockerd did not start; last log lines:" >&2
tail -n 30 /var/log/dockerd.log >&2
exit 1
