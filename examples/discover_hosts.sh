#!/bin/sh
# Host discovery for elastic hvdrun: prints one host:slots line per available host.
# Reads HVD_HOSTS_FILE (default /tmp/hvd_hosts), so a running job can be grown or
# shrunk by rewriting that file; without it, offers 2 slots on this machine.
cat "${HVD_HOSTS_FILE:-/tmp/hvd_hosts}" 2>/dev/null || echo "localhost:2"
