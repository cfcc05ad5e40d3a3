#!/usr/bin/env bash
# server_structured: constrained output (response_format, grammar, json_schema,
# guided_choice, ...) against a random model, every answer validated by python3-jsonschema
# (tests/server/structured.py).
# usage: serve_structured.sh TRELLIS DATA_DIR
set -euo pipefail
TRELLIS=$1 DATA=$2
source "$(dirname "$0")/lib.sh"

say "structured output validates against its schema on every seed and temperature"
start_server structured --ctx-size 2048
python3 "$(dirname "$0")/structured.py" "$base" || die "structured.py failed (server log: $tmp/structured.log)"
stop_server
ok "server_structured"
