"""Language identification, the one home for every component that asks which language a text is in.

Two identifiers:

- `py3langid`: a statistical classifier over 97 languages (ISO 639-1 codes), for whole replies
  (the `language_match` reward's default, MiLMMT's gate).
- `script`: deterministic, by Unicode script. A language code maps to its script (`LANGUAGE_SCRIPTS`:
  en, fr, de… → latin; ru, uk… → cyrillic; zh, ja → cjk; ar → arabic …), and a text is in the target
  language when every letter it holds is of that script. It is a stand-in for a real language
  identifier: it tells English from Russian or Chinese but not English from French. It decides
  token by token (`token_scripts`), which a statistical classifier cannot do on single tokens, so it
  is what the token-level error positions of TLPO read (`data.token_pairs`).

A letter of any other script makes a text wrong-language (a homoglyph such as Cyrillic "с" inside an
English word counts against it); a text without letters (digits, punctuation, spaces) is neutral.
"""
from __future__ import annotations

import unicodedata
from collections.abc import Sequence
from functools import lru_cache

NEUTRAL = ""  # the script of a text without letters

# Unicode name prefixes of each script's letters (unicodedata names letters "LATIN SMALL LETTER A", …)
SCRIPT_PREFIXES = {
    "latin": ("LATIN",), "cyrillic": ("CYRILLIC",), "greek": ("GREEK",), "arabic": ("ARABIC",),
    "hebrew": ("HEBREW",), "devanagari": ("DEVANAGARI",), "thai": ("THAI",), "hangul": ("HANGUL",),
    "cjk": ("CJK", "HIRAGANA", "KATAKANA", "IDEOGRAPHIC"),
}
LANGUAGE_SCRIPTS = {
    **{code: "latin" for code in ("en", "fr", "de", "es", "it", "pt", "nl", "pl", "cs", "sv", "da", "no", "fi",
                                  "tr", "vi", "id", "ro", "hu")},
    **{code: "cyrillic" for code in ("ru", "uk", "bg", "sr", "be", "kk", "mk")},
    "el": "greek", "ar": "arabic", "fa": "arabic", "ur": "arabic", "he": "hebrew", "hi": "devanagari",
    "mr": "devanagari", "th": "thai", "ko": "hangul", "zh": "cjk", "ja": "cjk",
}


@lru_cache(maxsize=4096)
def char_script(char: str) -> str:
    """The script of one character (`SCRIPT_PREFIXES` key), NEUTRAL for a non-letter, "other" for a letter of
    a script not listed."""
    if not char.isalpha():
        return NEUTRAL
    name = unicodedata.name(char, "")
    for script, prefixes in SCRIPT_PREFIXES.items():
        if name.startswith(prefixes):
            return script
    return "other"


def text_scripts(text: str) -> frozenset[str]:
    """The scripts of the letters of `text` (empty: no letters)."""
    return frozenset(s for s in map(char_script, text) if s != NEUTRAL)


def target_script(lang: str) -> str:
    """The script of a language code (`LANGUAGE_SCRIPTS`) or a script name itself; a ValueError names both lists."""
    if lang in SCRIPT_PREFIXES:
        return lang
    if lang not in LANGUAGE_SCRIPTS:
        raise ValueError(f"the script identifier knows no language {lang!r}: use one of "
                         f"{sorted(LANGUAGE_SCRIPTS)} or a script name, one of {sorted(SCRIPT_PREFIXES)}")
    return LANGUAGE_SCRIPTS[lang]


def in_script(text: str, script: str) -> bool | None:
    """True when every letter of `text` is of `script`, False when some is not, None when it has no letter."""
    scripts = text_scripts(text)
    return None if not scripts else scripts == {script}


@lru_cache(maxsize=8)
def _classifier(languages: tuple[str, ...]):
    from py3langid.langid import MODEL_FILE, LanguageIdentifier

    ident = LanguageIdentifier.from_model_file(MODEL_FILE)
    if languages:
        ident.set_languages(list(languages))
    return ident


def detect_language(text: str, languages: Sequence[str] = ()) -> str:
    """ISO 639-1 code of `text` (py3langid), optionally restricted to `languages`."""
    return _classifier(tuple(languages)).classify(text)[0]


def is_language(text: str, lang: str, identifier: str = "py3langid", languages: Sequence[str] = ()) -> bool:
    """Whether `text` (non-empty) is in language `lang` by `identifier` ("py3langid" or "script")."""
    if identifier == "script":
        return bool(in_script(text, target_script(lang)))
    if identifier != "py3langid":
        raise ValueError(f"unknown language identifier {identifier!r}: use 'py3langid' or 'script'")
    return bool(text) and detect_language(text, languages) == lang


def decoded_pieces(token_ids: Sequence[int], tokenizer) -> list[tuple[int, int, str]]:
    """(first token, end token, text) of each run of tokens that decodes to whole characters, in order: one token
    each, except a character split over several byte-level tokens (a CJK character is two or three), decoded whole."""
    out: list[tuple[int, int, str]] = []
    start = 0
    for end in range(1, len(token_ids) + 1):
        piece = tokenizer.decode(list(token_ids[start:end]))
        if piece.endswith("\ufffd") and end < len(token_ids) and end - start < 4:
            continue  # an unfinished multi-byte character: decode it with the next token
        out.append((start, end, piece.replace("\ufffd", "")))
        start = end
    return out


def token_scripts(token_ids: Sequence[int], tokenizer) -> list[frozenset[str]]:
    """The scripts of each token's letters; the tokens of one split character share its scripts."""
    return [text_scripts(text) for start, end, text in decoded_pieces(token_ids, tokenizer) for _ in range(end - start)]
