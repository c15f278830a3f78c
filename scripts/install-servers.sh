#!/usr/bin/env bash
# Installs the servers and tools the test suite starts, from Debian/Ubuntu
# packages. Does nothing when everything is already there, so reruns are fast.
set -euo pipefail

missing=()
have() { command -v "$1" >/dev/null 2>&1; }
have redis-server     || missing+=(redis-server)
have redis-sentinel   || missing+=(redis-sentinel)
have redis-cli        || missing+=(redis-tools)
have openssl          || missing+=(openssl)
have etcd             || missing+=(etcd-server)
have etcdctl          || missing+=(etcd-client)
[ -f /usr/share/java/zookeeper.jar ] || missing+=(zookeeper)
have java             || missing+=(default-jre-headless)
# The Curator interop tests compile a small InterProcessMutex program
# (integration-tests/java) against Debian's Curator jars.
have javac            || missing+=(default-jdk-headless)
[ -f /usr/share/java/curator-recipes.jar ] || missing+=(libcurator-recipes-java)
[ -f /usr/share/java/curator-framework.jar ] || missing+=(libcurator-framework-java)
[ -f /usr/share/java/curator-client.jar ] || missing+=(libcurator-client-java)
have mariadbd         || missing+=(mariadb-server)
have mariadb          || missing+=(mariadb-client)
ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1 || missing+=(postgresql)
have psql             || missing+=(postgresql-client)
have protoc           || missing+=(protobuf-compiler)
# etcd-client's build script also needs protobuf's well-known .proto files.
[ -f /usr/include/google/protobuf/descriptor.proto ] || missing+=(libprotobuf-dev)
have sqlite3          || missing+=(sqlite3)
have faketime         || missing+=(faketime libfaketime)
ls /usr/lib/*/faketime/libfaketime.so.1 >/dev/null 2>&1 || missing+=(libfaketime)
# The clock-jump fault compiles a tiny malloc shim for redis-server (see
# integration-tests/src/harness/redis.rs).
have gcc              || missing+=(gcc libc6-dev)
have setpriv          || missing+=(util-linux)
# scripts/check-compose.py parses docker-compose.yml.
python3 -c 'import yaml' 2>/dev/null || missing+=(python3-yaml)

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-servers: every server is installed"
  exit 0
fi

echo "install-servers: missing packages: ${missing[*]}"
if [ "$(id -u)" != 0 ] || ! have apt-get; then
  echo "install-servers: cannot install them here (needs root and apt-get)." >&2
  echo "Install them with your package manager, or point the tests at running servers with" >&2
  echo "DISTLOCK_TEST_{REDIS,ETCD,ZOOKEEPER,POSTGRES,MYSQL}_URL (see integration-tests/src/harness/mod.rs)." >&2
  exit 1
fi

export DEBIAN_FRONTEND=noninteractive
# Keep the packages from starting their own system services while installing:
# the tests start private instances on free ports.
if [ ! -e /usr/sbin/policy-rc.d ]; then
  printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
  chmod 755 /usr/sbin/policy-rc.d
  trap 'rm -f /usr/sbin/policy-rc.d' EXIT
fi
apt-get update -q
apt-get install -y -q --no-install-recommends "${missing[@]}"
