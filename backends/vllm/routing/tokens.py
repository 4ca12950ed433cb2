"""The token ids a vLLM server will see for a request's prompt, as far as the gateway can know them.

Loaded from the model the servers serve (``routing.tokenizer``, else the pool's ``model`` or the
model a remote server names as its root): a directory holding ``tokenizer.json``, or that file,
read with the ``tokenizers`` library (an optional dependency: ``pip install
completions-gateway[kv-events]``). Nothing is downloaded.

- completions, a text prompt: ``encode(text)`` with the tokenizer's special tokens (vLLM's
  completions default, ``add_special_tokens: true``); a token-id prompt: those ids;
- chat (and anything else): not known without the server's chat template, so None: such requests
  are scored by the approximate prefix.

Long prompts: only the first ``max_chars`` characters are encoded and the last block's worth of
tokens is dropped, since a cut through a word can change the tokens at the cut.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from schemas.completions import CompletionRequest

__all__ = ["PromptTokenizer", "load_tokenizer"]


class PromptTokenizer:
    """A loaded tokenizer. ``encode`` is thread-safe (``tokenizers`` releases no shared state)."""

    def __init__(self, tokenizer: Any, source: str) -> None:
        self._tok = tokenizer
        self.source = source

    def prompt_ids(self, request: object, max_chars: int, drop: int) -> Sequence[int] | None:
        """The leading token ids of a completions request's (first) prompt; None for other requests."""
        if not isinstance(request, CompletionRequest):
            return None
        prompt = request.prompt
        first: object = prompt if isinstance(prompt, str) else prompt[0] if prompt else ""
        if isinstance(first, int):
            return prompt  # type: ignore[return-value]  # a list of token ids
        if isinstance(first, list):
            return first
        if not isinstance(first, str):
            return None
        if len(first) <= max_chars:
            ids: list[int] = self._tok.encode(first).ids
            return ids
        cut: list[int] = self._tok.encode(first[:max_chars]).ids
        return cut[: max(0, len(cut) - drop)]


def load_tokenizer(source: str) -> PromptTokenizer | str:
    """The tokenizer at ``source`` (a directory with ``tokenizer.json``, or the file), or why not."""
    try:
        from tokenizers import Tokenizer
    except ImportError:
        return "the tokenizers library is not installed (pip install 'completions-gateway[kv-events]')"
    path = Path(source)
    file = path / "tokenizer.json" if path.is_dir() else path
    if not file.is_file():
        return f"no tokenizer.json at {source}"
    try:
        return PromptTokenizer(Tokenizer.from_file(str(file)), str(file))
    except Exception as exc:  # a corrupt or foreign file: routing goes on, approximately
        return f"cannot load {file}: {exc}"
