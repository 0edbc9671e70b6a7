#!/usr/bin/env bash
# Installs Debian's mariadb-server (for the MySQL source's tests and benchmark) if missing.
# Idempotent; the server is not started here (tests start private instances).
set -euo pipefail
if command -v mariadbd >/dev/null 2>&1 || [ -x /usr/sbin/mariadbd ]; then
  exit 0
fi
SUDO=""
if [ "$(id -u)" != "0" ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends mariadb-server >/dev/null
# Debian's post-install may start a system instance; the tests do not use it.
$SUDO service mariadb stop >/dev/null 2>&1 || true
command -v mariadbd >/dev/null 2>&1 || [ -x /usr/sbin/mariadbd ]
