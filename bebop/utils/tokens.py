"""Prompts and completions as token ids, the same way in every command.

Generation feeds the model ``encode_prompt(prompt)`` and then the tokens it samples; training and
evaluation data must be the same token sequence, so a prompt/completion pair becomes
``encode_prompt(prompt) + encode_completion(completion)``, not ``encode(prompt + completion)`` and
not two ``encode`` calls that each add BOS (a second BOS mid-row with Llama, Gemma or Mistral
tokenizers).

A prompt is a string or a list of chat messages (``{"role", "content"}`` dicts). A string is encoded
by the tokenizer as is (BOS added when the tokenizer adds one); messages go through the tokenizer's
chat template with the generation prompt appended, tokenized by the template itself (whose BOS, if
any, is the only one).
"""

from __future__ import annotations

from bebop.utils.errors import BebopError


def check_text(text: str, what: str = "prompt") -> str:
    """``text`` when it can be encoded: BebopError when it holds a lone surrogate (a JSON escape such as
    ``"\\ud800"`` decodes to one), which is not text and which tokenizers refuse with a TypeError.

    Example: check_text("a \\ud800 b") raises "prompt holds a lone surrogate U+D800 at character 3, which is
    not text".
    """
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise BebopError(f"{what} holds a lone surrogate U+{ord(text[e.start]):04X} at character {e.start + 1}, "
                         "which is not text") from None
    return text


def encode_prompt(tokenizer, prompt) -> list[int]:
    """Token ids of ``prompt`` (a string or chat messages) as every command feeds it to the model.

    Example: with a Llama-style tokenizer (BOS = 1), encode_prompt(tok, "a b") -> [1, 4, 5].
    """
    if isinstance(prompt, str):
        return list(tokenizer.encode(check_text(prompt)))
    if isinstance(prompt, list) and all(isinstance(m, dict) for m in prompt):
        if getattr(tokenizer, "chat_template", None) is None:
            raise BebopError("a chat prompt (a list of messages) needs a tokenizer with a chat template")
        for message in prompt:
            if isinstance(message.get("content"), str):
                check_text(message["content"], "a chat message")
        try:
            ids = tokenizer.apply_chat_template(prompt, tokenize=True, add_generation_prompt=True, return_dict=False)
        except Exception as e:  # noqa: BLE001 - a template refuses messages with any exception (jinja2's, KeyError...)
            reason = (str(e) or type(e).__name__).splitlines()[0]
            raise BebopError(f"the model's chat template refuses these messages: {reason}") from None
        return list(ids)
    raise BebopError(f"a prompt must be a string or a list of chat messages, got {type(prompt).__name__}")


def encode_completion(tokenizer, completion: str, add_eos: bool = True) -> list[int]:
    """Token ids of a completion that follows a prompt: no BOS, and EOS at the end when ``add_eos``
    (a training example ends where the policy would stop), unless the text already ends with it.

    Example: with EOS = 2, encode_completion(tok, "c d") -> [6, 7, 2].
    """
    if not isinstance(completion, str):
        raise BebopError(f"a completion must be a string, got {type(completion).__name__}")
    ids = list(tokenizer.encode(check_text(completion, "a completion"), add_special_tokens=False))
    eos = tokenizer.eos_token_id
    if add_eos and eos is not None and (not ids or ids[-1] != eos):
        ids.append(eos)
    return ids
