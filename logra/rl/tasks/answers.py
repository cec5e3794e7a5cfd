"""Reading a final answer out of text, never raising on arbitrary text: numbers (`extract_number`),
countdown's expressions (`evaluate_expression`, exact with `fractions.Fraction`), MATH's boxed
answers (`last_boxed`, `normalize_math`) and printable ASCII (`to_ascii`)."""
from __future__ import annotations

import re
import unicodedata
from fractions import Fraction


# A number: optional sign (not a binary minus as in "7-3"), optional "$",
# digits with optional thousands commas, optional decimal part. ASCII digits
# only, so unicode digits in model output are ignored.
_NUMBER = r"(?:(?<![0-9A-Za-z_)])-)?\$?(?:[0-9]{1,3}(?:,[0-9]{3})+(?![0-9])|[0-9]+)(?:\.[0-9]+)?"


_NUMBER_RE = re.compile(_NUMBER)


FINAL_RE = re.compile(r"####\s*(" + _NUMBER + ")")


_ANSWER_IS_RE = re.compile(r"answer\s*(?:is|:)[\s:]*(" + _NUMBER + ")", re.IGNORECASE)


def canonical(number: str) -> str:
    """Exact canonical decimal form of a matched number: "$1,234.50" -> "1234.5".

    Pure string manipulation (no floats, no digit limits), so two numbers are
    numerically equal exactly when their canonical strings are equal.
    """
    text = number.replace("$", "").replace(",", "")
    negative = text.startswith("-")
    whole, _, frac = text.lstrip("-").partition(".")
    whole = whole.lstrip("0") or "0"
    frac = frac.rstrip("0")
    sign = "-" if negative and (whole != "0" or frac) else ""
    return sign + whole + ("." + frac if frac else "")


def extract_number(text: str) -> str | None:
    """Return the final numeric answer in `text` in canonical form, or None.

    Preference order: the number after the first `####` (GSM8K style), then
    the number right after the last "answer is" / "answer:", otherwise the
    last number in the text. "$", thousands commas, a trailing period and
    trailing decimal zeros are dropped, so "18.0" -> "18" and "1,234.50" ->
    "1234.5"; equal canonical strings mean exactly equal numbers.
    """
    final = FINAL_RE.search(text)
    if final:
        return canonical(final.group(1))
    answers = _ANSWER_IS_RE.findall(text)
    if answers:
        return canonical(answers[-1])
    numbers = _NUMBER_RE.findall(text)
    return canonical(numbers[-1]) if numbers else None


def first_line(text: str) -> str:
    """The first non-blank line of `text`, without surrounding whitespace."""
    return text.lstrip().partition("\n")[0].strip()


def numeric_reward(text: str, gold: str) -> float:
    """1.0 if the number extracted from `text` equals the gold number."""
    got = extract_number(text)
    return float(got is not None and got == extract_number(gold))


MAX_EXPRESSION_CHARS = 64


_EXPRESSION_CHARS_RE = re.compile(r"[0-9+\-*/() ]*")


class _ParseError(Exception):
    pass


class _ExpressionParser:
    """Recursive descent over tokens: expr := term (('+'|'-') term)*,
    term := factor (('*'|'/') factor)*, factor := integer | '(' expr ')'."""

    def __init__(self, tokens: list[str]):
        self.tokens = tokens
        self.pos = 0
        self.numbers: list[int] = []

    def _peek(self) -> str | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def _take(self) -> str | None:
        token = self._peek()
        self.pos += 1
        return token

    def expr(self) -> Fraction:
        value = self.term()
        while self._peek() in ("+", "-"):
            op, rhs = self._take(), self.term()
            value = value + rhs if op == "+" else value - rhs
        return value

    def term(self) -> Fraction:
        value = self.factor()
        while self._peek() in ("*", "/"):
            op, rhs = self._take(), self.factor()
            if op == "*":
                value *= rhs
            elif rhs == 0:
                raise _ParseError("division by zero")
            else:
                value /= rhs
        return value

    def factor(self) -> Fraction:
        token = self._take()
        if token == "(":
            value = self.expr()
            if self._take() != ")":
                raise _ParseError("missing ')'")
            return value
        if token is not None and token[0] in "0123456789":
            self.numbers.append(int(token))
            return Fraction(int(token))
        raise _ParseError(f"unexpected token {token!r}")


