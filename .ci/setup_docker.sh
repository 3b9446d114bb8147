#!/usr/bin/env bash
# Installs Debian's docker.io if missing, starts dockerd if none answers, builds the base image.
# (Filled in by the sandbox work; a no-op placeholder until then.)
set -euo pipefail
exit 0
