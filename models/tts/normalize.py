"""Text normalisation for speech: what a display word is read as, word by word.

An answer is shown and spoken, and the caption highlights the word being heard: "42" is shown but
"forty two" is said. So the text is never rewritten wholesale: each display word (a whitespace token
once markdown and emoji are gone) maps to the tokens a synthesizer is given (:class:`NormalizedWord`).
A spoken token is ASCII letters and inner apostrophes only, so no synthesizer re-reads it its own way;
upper-case acronyms pass through; a word with nothing to say has an empty ``spoken``.

Covered: numbers (cardinal, negative, decimal, ordinal, year, percent, currency with k/m/bn), clock
times, fractions, ranges, common abbreviations, units, symbols, e-mail and web addresses, markdown
and emoji.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass


@dataclass(frozen=True)
class NormalizedWord:
    """One display word of a text and the spoken tokens it is read as (empty: not read)."""

    original: str
    spoken: tuple[str, ...]


_ONES = ("zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen "
         "sixteen seventeen eighteen nineteen").split()
_TENS = "_ _ twenty thirty forty fifty sixty seventy eighty ninety".split()
_SCALES = ((10**12, "trillion"), (10**9, "billion"), (10**6, "million"), (1000, "thousand"))
_ORDINAL_IRREGULAR = {"one": "first", "two": "second", "three": "third", "five": "fifth", "eight": "eighth",
                      "nine": "ninth", "twelve": "twelfth"}


def cardinal(n: int) -> list[str]:
    """``n`` in words (``-3`` → minus three); beyond 10**15 digit by digit."""
    if n < 0:
        return ["minus", *cardinal(-n)]
    if n >= 10**15:
        return digits(str(n))
    if n < 20:
        return [_ONES[n]]
    if n < 100:
        return [_TENS[n // 10]] + ([_ONES[n % 10]] if n % 10 else [])
    if n < 1000:
        return [_ONES[n // 100], "hundred"] + (cardinal(n % 100) if n % 100 else [])
    for scale, name in _SCALES:
        if n >= scale:
            return cardinal(n // scale) + [name] + (cardinal(n % scale) if n % scale else [])
    raise AssertionError(n)  # pragma: no cover


def ordinal(n: int) -> list[str]:
    """``n`` as an ordinal (21 → twenty first)."""
    words = cardinal(n)
    last = words[-1]
    if last in _ORDINAL_IRREGULAR:
        words[-1] = _ORDINAL_IRREGULAR[last]
    elif last.endswith("y"):
        words[-1] = last[:-1] + "ieth"
    else:
        words[-1] = last + "th"
    return words


def digits(s: str) -> list[str]:
    """Each digit on its own (0 → oh is left to the caller)."""
    return [_ONES[int(c)] for c in s if c.isdigit()]


def year(n: int) -> list[str]:
    """A year as said: 1990 → nineteen ninety, 2005 → two thousand five, 2024 → twenty twenty four."""
    hi, lo = divmod(n, 100)
    if 2000 <= n <= 2009:
        return cardinal(n)
    if lo == 0:
        return cardinal(hi) + ["hundred"]
    if lo < 10:
        return cardinal(hi) + ["oh", _ONES[lo]]
    return cardinal(hi) + cardinal(lo)


def _number(text: str) -> list[str]:
    """An unsigned or signed number with optional thousands commas and decimals."""
    neg = text.startswith("-")
    text = text.lstrip("-+").replace(",", "")
    whole, _, frac = text.partition(".")
    words = cardinal(int(whole)) if whole else ["zero"]
    if frac:
        words += ["point", *digits(frac)]
    return ["minus", *words] if neg else words


_NUM = r"\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?|\.\d+"
_CURRENCY = {"$": ("dollar", "dollars", "cent", "cents"), "€": ("euro", "euros", "cent", "cents"),
             "£": ("pound", "pounds", "penny", "pence"), "¥": ("yen", "yen", "", "")}
_MAGNITUDE = {"k": "thousand", "m": "million", "mn": "million", "b": "billion", "bn": "billion",
              "t": "trillion", "thousand": "thousand", "million": "million", "billion": "billion",
              "trillion": "trillion"}
_UNITS = {"km": "kilometers", "kg": "kilograms", "cm": "centimeters", "mm": "millimeters", "mi": "miles",
          "lb": "pounds", "lbs": "pounds", "g": "grams", "mg": "milligrams", "ml": "milliliters", "l": "liters",
          "gb": "gigabytes", "mb": "megabytes", "kb": "kilobytes", "tb": "terabytes", "ms": "milliseconds",
          "hz": "hertz", "khz": "kilohertz", "mhz": "megahertz", "ghz": "gigahertz", "mph": "miles per hour",
          "kmh": "kilometers per hour", "fps": "frames per second", "h": "hours", "hrs": "hours",
          "min": "minutes", "mins": "minutes", "sec": "seconds", "secs": "seconds", "s": "seconds",
          "x": "times", "v": "volts", "w": "watts", "kw": "kilowatts", "wpm": "words per minute"}
_ABBREVIATIONS = {
    "dr.": "doctor", "mr.": "mister", "mrs.": "missus", "ms.": "miz", "prof.": "professor", "st.": "saint",
    "jr.": "junior", "sr.": "senior", "vs.": "versus", "vs": "versus", "etc.": "et cetera",
    "e.g.": "for example", "eg.": "for example", "i.e.": "that is", "ie.": "that is", "approx.": "approximately",
    "a.m.": "A M", "p.m.": "P M", "am": None, "pm": None, "fig.": "figure", "dept.": "department",
    "est.": "established", "inc.": "incorporated", "ltd.": "limited", "co.": "company", "mt.": "mount",
    "ft.": "feet", "oz.": "ounces", "min.": "minutes", "sec.": "seconds", "hr.": "hour", "hrs.": "hours",
    "avg.": "average", "jan.": "January", "feb.": "February", "mar.": "March", "apr.": "April",
    "aug.": "August", "sept.": "September", "sep.": "September", "oct.": "October", "nov.": "November",
    "dec.": "December", "u.s.": "U S", "u.k.": "U K", "w/": "with", "w/o": "without", "&": "and",
    "+": "plus", "@": "at", "=": "equals", "%": "percent", "°": "degrees", "~": "about", "×": "times",
    "→": "to", "->": "to", "<": "less than", ">": "more than", "#": "number", "/": "or",
}
_SYMBOL_WORDS = {"&": "and", "+": "plus", "@": "at", "=": "equals", "%": "percent", "°": "degrees"}
_LEAD = "\"'([{¿¡“‘«*_`"
_TRAIL = "\"')]}.,;:!?…”’»*_`"
_SPOKEN_PUNCT = set(",.;:!?")
_WORD_CHARS = re.compile(r"[A-Za-z]+(?:'[A-Za-z]+)*")


def _ascii_letters(word: str) -> str:
    """Accents dropped (café → cafe); anything but ASCII letters and apostrophes dropped."""
    plain = unicodedata.normalize("NFKD", word).encode("ascii", "ignore").decode()
    return plain.replace("’", "'")


def _plain_words(text: str) -> list[str]:
    """Spoken tokens of a run of letters: words split at hyphens, slashes, dots and the like."""
    return _WORD_CHARS.findall(_ascii_letters(text.replace("’", "'")))


def _clock(h: str, m: str, suffix: str) -> list[str]:
    hour, minute = int(h), int(m)
    words = cardinal(hour)
    if minute == 0:
        words += [] if suffix else ["o'clock"]
    elif minute < 10:
        words += ["oh", _ONES[minute]]
    else:
        words += cardinal(minute)
    return words + (["A", "M"] if suffix.startswith("a") else ["P", "M"] if suffix.startswith("p") else [])


def _fraction(a: int, b: int) -> list[str]:
    if b == 2 and a == 1:
        return ["one", "half"]
    if b == 4:
        return cardinal(a) + (["quarter"] if a == 1 else ["quarters"])
    if 3 <= b <= 20 and 0 < a < b:
        denom = ordinal(b)
        return cardinal(a) + (denom if a == 1 else denom[:-1] + [denom[-1] + "s"])
    return cardinal(a) + ["over"] + cardinal(b)


_RE_CURRENCY = re.compile(rf"^(-)?([$€£¥])({_NUM})\s*(k|m|mn|b|bn|t|thousand|million|billion|trillion)?$", re.I)
_RE_PERCENT = re.compile(rf"^([-+]?(?:{_NUM}))%$")
_RE_CLOCK = re.compile(r"^(\d{1,2}):(\d{2})\s*(am|pm|a\.m\.?|p\.m\.?)?$", re.I)
_RE_HOUR = re.compile(r"^(\d{1,2})\s*(am|pm|a\.m\.?|p\.m\.?)$", re.I)
_RE_ORDINAL = re.compile(r"^(\d+)(st|nd|rd|th)$", re.I)
_RE_YEAR = re.compile(r"^(1[1-9]\d\d|20\d\d)s?$")
_RE_NUMBER = re.compile(rf"^[-+]?(?:{_NUM})$")
_RE_FRACTION = re.compile(r"^(\d+)/(\d+)$")
_RE_RANGE = re.compile(rf"^({_NUM})[-–]({_NUM})$")
_RE_NUM_UNIT = re.compile(rf"^({_NUM})([a-zA-Z]+)$")
_RE_EMAIL = re.compile(r"^[\w.+-]+@[\w-]+(?:\.[\w-]+)+$")
_RE_URL = re.compile(r"^(?:https?://|www\.)\S+$", re.I)
_RE_MIXED = re.compile(r"\d+(?:\.\d+)?|[A-Za-z]+(?:'[A-Za-z]+)*|[&+@=%°]")


def _read_number_token(core: str, next_core: str) -> list[str] | None:
    """The spoken words of a token that starts with a digit or currency sign, or None."""
    if m := _RE_CURRENCY.match(core):
        neg, sign, amount, mag = m.groups()
        one, many, sub_one, sub_many = _CURRENCY[sign]
        whole, _, frac = amount.replace(",", "").partition(".")
        pre = ["minus"] if neg else []
        if mag:
            return pre + _number(amount) + [_MAGNITUDE[mag.lower()], many]
        n = int(whole or "0")
        words = pre + cardinal(n) + [one if n == 1 else many]
        if frac and sub_one and int(frac[:2].ljust(2, "0")):
            cents = int(frac[:2].ljust(2, "0"))
            words += ["and", *cardinal(cents), sub_one if cents == 1 else sub_many]
        return words
    if m := _RE_PERCENT.match(core):
        return _number(m.group(1)) + ["percent"]
    if m := _RE_CLOCK.match(core):
        if int(m.group(1)) <= 24 and int(m.group(2)) < 60:
            return _clock(m.group(1), m.group(2), (m.group(3) or "").lower())
    if m := _RE_HOUR.match(core):
        return _clock(m.group(1), "0", m.group(2).lower())
    if m := _RE_ORDINAL.match(core):
        return ordinal(int(m.group(1)))
    if m := _RE_YEAR.match(core):
        words = year(int(m.group(1)))
        if core.endswith("s"):  # the 1990s
            words[-1] = words[-1][:-1] + "ies" if words[-1].endswith("y") else words[-1] + "s"
        return words
    if _RE_NUMBER.match(core):
        return _number(core)
    if m := _RE_FRACTION.match(core):
        return _fraction(int(m.group(1)), int(m.group(2)))
    if m := _RE_RANGE.match(core):
        return _number(m.group(1)) + ["to"] + _number(m.group(2))
    if m := _RE_NUM_UNIT.match(core):
        unit = m.group(2).lower()
        if unit in _UNITS:
            return _number(m.group(1)) + _UNITS[unit].split()
        if unit in ("am", "pm"):
            return _clock(m.group(1), "0", unit)
    return None


def _read_core(core: str, next_core: str) -> list[str]:
    """Spoken tokens of one display word with its outer punctuation removed."""
    if not core:
        return []
    low = core.lower()
    if low in _ABBREVIATIONS and _ABBREVIATIONS[low] is not None:
        return _ABBREVIATIONS[low].split()
    if _RE_EMAIL.match(core):
        user, _, domain = core.partition("@")
        return _plain_words(user) + ["at"] + _dotted(domain)
    if _RE_URL.match(core):
        host = re.sub(r"^(?:https?://)?(?:www\.)?", "", core, flags=re.I).split("/")[0]
        return _dotted(host)
    if core[0].isdigit() or core[0] in "$€£¥-+." and len(core) > 1:
        words = _read_number_token(core, next_core)
        if words is not None:
            return words
    if core.startswith("#") and core[1:].isdigit():
        return ["number", *cardinal(int(core[1:]))]
    out: list[str] = []
    for piece in _RE_MIXED.findall(_ascii_letters(core)):
        if piece[0].isdigit():
            out += _number(piece) if len(piece) < 16 else digits(piece)
        elif piece in _SYMBOL_WORDS:
            out.append(_SYMBOL_WORDS[piece])
        else:
            out.append(piece)
    return out


def _dotted(host: str) -> list[str]:
    out: list[str] = []
    for i, part in enumerate(host.split(".")):
        if i:
            out.append("dot")
        out += _plain_words(part) or []
    return out


# --- markdown and emoji ---------------------------------------------------------------------------

_MD_RULES: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"```[^\n]*"), " "),  # code fences (the language tag too)
    (re.compile(r"!\[([^\]]*)\]\([^)]*\)"), r"\1"),  # images → alt text
    (re.compile(r"\[([^\]]+)\]\([^)]*\)"), r"\1"),  # links → link text
    (re.compile(r"^\s{0,3}#{1,6}\s+", re.M), ""),  # headers
    (re.compile(r"^\s{0,3}>\s?", re.M), ""),  # block quotes
    (re.compile(r"^\s*(?:[-*+•]|\d{1,3}[.)])\s+", re.M), ""),  # list bullets and numbers
    (re.compile(r"^\s*(?:[-*_]\s*){3,}$", re.M), " "),  # rules
    (re.compile(r"^\s*\|?(?:\s*:?-{3,}:?\s*\|)+\s*:?-*:?\s*$", re.M), " "),  # table separator rows
    (re.compile(r"\|"), " "),  # table cells
    (re.compile(r"(\*{1,3}|_{2,3}|~~|`+)"), ""),  # emphasis, strike-through, code marks
    (re.compile(r"(?<!\w)_(\S(?:.*?\S)?)_(?!\w)"), r"\1"),  # _emphasis_ (snake_case is kept)
    (re.compile(r"<[^>\s][^>]*>"), " "),  # html tags
)


def strip_markdown(text: str) -> str:
    """``text`` without markdown syntax, emoji and control characters (the words themselves kept)."""
    for pattern, repl in _MD_RULES:
        text = pattern.sub(repl, text)
    out = []
    for ch in text:
        cat = unicodedata.category(ch)
        if ch in _SYMBOL_WORDS:
            out.append(ch)
        elif ch in "\u200d\ufe0f\ufe0e" or cat in ("So", "Cs", "Co", "Cn") or (cat == "Sk" and ord(ch) > 0x2000):
            out.append(" " if cat == "So" else "")
        elif cat.startswith("C") and ch not in "\n\t":
            out.append(" ")
        else:
            out.append(ch)
    return "".join(out)


def _split_outer(token: str) -> tuple[str, str, str]:
    """(leading punctuation, core, trailing punctuation); an abbreviation keeps its full stop."""
    i, j = 0, len(token)
    while i < j and token[i] in _LEAD:
        i += 1
    while j > i and token[j - 1] in _TRAIL:
        j -= 1
    core, trail = token[i:j], token[j:]
    # "e.g." / "Dr." / "a.m.": the stop belongs to the word when the word is a known abbreviation.
    if trail.startswith(".") and (core + ".").lower() in _ABBREVIATIONS:
        core, trail = core + ".", trail[1:]
    elif trail.startswith(".") and re.fullmatch(r"(?:[A-Za-z]\.)+[A-Za-z]", core):  # U.S.A. → U S A
        core, trail = core + ".", trail[1:]
    return token[:i], core, trail


def normalize_text(text: str) -> tuple[NormalizedWord, ...]:
    """Every display word of ``text`` (markdown and emoji removed, punctuation kept) with its spoken
    tokens. The last spoken token of a word carries the word's trailing sentence punctuation
    (``,.;:!?``), so a synthesizer phrases it; no other token has punctuation."""
    if not isinstance(text, str):
        raise TypeError(f"normalize_text wants str, got {type(text).__name__}")
    tokens = strip_markdown(text).split()
    cores = [_split_outer(t)[1] for t in tokens]
    out: list[NormalizedWord] = []
    for k, token in enumerate(tokens):
        _lead, core, trail = _split_outer(token)
        nxt = cores[k + 1] if k + 1 < len(cores) else ""
        # "5 km", "10 am": a unit word right after a number is read as the unit.
        low = core.lower()
        prev_numeric = bool(out) and bool(cores[k - 1]) and cores[k - 1][-1:].isdigit()
        if prev_numeric and low in _UNITS and low not in ("x", "s", "h", "l", "g", "v", "w", "min"):
            spoken = _UNITS[low].split()
        elif prev_numeric and low in ("am", "pm", "a.m.", "p.m."):
            spoken = ["A", "M"] if low.startswith("a") else ["P", "M"]
        elif low == "no" and trail.startswith(".") and nxt[:1].isdigit():  # "No. 5" (else the word "no.")
            spoken, trail = ["number"], trail[1:]
        else:
            spoken = _read_core(core, nxt)
        spoken = [s for s in spoken if s]
        punct = "".join(ch for ch in trail.replace("…", ".") if ch in _SPOKEN_PUNCT)[:1]
        if not punct and k == len(tokens) - 1 and core.endswith("."):  # "... etc." ends the sentence
            punct = "."
        if spoken and punct:
            spoken[-1] = spoken[-1] + punct
        out.append(NormalizedWord(token, tuple(spoken)))
    return tuple(out)


def spoken_text(words: tuple[NormalizedWord, ...]) -> str:
    """The text a synthesizer is given: every spoken token, single spaces."""
    return " ".join(s for w in words for s in w.spoken)


def bare(token: str) -> str:
    """A spoken token without its punctuation (what an aligner or a WER count compares)."""
    return token.rstrip(",.;:!?")
