#!/usr/bin/env bash
# Installs what scripts/gen-chat-fixtures.py needs (Python jinja2 and tokenizers). Idempotent.
# The Rust tests do not need it: they read the committed fixtures in tests/fixtures/chat/.
set -euo pipefail
if python3 -c 'import jinja2, tokenizers' 2>/dev/null; then
    exit 0
fi
python3 -m pip install --quiet 'jinja2>=3.1' 'tokenizers>=0.21'
