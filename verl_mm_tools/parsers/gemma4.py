"""Gemma 4's tool-call arguments, read as Gemma 4's chat template writes them (its ``format_argument``): strings in
``<|"|>``, ``[...]`` lists, ``{key:value,...}`` objects (keys bare or quoted), bare true/false/null and numbers,
nested; other bare text is a string, as in verl. verl's own ``Gemma4ToolParser`` reads a bare value up to the next
``,`` or ``}`` and so breaks every list or object argument: ``adaptations/fixes/gemma4_arguments.py`` puts this
reader into it. Pure Python: no verl, no torch."""

from __future__ import annotations

from collections.abc import Callable

GEMMA4_QUOTE = '<|"|>'
_GEMMA4_CONSTANTS = {"true": True, "false": False, "null": None}


def parse_gemma4_arguments(text: str) -> dict:
    """A Gemma 4 call's arguments (the ``key:value,...`` between ``call:NAME{`` and ``}<tool_call|>``) as a dict,
    read as Gemma 4's chat template writes them (``format_argument``): strings in ``<|"|>``, ``[...]`` lists,
    ``{key:value,...}`` objects (keys bare or quoted), bare true/false/null and numbers; other bare text is a string,
    as in verl. Raises ``ValueError`` saying what is wrong, where, in which text."""
    pairs, _ = read_gemma4_items(text, 0, "", read_gemma4_pair, "")
    return dict(pairs)


def read_gemma4_items(text: str, position: int, closer: str, read_item: Callable, opened: str) -> tuple[list, int]:
    """Comma-separated items from ``position`` up to ``closer`` (``""``: the end of the text); returns them and the
    position after the closer. ``opened`` names the bracket that ``closer`` closes, for the error."""
    items: list = []
    position = _skip_space(text, position)
    if _at_closer(text, position, closer):
        return items, position + len(closer)
    while True:
        item, position = read_item(text, position)
        items.append(item)
        position = _skip_space(text, position)
        if _at_closer(text, position, closer):
            return items, position + len(closer)
        if position == len(text):
            raise _syntax_error(f"{opened} is never closed (no {closer!r} before the end)", text)
        if text[position] != ",":
            expected = f"',' or {closer!r}" if closer else "',' or the end"
            raise _syntax_error(f"expected {expected} at {_character(position)}, found {text[position]!r}", text)
        position = _skip_space(text, position + 1)


def read_gemma4_pair(text: str, position: int) -> tuple[tuple[str, object], int]:
    """``key:value`` at ``position`` (the key bare, or in ``<|"|>`` as the template writes escaped keys)."""
    if text.startswith(GEMMA4_QUOTE, position):
        key, position = read_gemma4_string(text, position)
    else:
        end = position
        while end < len(text) and text[end] not in ":,{}[]":
            end += 1
        key = text[position:end].strip()
        if not key:
            raise _syntax_error(f"expected a key at {_character(position)}, found {_found(text, position)}", text)
        position = end
    position = _skip_space(text, position)
    if not text.startswith(":", position):
        raise _syntax_error(
            f"expected ':' after the key {key!r} at {_character(position)}, found {_found(text, position)}", text
        )
    value, position = read_gemma4_value(text, _skip_space(text, position + 1))
    return (key, value), position


def read_gemma4_value(text: str, position: int) -> tuple[object, int]:
    """The value at ``position``."""
    if text.startswith(GEMMA4_QUOTE, position):
        return read_gemma4_string(text, position)
    if text.startswith("[", position):
        opened = f"the list opened at {_character(position)}"
        return read_gemma4_items(text, position + 1, "]", read_gemma4_value, opened)
    if text.startswith("{", position):
        opened = f"the object opened at {_character(position)}"
        pairs, position = read_gemma4_items(text, position + 1, "}", read_gemma4_pair, opened)
        return dict(pairs), position
    return read_gemma4_bare(text, position)


def read_gemma4_string(text: str, position: int) -> tuple[str, int]:
    start = position + len(GEMMA4_QUOTE)
    end = text.find(GEMMA4_QUOTE, start)
    if end < 0:
        raise _syntax_error(f"the string opened at {_character(position)} is never closed (no {GEMMA4_QUOTE!r})", text)
    return text[start:end], end + len(GEMMA4_QUOTE)


def read_gemma4_bare(text: str, position: int) -> tuple[object, int]:
    """An unquoted value: up to the next ``,`` or closing bracket (verl's ends at ``,`` or ``}``)."""
    end = position
    while end < len(text) and text[end] not in ",]}":
        end += 1
    word = text[position:end].strip()
    if not word:
        raise _syntax_error(f"expected a value at {_character(position)}, found {_found(text, position)}", text)
    return gemma4_scalar(word), end


def gemma4_scalar(word: str) -> bool | int | float | str | None:
    """verl's reading of a bare value: true/false/null (any case), an int, a float, else the text itself."""
    if word.lower() in _GEMMA4_CONSTANTS:
        return _GEMMA4_CONSTANTS[word.lower()]
    for number in (int, float):
        try:
            return number(word)
        except ValueError:
            pass
    return word


def _skip_space(text: str, position: int) -> int:
    while position < len(text) and text[position].isspace():
        position += 1
    return position


def _at_closer(text: str, position: int, closer: str) -> bool:
    return text.startswith(closer, position) if closer else position == len(text)


def _found(text: str, position: int) -> str:
    return repr(text[position]) if position < len(text) else "the end"


def _character(position: int) -> str:
    return f"character {position + 1}"  # counted from 1, as a reader counts


def _syntax_error(problem: str, text: str) -> ValueError:
    return ValueError(
        f"cannot read the Gemma 4 tool call arguments {text!r}: {problem}. Expected key:value pairs as Gemma 4's chat "
        'template writes them (strings in <|"|>, lists in [], objects in {}); verl logs and skips this call'
    )
