#!/usr/bin/env bash
# LlamaIndex's OpenAIEmbedding for tests/e2e/test_embeddings_llamaindex.py, in its own cached
# virtualenv outside the clone (~300 MB: numpy, nltk, SQLAlchemy come with llama-index-core), so
# the project's test extras stay small. Idempotent: a stamp names the pinned release (~1 min once).
set -euo pipefail
VERSION=0.7.0
VENV=${GATEWAY_LLAMAINDEX_VENV:-$HOME/.cache/gateway-llamaindex-venv}
STAMP="$VENV/.llama-index-embeddings-openai-$VERSION"
[ -f "$STAMP" ] && exit 0
rm -rf "$VENV"
python3 -m venv "$VENV"
"$VENV/bin/pip" install -q "llama-index-embeddings-openai==$VERSION" 2>&1 | grep -v "is ignored" || true
"$VENV/bin/python" -c "import llama_index.embeddings.openai"
touch "$STAMP"
echo "LlamaIndex $VERSION ready in $VENV"
