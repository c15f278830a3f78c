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

# docker-compose.yml cannot be run here (no Docker engine); at least parse it
# and check that it names every server the harness knows.
python3 scripts/check-compose.py

cargo fmt --all -- --check
cargo clippy --workspace --all-targets --all-features --locked -- -D warnings
# The facade with its default features alone (the embedded SQLite default)
# must be warning-free too.
cargo clippy -p distlock -p distlock-sql --all-targets --locked -- -D warnings
cargo test --workspace --all-features --locked

# A few-second smoke of every benchmark scenario, so the harness keeps
# working (debug build, tiny sizes; no thresholds: these machines are too
# noisy for timed assertions). The peers need Python packages from PyPI and
# run only in the real benchmark (docs/benchmarks.md).
cargo run -q -p distlock-bench --locked -- --smoke
# One side of scenario 3 alone, as a profile runs it.
cargo run -q -p distlock-bench --locked -- --smoke --only 3 --backends postgres \
  --throughput 8x8x1 --profile-side requests
