#!/usr/bin/env bash
# Runs every test in the workspace against real servers.
#
# Installs missing servers from the system packages when it can (Debian or
# Ubuntu, as root), checks formatting and lints, then runs all tests. The
# suite starts its own private server processes on free loopback ports and
# stops them at the end; nothing is left running.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/install-servers.sh

cargo fmt --all -- --check
cargo clippy --workspace --all-targets --all-features --locked -- -D warnings
cargo test --workspace --all-features --locked
