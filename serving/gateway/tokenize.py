"""Prompt token ids for routing: locally with the served model's tokenizer, or through an engine's ``/tokenize``.

The router needs the token ids the engine will see, because the engine hashes
those into its prefix-cache blocks (:mod:`kvcost.routing.block_hash`). vLLM
(``vllm/entrypoints``; 0.32) builds them so:

* **completions** — a string prompt is encoded with the tokenizer, special tokens
  added unless the request says ``"add_special_tokens": false`` (vLLM's default
  ``true``); a prompt of token ids is taken as is;
* **chat** — the messages are rendered with the model's chat template to text
  (``add_generation_prompt`` default ``true``, ``continue_final_message``,
  ``tools``, ``documents`` and ``chat_template_kwargs`` passed to the template;
  a message whose content is a list of text parts is joined with ``"\\n"``,
  vLLM's "string" content format) and the text encoded *without* special tokens
  (the template writes them; vLLM's chat default ``add_special_tokens`` is
  ``false``).

:class:`LocalTokenizer` does the same with ``transformers``' fast tokenizer of
the model folder (``--tokenizer``); :class:`EngineTokenizer` asks an engine's
``POST /tokenize`` (one more round trip per request; used when no tokenizer is
given). Both raise :class:`TokenizeError` with a message for the client.
Multimodal content and prompt embeddings are refused by the local tokenizer
(their placeholder tokens depend on the engine's processor); the engine's
``/tokenize`` handles what the engine handles.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Protocol

import aiohttp

from kvcost.serving.gateway.engine_http import post


class TokenizeError(ValueError):
    """A prompt that cannot be tokenized; ``status`` is the HTTP status to answer with (400: the client's fault)."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


class PromptTokenizer(Protocol):
    """Token ids of an OpenAI request body, as the engine computes them."""

    #: ``local`` or ``engine`` (the metrics label of :data:`kvcost_gateway_tokenize_seconds`).
    source: str

    async def completion_ids(self, body: dict[str, Any]) -> list[int]:
        """Token ids of a ``/v1/completions`` body's ``prompt``."""
        ...

    async def chat_ids(self, body: dict[str, Any]) -> list[int]:
        """Token ids of a ``/v1/chat/completions`` body's ``messages`` rendered by the chat template."""
        ...


def single_prompt(body: dict[str, Any]) -> str | list[int]:
    """The one prompt of a completions body: a string or a list of token ids.

    Raises:
        TokenizeError: ``prompt`` is missing, a batch (a list of prompts), or not a string / list of ints.
    """
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and prompt and all(type(t) is int and t >= 0 for t in prompt):
        return prompt
    if isinstance(prompt, list) and len(prompt) == 1:
        return single_prompt({"prompt": prompt[0]})
    if isinstance(prompt, list) and prompt and all(isinstance(p, str | list) for p in prompt):
        raise TokenizeError(f"prompt is a batch of {len(prompt)} prompts; the gateway routes one prompt per request")
    raise TokenizeError(f"prompt = {str(prompt)[:80]!r}, expected a string or a list of token ids")


def _message_text(message: Any, index: int) -> dict[str, Any]:
    """``message`` with list-of-text-parts content joined by ``"\\n"`` (vLLM's "string" content format)."""
    if not isinstance(message, dict):
        raise TokenizeError(f"messages[{index}] = {str(message)[:80]!r}, expected an object")
    content = message.get("content")
    if isinstance(content, list):
        texts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise TokenizeError(
                    f"messages[{index}].content has a {kind!r} part; the local tokenizer handles text parts only "
                    "(start kvcost without --tokenizer to tokenize through the engine)"
                )
            texts.append(part["text"])
        return {**message, "content": "\n".join(texts)}
    return message


class LocalTokenizer:
    """Tokenizes with the served model's Hugging Face tokenizer (``transformers``' fast tokenizer).

    Args:
        path: the tokenizer's folder (``tokenizer.json``, ``tokenizer_config.json`` with the chat template).

    Raises:
        ValueError: the folder holds no loadable tokenizer (the message names it).
    """

    source = "local"

    def __init__(self, path: Path) -> None:
        from transformers import AutoTokenizer  # heavy import; only the gateway needs it

        try:
            self._tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
        except (OSError, ValueError) as exc:
            raise ValueError(f"tokenizer = {str(path)!r}: no Hugging Face tokenizer loads from it ({exc})") from None
        self.path = path

    async def completion_ids(self, body: dict[str, Any]) -> list[int]:
        """See :class:`PromptTokenizer`; special tokens added unless ``add_special_tokens`` is false."""
        prompt = single_prompt(body)
        if isinstance(prompt, list):
            return prompt
        return self._encode(prompt, bool(body.get("add_special_tokens", True)))

    async def chat_ids(self, body: dict[str, Any]) -> list[int]:
        """See :class:`PromptTokenizer`; rendered to text, then encoded without special tokens by default."""
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise TokenizeError(f"messages = {str(messages)[:80]!r}, expected a non-empty list of messages")
        kwargs = dict(body.get("chat_template_kwargs") or {})
        for name in ("tools", "documents"):
            if body.get(name) is not None:
                kwargs[name] = body[name]
        try:
            text = self._tokenizer.apply_chat_template(
                [_message_text(m, i) for i, m in enumerate(messages)],
                tokenize=False,
                add_generation_prompt=bool(body.get("add_generation_prompt", True)),
                continue_final_message=bool(body.get("continue_final_message", False)),
                **kwargs,
            )
        except TokenizeError:
            raise
        except Exception as exc:  # a template error: the engine would refuse the request too
            raise TokenizeError(f"the chat template cannot render these messages: {exc}") from None
        return self._encode(text, bool(body.get("add_special_tokens", False)))

    def _encode(self, text: str, add_special_tokens: bool) -> list[int]:
        return self._tokenizer(text, add_special_tokens=add_special_tokens)["input_ids"]


class EngineTokenizer:
    """Tokenizes through an engine's ``POST /tokenize`` (vLLM's; the same tokenizer and chat template it serves).

    Args:
        client: the gateway's HTTP client; fresh_client: the same without a pool, for a request sent again
            on a new connection (:func:`~kvcost.serving.gateway.engine_http.post`).
        base_url: the engine to ask (``http://HOST:PORT``).
    """

    source = "engine"

    def __init__(self, client: aiohttp.ClientSession, fresh_client: aiohttp.ClientSession, base_url: str) -> None:
        self._clients = (client, fresh_client)
        self.base_url = base_url

    async def completion_ids(self, body: dict[str, Any]) -> list[int]:
        """See :class:`PromptTokenizer`."""
        prompt = single_prompt(body)
        if isinstance(prompt, list):
            return prompt
        return await self._tokenize(
            {"prompt": prompt, "add_special_tokens": bool(body.get("add_special_tokens", True))}, body
        )

    async def chat_ids(self, body: dict[str, Any]) -> list[int]:
        """See :class:`PromptTokenizer`."""
        keys = ("messages", "add_generation_prompt", "continue_final_message", "add_special_tokens", "tools",
                "chat_template_kwargs", "documents")  # fmt: skip
        return await self._tokenize({k: body[k] for k in keys if k in body}, body)

    async def _tokenize(self, payload: dict[str, Any], body: dict[str, Any]) -> list[int]:
        if "model" in body:
            payload["model"] = body["model"]
        data, headers = json.dumps(payload).encode(), {"content-type": "application/json"}
        try:
            response = await post(*self._clients, f"{self.base_url}/tokenize", data, headers)
            async with response:
                status, text = response.status, await response.text(errors="replace")
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise TokenizeError(f"tokenizing through {self.base_url}/tokenize failed: {exc!r}", status=502) from None
        if status >= 400:
            raise TokenizeError(
                f"{self.base_url}/tokenize answered {status}: {text[:200]}", status=400 if status < 500 else 502
            )
        try:
            tokens = json.loads(text).get("tokens")
        except (ValueError, AttributeError):
            tokens = None
        if not isinstance(tokens, list):
            raise TokenizeError(f"{self.base_url}/tokenize answered without a tokens list", status=502)
        return tokens