def evaluate_expression(text: str) -> tuple[Fraction, list[int]] | None:
    """Safely evaluate an integer expression with `+ - * /` and parentheses.

    Returns `(exact value, integers used in order of appearance)`, or None
    if `text` is longer than MAX_EXPRESSION_CHARS, contains anything else
    (no unary minus, no names, no calls), is malformed, or divides by zero.
    """
    if len(text) > MAX_EXPRESSION_CHARS or not _EXPRESSION_CHARS_RE.fullmatch(text):
        return None
    parser = _ExpressionParser(re.findall(r"[0-9]+|\S", text))
    try:
        value = parser.expr()
    except _ParseError:
        return None
    if parser.pos != len(parser.tokens):
        return None
    return value, parser.numbers


_ASCII_REPLACEMENTS = str.maketrans(
    {
        "\u2018": "'", "\u2019": "'", "\u201c": '"', "\u201d": '"',
        "\u2013": "-", "\u2014": "-", "\u2212": "-", "\u00d7": "*", "\u00f7": "/",
        "\u2044": "/", "\u00a0": " ", "\t": " ", "\u2028": "\n", "\u200b": "",
        "\u20ac": "EUR", "\u00a3": "GBP", "\u00a2": "c", "\u221a": "sqrt",
    }
)


CALCULATOR_RE = re.compile(r"<<[^<>]*>>")


def to_ascii(text: str) -> str:
    """Printable-ASCII (plus newline) version of `text`: typographic
    punctuation mapped, accents stripped (NFKD), anything else dropped."""
    text = unicodedata.normalize("NFKD", text).translate(_ASCII_REPLACEMENTS)
    return "".join(ch for ch in text if ch == "\n" or " " <= ch <= "~")


def last_boxed(text: str) -> str | None:
    """The content of the last `\\boxed{...}` (or `\\fbox{...}`) in `text`, braces
    balanced, or None."""
    start = max(text.rfind("\\boxed{"), text.rfind("\\fbox{"))
    if start < 0:
        return None
    i = text.index("{", start)
    depth = 0
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i + 1:j]
    return None


_LATEX_NOISE = [r"\\left", r"\\right", r"\\!", r"\\,", r"\\;", r"\\ ", r"\\?\$",
                r"\^\{?\\circ\}?", r"\\?%", r"\{,\}"]


def normalize_math(answer: str) -> str:
    """A MATH answer in a canonical string form: spacing, `\\left`/`\\right`, `$`,
    degrees, percent, units (`\\text{ cm}`) and `\\text{...}` wrappers dropped,
    `\\dfrac`/`\\tfrac` as `\\frac`, `\\frac12` as `\\frac{1}{2}`, `\\sqrt2`
    as `\\sqrt{2}`, a trailing period removed, and plain numbers in canonical decimal form
    ("0.50" -> "0.5", "1{,}000" -> "1000")."""
    text = answer.strip()
    text = re.sub(r"\\(?:text|mbox)\{\s.*?\}", "", text)  # units: "5\text{ cm}"
    text = re.sub(r"\\(?:text|mbox|mathrm|textbf)\{(.*?)\}", r"\1", text)
    for noise in _LATEX_NOISE:
        text = re.sub(noise, "", text)
    text = re.sub(r"\\[dt]frac", r"\\frac", text)
    text = re.sub(r"\\frac(\d)(\d)", r"\\frac{\1}{\2}", text)
    text = re.sub(r"\\sqrt(\w)", r"\\sqrt{\1}", text)
    text = re.sub(r"\s+", "", text).rstrip(".")
    if re.fullmatch(_NUMBER, text):
        text = canonical(text)
    return text
